"""The asyncio watch: a snapshot, then every change in commit order,
resumed by itself across restarts, failovers and broken connections (see
:mod:`baton.watch`)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import grpc

from baton import _wire, errors
from baton._proto import baton_pb2 as pb
from baton._types import Change, Holder, Resnapshot
from baton._wire import RESUME_FOR_S, change_of, holder_of, map_error, mended_by_resuming
from baton.aio._grpc import EOF
from baton.errors import WatchEnded, WatchTooOld

if TYPE_CHECKING:
    from baton.aio.client import Client


class Watch:
    """An open watch: :attr:`holders` at :attr:`seq`, then ``async for``
    each :class:`Change` (or a :class:`Resnapshot`); see the sync twin."""

    def __init__(self, client: Client, prefix: str, once: bool) -> None:
        self._client = client
        self._prefix = prefix
        self._once = once
        self._closed = False
        self._call: Any = None
        self.seq = 0
        self.holders: list[Holder] = []
        self.last_seq = 0
        self._pending: list[Change] = []

    @classmethod
    async def start(
        cls, client: Client, prefix: str, after_seq: int | None = None, once: bool = False
    ) -> Watch:
        w = cls(client, prefix, once)
        if after_seq is None:
            w.seq, w.holders = await w._open(None)
        else:
            await w._open(after_seq)
            w.seq = after_seq
        w.last_seq = w.seq
        return w

    async def _open(self, after_seq: int | None) -> tuple[int, list[Holder]]:
        """Starts the stream on the member that leads (after ``after_seq``,
        or from a snapshot, read before this returns)."""
        client = self._client
        deadline = time.monotonic() + client.timeout_s
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        request = pb.WatchRequest(prefix=self._prefix, after_seq=after_seq)
        while True:
            address = await client._ready_server(unreachable, own=True)
            call = client._stub(address, own=True).Watch(request, metadata=client._metadata)
            try:
                snapshot = await _begin(call, after_seq is not None)
            except grpc.RpcError as e:
                tried.append(address)
                if _wire.passed_over(client._servers, e, address, unreachable, True, deadline):
                    continue
                pause = client._servers.next_try(e, address, deadline, tried)
                if pause is None:
                    raise ended(e, address, client.timeout_s) from None
                await asyncio.sleep(pause)
                continue
            self._call = call
            self._address = address
            return snapshot

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Change | Resnapshot:
        while True:
            if self._pending:
                change = self._pending.pop(0)
                self.last_seq = change.seq
                return change
            try:
                message = await self._call.read()
            except grpc.RpcError as e:
                failure = ended(e, self._address, self._client.timeout_s)
            else:
                if message is not EOF:
                    self._pending.extend(
                        change_of(ev) for ev in message.events.events if ev.seq > self.last_seq
                    )
                    continue
                failure = WatchEnded("the server ended the stream without a status")
            if self._closed:
                raise StopAsyncIteration
            if self._once or not mended_by_resuming(failure):
                raise failure
            resnapshot = await self._resume()
            if resnapshot is not None:
                return resnapshot

    async def _resume(self) -> Resnapshot | None:
        """See :meth:`baton.watch.Watch._resume`."""
        started = time.monotonic()
        pause = 0.05
        while True:
            try:
                await self._open(self.last_seq)
                return None
            except WatchTooOld:
                try:
                    seq, holders = await self._open(None)
                except errors.BatonError as e:
                    if not mended_by_resuming(e):
                        raise
                    failure: errors.BatonError = e
                else:
                    self.last_seq = seq
                    return Resnapshot(seq, tuple(holders))
            except errors.BatonError as e:
                if not mended_by_resuming(e):
                    raise
                failure = e
            if time.monotonic() - started >= RESUME_FOR_S:
                raise failure
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()


async def _begin(call: Any, resumed: bool) -> tuple[int, list[Holder]]:
    """A new stream's start: nothing for a resumed one (a refusal ends it
    before any message), else the whole snapshot."""
    if resumed:
        await call.initial_metadata()
        if call.done():
            await call.read()
            raise errors.WatchEnded("the server ended the watch at once")
        return 0, []
    holders: list[Holder] = []
    while True:
        message = await call.read()
        if message is EOF or message.WhichOneof("body") != "snapshot":
            raise errors.Indeterminate(f"a watch must start with its snapshot: {message}")
        s = message.snapshot
        holders.extend(holder_of(h) for h in s.holders)
        if s.complete:
            return s.seq, holders


def ended(e: grpc.RpcError, address: str, timeout_s: float) -> errors.BatonError:
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return WatchEnded(f"{e.details()}")
    return map_error(e, address, timeout_s)
