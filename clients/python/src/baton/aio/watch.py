"""The asyncio watch: a snapshot, then every change in commit order."""

from __future__ import annotations

from typing import Any

import grpc

from baton import errors
from baton._types import Change, Holder
from baton._wire import change_of, holder_of, map_error
from baton.aio._grpc import EOF
from baton.errors import WatchEnded


class Watch:
    """An open watch: :attr:`holders` at :attr:`seq`, then ``async for``."""

    def __init__(self, call: Any, seq: int, holders: list[Holder]) -> None:
        self._call = call
        self.seq = seq
        self.holders = holders
        self._pending: list[Change] = []

    @classmethod
    async def start(cls, call: Any) -> Watch:
        holders: list[Holder] = []
        while True:
            message = await call.read()
            if message is EOF or message.WhichOneof("body") != "snapshot":
                raise errors.Indeterminate(f"a watch must start with its snapshot: {message}")
            s = message.snapshot
            holders.extend(holder_of(h) for h in s.holders)
            if s.complete:
                return cls(call, s.seq, holders)

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Change:
        while not self._pending:
            try:
                message = await self._call.read()
            except grpc.RpcError as e:
                raise ended(e, "the server", 0) from None
            if message is EOF:
                raise StopAsyncIteration
            self._pending.extend(change_of(ev) for ev in message.events.events)
        return self._pending.pop(0)

    def close(self) -> None:
        self._call.cancel()


def ended(e: grpc.RpcError, address: str, timeout_s: float) -> errors.BatonError:
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return WatchEnded(f"{e.details()}: watch again, from a new snapshot")
    return map_error(e, address, timeout_s)
