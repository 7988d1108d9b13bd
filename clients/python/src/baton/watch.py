"""Watching holder changes under a prefix, and fenced leader elections
built on it.

A watch starts from a snapshot of the holders at a sequence number, then
yields every later change in commit order, with no gap. It ends with
:class:`WatchEnded` when the server restarts or stops leading: watch
again, from a new snapshot. A watcher that reads too slowly is cut off
(:class:`errors.Exhausted`), never buffered without bound.

An election is one lease: candidates wait in line for its name on a
session whose holder description is their value; the leader is the
holder, with a fencing token above every earlier leader's.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from baton import _wire, errors
from baton._proto import baton_pb2 as pb
from baton._types import Change, Holder, Leader
from baton._wire import change_of, holder_of
from baton.errors import WatchEnded
from baton.keeper import SessionKeeper
from baton.rules import check_holder, check_resource

if TYPE_CHECKING:
    from baton.client import Client

__all__ = ["Change", "Election", "Holder", "Leader", "Watch", "WatchEnded"]


class Watch:
    """An open watch: :attr:`holders` at :attr:`seq`, then iterate for
    each :class:`Change`. Close it (or leave the ``with`` block) to stop."""

    def __init__(self, client: Client, prefix: str) -> None:
        self._call: Any = None
        deadline = time.monotonic() + client.timeout_s
        unreachable: list[tuple[str, str]] = []
        while True:
            address = client._ready_server(unreachable, own=True)
            # A channel of its own: a slow watcher must not hold up leases.
            stub = client._stub(address, own=True)
            call = stub.Watch(pb.WatchRequest(prefix=prefix), metadata=tuple(client._metadata))
            try:
                first = next(iter(call))
            except grpc.RpcError as e:
                if _wire.passed_over(client._servers, e, address, unreachable, True, deadline):
                    continue
                if client._follow(e, address, deadline):
                    continue
                raise _ended(e, client, address) from None
            self._call = call
            break
        self._client = client
        self.holders: list[Holder] = []
        snapshot = first
        while True:
            if snapshot.WhichOneof("body") != "snapshot":
                raise errors.Indeterminate(f"a watch must start with its snapshot: {snapshot}")
            s = snapshot.snapshot
            self.seq: int = s.seq
            self.holders.extend(holder_of(h) for h in s.holders)
            if s.complete:
                break
            try:
                snapshot = next(iter(call))
            except grpc.RpcError as e:
                raise _ended(e, client, address) from None
        self._address = address
        self._pending: queue.SimpleQueue[Change] = queue.SimpleQueue()

    def __iter__(self) -> Iterator[Change]:
        return self

    def __next__(self) -> Change:
        if not self._pending.empty():
            return self._pending.get()
        try:
            message = next(iter(self._call))
        except grpc.RpcError as e:
            raise _ended(e, self._client, self._address) from None
        if message.WhichOneof("body") != "events":
            raise errors.Indeterminate(f"unexpected message on a watch: {message}")
        for ev in message.events.events:
            self._pending.put(change_of(ev))
        return self._pending.get()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call.cancel()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ended(e: grpc.RpcError, client: Client, address: str) -> errors.BatonError:
    code = e.code()
    if code == grpc.StatusCode.CANCELLED:
        return WatchEnded("the watch was closed")
    if code == grpc.StatusCode.UNAVAILABLE:
        return WatchEnded(f"{e.details()}: watch again, from a new snapshot")
    return client._error(e, address)


class Election:
    """One election: a resource name whose holder is the leader."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = check_resource(name)

    def campaign(
        self, value: str, ttl_s: float | None = None, wait_s: float = 60
    ) -> SessionKeeper | None:
        """Waits in line, first come first served, on a new session whose
        holder description is ``value``, until this candidate leads
        (a :class:`baton.keeper.SessionKeeper` of the leadership: its
        ``token``, ``check()``, ``lost``; leaving its ``with`` block, or
        closing its session, resigns) or ``wait_s`` runs out (None)."""
        session = self._client.with_holder(check_holder(value)).open_session(ttl_s)
        try:
            lease = session.acquire(self.name, wait_s)
        except errors.NotAcquired:
            session.close()
            return None
        except BaseException:
            with contextlib.suppress(errors.BatonError):
                session.close()
            raise
        return SessionKeeper(session, lease)

    def leader(self) -> Leader | None:
        """The current leader, if any."""
        st = self._client.status(self.name)
        if st.holder_token is None:
            return None
        return Leader(st.holder_token, st.holder)

    def observe(self) -> Iterator[tuple[Change | None, Leader | None]]:
        """The leader now (``(None, leader)``), then each change of leader
        as ``(change, leader)``: a grant or hand-off names the new leader,
        a release, expiry or fence leaves none. Ends with
        :class:`WatchEnded` at a restart or failover: observe again."""
        with Watch(self._client, self.name) as w:
            now = next((h for h in w.holders if h.resource == self.name), None)
            yield None, (Leader(now.token, now.holder) if now else None)
            for change in w:
                if change.resource != self.name:
                    continue
                if change.kind in ("granted", "handed_off"):
                    yield change, Leader(change.token, change.holder)
                else:
                    yield change, None
