"""Watching holder changes under a prefix, and fenced leader elections
built on it.

A watch starts from a snapshot of the holders at a sequence number, then
yields every later change in commit order, with no gap. Numbers are one
order for the whole cluster and keep rising across restarts, leaders and
restores. When its stream ends (a restart, a new leader, a broken
connection, or falling too far behind) the watch resumes by itself after
the last number it yielded, following the leader, for up to
:data:`RESUME_FOR_S` without an answer; when the server no longer keeps
the changes since then, it takes a new snapshot and yields a
:class:`Resnapshot` first. ``once=True`` turns that off: the stream's end
is then :class:`WatchEnded` (or :class:`errors.Exhausted` for a watcher
cut off for reading too slowly).

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
from baton._types import Change, Holder, Leader, Resnapshot, leader_in
from baton._wire import RESUME_FOR_S, change_of, holder_of, mended_by_resuming
from baton.errors import WatchEnded, WatchTooOld
from baton.keeper import SessionKeeper
from baton.rules import check_holder, check_resource

if TYPE_CHECKING:
    from baton.client import Client

__all__ = [
    "RESUME_FOR_S",
    "Change",
    "Election",
    "Holder",
    "Leader",
    "Resnapshot",
    "Watch",
    "WatchEnded",
    "WatchTooOld",
]


class Watch:
    """An open watch: :attr:`holders` at :attr:`seq`, then iterate for
    each :class:`Change` (or a :class:`Resnapshot` after a resumption the
    server no longer had the changes for). Close it (or leave the ``with``
    block) to stop.

    ``after_seq``: resume after that number (from an earlier watch)
    instead of starting from a snapshot: :attr:`holders` is then empty;
    a number older than the server keeps is :class:`WatchTooOld`, one
    above its last change :class:`errors.InvalidArgument`."""

    def __init__(
        self, client: Client, prefix: str, after_seq: int | None = None, once: bool = False
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._once = once
        self._closed = False
        self._pending: queue.SimpleQueue[Change] = queue.SimpleQueue()
        self.holders: list[Holder] = []
        if after_seq is None:
            self.seq, self.holders = self._open(None)
        else:
            self._open(after_seq)
            self.seq = after_seq
        #: The last number yielded (or the snapshot's): a watch started
        #: again with ``after_seq=last_seq`` misses nothing.
        self.last_seq: int = self.seq

    def _open(self, after_seq: int | None) -> tuple[int, list[Holder]]:
        """Starts the stream on the member that leads (after ``after_seq``,
        or from a snapshot, read before this returns)."""
        client = self._client
        deadline = time.monotonic() + client.timeout_s
        unreachable: list[tuple[str, str]] = []
        request = pb.WatchRequest(prefix=self._prefix, after_seq=after_seq)
        while True:
            address = client._ready_server(unreachable, own=True)
            # A channel of its own: a slow watcher must not hold up leases.
            stub = client._stub(address, own=True)
            call: Any = stub.Watch(request, metadata=tuple(client._metadata))
            try:
                if after_seq is not None:
                    # A refusal ends the call before any message.
                    call.initial_metadata()
                    if call.done():
                        next(iter(call))
                    first = None
                else:
                    first = next(iter(call))
            except grpc.RpcError as e:
                if _wire.passed_over(client._servers, e, address, unreachable, True, deadline):
                    continue
                if client._follow(e, address, deadline):
                    continue
                raise _ended(e, client, address) from None
            self._call: Any = call
            self._address = address
            break
        if first is None:
            return after_seq or 0, []
        holders: list[Holder] = []
        snapshot = first
        while True:
            if snapshot.WhichOneof("body") != "snapshot":
                raise errors.Indeterminate(f"a watch must start with its snapshot: {snapshot}")
            s = snapshot.snapshot
            holders.extend(holder_of(h) for h in s.holders)
            if s.complete:
                return s.seq, holders
            try:
                snapshot = next(iter(call))
            except grpc.RpcError as e:
                raise _ended(e, client, address) from None

    def __iter__(self) -> Iterator[Change | Resnapshot]:
        return self

    def __next__(self) -> Change | Resnapshot:
        while True:
            if not self._pending.empty():
                change = self._pending.get()
                self.last_seq = change.seq
                return change
            try:
                message = next(iter(self._call))
            except grpc.RpcError as e:
                failure = _ended(e, self._client, self._address)
            except StopIteration:
                failure = WatchEnded("the server ended the stream without a status")
            else:
                if message.WhichOneof("body") != "events":
                    raise errors.Indeterminate(f"unexpected message on a watch: {message}")
                for ev in message.events.events:
                    if ev.seq > self.last_seq:
                        self._pending.put(change_of(ev))
                continue
            if self._once or self._closed or not mended_by_resuming(failure):
                raise failure
            resnapshot = self._resume(failure)
            if resnapshot is not None:
                return resnapshot

    def _resume(self, failure: errors.BatonError) -> Resnapshot | None:
        """Opens the stream again after :attr:`last_seq`, retrying for up
        to :data:`RESUME_FOR_S`; a new snapshot if the server no longer
        keeps the changes since then."""
        started = time.monotonic()
        pause = 0.05
        while True:
            try:
                self._open(self.last_seq)
                return None
            except WatchTooOld:
                try:
                    seq, holders = self._open(None)
                except errors.BatonError as e:
                    if not mended_by_resuming(e):
                        raise
                    failure = e
                else:
                    self.last_seq = seq
                    return Resnapshot(seq, tuple(holders))
            except errors.BatonError as e:
                if not mended_by_resuming(e):
                    raise
                failure = e
            if time.monotonic() - started >= RESUME_FOR_S:
                raise failure
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def close(self) -> None:
        self._closed = True
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
        return WatchEnded(f"{e.details()}")
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

    def observe(self, once: bool = False) -> Iterator[tuple[Change | None, Leader | None]]:
        """The leader now (``(None, leader)``), then each change of leader
        as ``(change, leader)``: a grant or hand-off names the new leader,
        a release, expiry or fence leaves none. Resumes by itself across a
        restart or a failover (see :class:`Watch`); after a new snapshot it
        yields ``(None, leader)`` again if the leader there is another.
        With ``once``, a restart or failover ends it with
        :class:`WatchEnded`."""
        with Watch(self._client, self.name, once=once) as w:
            leader = leader_in(self.name, w.holders)
            yield None, leader
            for change in w:
                if isinstance(change, Resnapshot):
                    now = leader_in(self.name, change.holders)
                    if now != leader:
                        leader = now
                        yield None, leader
                    continue
                if change.resource != self.name:
                    continue
                if change.kind in ("granted", "handed_off"):
                    leader = Leader(change.token, change.holder)
                else:
                    leader = None
                yield change, leader
