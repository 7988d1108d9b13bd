"""The asyncio twin of :mod:`baton.client`, on ``grpc.aio``: the same
names, the same rules (leader following, nothing that may have taken
effect is repeated, the keeper's safe-until from the last acknowledged
send time), awaited.

    from baton import aio

    async def main() -> None:
        async with aio.Client("127.0.0.1:7700") as client:
            async with client.lease("statement:42", ttl_s=30) as kept:
                kept.check()
                await publish(..., token=kept.token)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Callable

import grpc
import grpc.aio

from baton import _dial, _wire, errors, keeper
from baton._proto import baton_pb2 as pb
from baton._proto import baton_pb2_grpc as pb_grpc
from baton._wire import Fenced, Lease, Status, granted, map_error
from baton.keeper import Kept, margin_s
from baton.rules import (
    check_holder,
    check_lease_args,
    check_prefix,
    check_resource,
    check_session_ttl,
    millis,
)
from baton.session import ENDED, Ledger, SessionEnded, _request_error
from baton.watch import Change, Holder, Leader, WatchEnded, change_of, holder_of

#: What ``read()`` returns at the end of a stream (not in grpc's stubs).
_EOF: Any = getattr(grpc.aio, "EOF")  # noqa: B009

__all__ = [
    "Client",
    "Election",
    "Fenced",
    "Keeper",
    "Leader",
    "Lease",
    "Session",
    "SessionEnded",
    "SessionKeeper",
    "Status",
    "Watch",
]


class Client(_wire.Settings):
    """See :class:`baton.Client`; every call is a coroutine. Use it from
    one event loop."""

    def _setup(self) -> None:
        self._sessions: dict[float | None, Session] = {}
        self._channels: dict[tuple[str, bool], grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, bool], Any] = {}

    def _stub(self, address: str, own: bool = False) -> Any:
        """A stub on a ``grpc.aio`` channel (its calls are awaitable; the
        generated stubs type the synchronous ones, hence ``Any``)."""
        stub = self._stubs.get((address, own))
        if stub is None:
            options = _wire.channel_options(self.dial_timeout_s)
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(address, self._credentials, options)
            else:
                channel = grpc.aio.insecure_channel(address, options)
            self._channels[(address, own)] = channel
            stub = pb_grpc.LeasesStub(channel)
            self._stubs[(address, own)] = stub
        return stub

    async def _ready_server(self, unreachable: list[tuple[str, str]], own: bool = False) -> str:
        """See :meth:`baton.Client._ready_server`: every member not yet
        found unreachable dialed at once, the first to answer current."""
        while True:
            address = self._servers.current_if_answered()
            if address is not None:
                return address
            candidates = self._servers.candidates(unreachable)
            if not candidates:
                raise _wire.none_reachable(unreachable)
            checks = [_dial.tcp_check_async(a, self.dial_timeout_s) for a in candidates]
            alive = []
            for a, why in zip(candidates, await asyncio.gather(*checks)):
                if why is None:
                    alive.append(a)
                else:
                    self._servers.pass_over(a)
                    unreachable.append((a, why))
            winner = await self._first_ready(alive, own) if alive else None
            if winner is not None:
                self._servers.answered(winner)
                return winner
            for a in alive:
                self._servers.pass_over(a)
                unreachable.append((a, _dial.no_answer(self.dial_timeout_s)))

    async def _first_ready(self, addresses: list[str], own: bool) -> str | None:
        """The first of ``addresses`` whose channel is READY within the
        dial timeout."""
        tasks: dict[asyncio.Future[None], str] = {}
        for a in addresses:
            self._stub(a, own)
            tasks[asyncio.ensure_future(self._channels[(a, own)].channel_ready())] = a
        done, pending = await asyncio.wait(
            tasks, timeout=self.dial_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        ready = [tasks[t] for t in done if not t.cancelled() and t.exception() is None]
        return ready[0] if ready else None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes this client's sessions (releasing their leases) and every
        connection."""
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            with contextlib.suppress(errors.BatonError):
                await session.close()
        channels, self._channels = self._channels, {}
        self._stubs = {}
        for channel in channels.values():
            await channel.close(None)

    async def _call(
        self,
        method: str,
        request: Any,
        extra_s: float = 0.0,
        timeout_s: float | None = None,
        read: bool | Callable[[], None] = False,
    ) -> Any:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s + (extra_s if callable(read) else 0.0)
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        lost: errors.BatonError | None = None
        while True:
            try:
                address = await self._ready_server(unreachable)
            except errors.BatonError as e:
                raise _wire.after_lost(lost, e) from None
            rpc: Callable[..., Any] = getattr(self._stub(address), method)
            try:
                return await rpc(request, timeout=timeout_s + extra_s, metadata=self._metadata)
            except grpc.RpcError as e:
                tried.append(address)
                if callable(read) and lost is None and _wire.lost_answer(e):
                    lost = map_error(e, address, timeout_s + extra_s)
                if _wire.passed_over(self._servers, e, address, unreachable, read, deadline):
                    continue
                pause = self._servers.next_try(e, address, deadline, tried)
                if pause is None:
                    error = map_error(e, address, timeout_s + extra_s)
                    raise _wire.after_lost(lost, error) from None
                await asyncio.sleep(pause)

    async def acquire(self, resource: str, ttl_s: float | None = None, wait_s: float = 0) -> Lease:
        return (await self.acquire_all([resource], ttl_s, wait_s))[0]

    async def acquire_all(
        self, resources: Sequence[str], ttl_s: float | None = None, wait_s: float = 0
    ) -> list[Lease]:
        request, n = _wire.acquire_request(resources, ttl_s, wait_s, self.holder)
        # A lease answered to a repeat counts from the first send too.
        sent = time.monotonic()
        repeat = _wire.repeater(request, sent)
        leases = granted(await self._call("Acquire", request, extra_s=wait_s, read=repeat), sent, n)
        late = _wire.expired_on_arrival(leases)
        if late is not None:
            for lease in leases:
                with contextlib.suppress(errors.BatonError):
                    await self.release(lease)
            raise late
        return leases

    async def renew(self, lease: Lease, timeout_s: float | None = None) -> Lease:
        sent = time.monotonic()
        r = await self._call("Renew", _wire.renew_request(lease), timeout_s=timeout_s)
        return _wire.renewed(lease, r, sent)

    async def release(self, lease: Lease) -> bool:
        return bool((await self._call("Release", _wire.release_request(lease))).released)

    async def status(self, resource: str) -> Status:
        request = pb.StatusRequest(resource=check_resource(resource, existing=True))
        return _wire.status(await self._call("Status", request, read=True))

    async def list(self, prefix: str = "", start_after: str = "", limit: int = 100) -> list[Status]:
        request = _wire.list_request(prefix, start_after, limit)
        return [_wire.status(e) for e in (await self._call("List", request, read=True)).entries]

    async def list_all(self, prefix: str = "", page: int = 1000) -> AsyncIterator[Status]:
        after = ""
        while True:
            entries = await self.list(prefix, after, page)
            for e in entries:
                yield e
            if len(entries) < page:
                return
            after = entries[-1].resource

    async def fence(self, resource: str) -> Fenced:
        request = pb.FenceRequest(resource=check_resource(resource, existing=True))
        return _wire.fenced(await self._call("Fence", request))

    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: bool = True,
        **keeper_options: float,
    ) -> Any:
        """``async with client.lease(name, ttl_s=30) as kept:`` acquires,
        keeps the lease and releases it on exit: tied to this client's
        shared session for ``ttl_s`` by default (:class:`SessionKeeper`),
        or renewed on its own by a task with ``session=False``
        (:class:`Keeper`)."""
        check_lease_args(resource, ttl_s, wait_s)
        if not session:
            return Keeper(self, resource, ttl_s, wait_s, **keeper_options)
        if keeper_options:
            raise TypeError(
                f"{', '.join(keeper_options)}: options of a lease renewed on its own "
                "(session=False); a session's heartbeat keeps this one"
            )
        return _SessionLease(self, resource, ttl_s, wait_s)

    async def session(self, ttl_s: float | None = None) -> Session:
        """The session this client shares for ``ttl_s``, opened on first
        use and again after one ended."""
        check_session_ttl(ttl_s)
        s = self._sessions.get(ttl_s)
        if s is None or s.ended.is_set():
            s = await self.open_session(ttl_s)
            self._sessions[ttl_s] = s
        return s

    def with_holder(self, holder: str) -> Client:
        """This client (servers, credentials, connections) with another
        holder description, and sessions of its own."""
        other = copy.copy(self)
        other.holder = check_holder(holder)
        other._sessions = {}
        return other

    def election(self, name: str) -> Election:
        """The fenced election named ``name``."""
        return Election(self, name)

    async def open_session(self, ttl_s: float | None = None) -> Session:
        """Opens a :class:`Session` on the leader."""
        check_session_ttl(ttl_s)
        return await Session.open(self, ttl_s)

    async def watch(self, prefix: str = "") -> Watch:
        """Watches every change of holder under ``prefix``: the snapshot is
        read before this returns; ``async for change in watch``."""
        check_prefix(prefix)
        deadline = time.monotonic() + self.timeout_s
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        while True:
            address = await self._ready_server(unreachable, own=True)
            call = self._stub(address, own=True).Watch(
                pb.WatchRequest(prefix=prefix), metadata=self._metadata
            )
            try:
                return await Watch.start(call)
            except grpc.RpcError as e:
                tried.append(address)
                if _wire.passed_over(self._servers, e, address, unreachable, True, deadline):
                    continue
                pause = self._servers.next_try(e, address, deadline, tried)
                if pause is None:
                    raise _ended(e, address, self.timeout_s) from None
                await asyncio.sleep(pause)


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(
            errors.Indeterminate(
                f"no answer on the session stream within {timeout_s:g} s; "
                "the request may have taken effect"
            )
        )


class Keeper(Kept):
    """The asyncio keeper: a task renews the lease every TTL/3; the
    safe-until is the last acknowledged renewal's send time plus the time
    granted, minus 5% (at least 10 ms). :meth:`check` raises
    :class:`errors.OwnershipLost` once ownership is uncertain, and always
    after; :attr:`lost` is set then."""

    def __init__(
        self,
        client: Client,
        resource: str,
        ttl_s: float | None,
        wait_s: float,
        renew_interval_s: float | None = None,
        safety_margin_s: float | None = None,
    ) -> None:
        self._client = client
        self._request = (resource, ttl_s, wait_s)
        self._interval = renew_interval_s
        self._margin = safety_margin_s
        self._lock = threading.Lock()
        self.lost: asyncio.Event = asyncio.Event()  # type: ignore[assignment]
        self.loss_reason = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Keeper:
        resource, ttl_s, wait_s = self._request
        self._lease = await self._client.acquire(resource, ttl_s, wait_s)
        if self._interval is None:
            self._interval = self._lease.ttl_s / 3
        if self._margin is None:
            self._margin = margin_s(self._lease.ttl_s)
        self._safe_until = self._lease.valid_until - self._margin
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.lost.is_set():
            with contextlib.suppress(errors.BatonError):
                await self._client.release(self._lease)

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def safe_until(self) -> float:
        return self._safe_until

    async def _run(self) -> None:
        assert self._interval is not None and self._margin is not None
        next_renew = time.monotonic() + self._interval
        while self.is_owner():
            await asyncio.sleep(max(0.0, min(next_renew, self._safe_until) - time.monotonic()))
            if not self.is_owner():
                return
            if time.monotonic() < next_renew:
                continue
            budget = self._safe_until - time.monotonic()
            try:
                renewed = await self._client.renew(
                    self._lease, timeout_s=min(budget, self._client.timeout_s)
                )
            except errors.NotOwner as e:
                self._lose(f"the server no longer knows this lease as ours ({e})")
                return
            except errors.BatonError:
                pass  # unknown outcome: nothing learned
            else:
                self._lease = renewed
                self._safe_until = max(self._safe_until, renewed.valid_until - self._margin)
            next_renew = time.monotonic() + self._interval


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
            if message is _EOF or message.WhichOneof("body") != "snapshot":
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
                raise _ended(e, "the server", 0) from None
            if message is _EOF:
                raise StopAsyncIteration
            self._pending.extend(change_of(ev) for ev in message.events.events)
        return self._pending.pop(0)

    def close(self) -> None:
        self._call.cancel()


def _ended(e: grpc.RpcError, address: str, timeout_s: float) -> errors.BatonError:
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return WatchEnded(f"{e.details()}: watch again, from a new snapshot")
    return map_error(e, address, timeout_s)


class Session:
    """The asyncio twin of :class:`baton.session.Session`: one stream, a
    heartbeat task every TTL/3, a reader task, the same safe-until, and a
    resume (following the leader) while it lasts. Open one with
    ``await client.open_session(ttl_s)``."""

    _ledger: Ledger
    _call: Any
    id: bytes
    ttl_s: float

    def __init__(self, client: Client) -> None:
        self._client = client
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self.ended = asyncio.Event()
        #: How many times the stream broke and the session was resumed.
        self.resumes = 0
        self._why: errors.BatonError = SessionEnded("the session is open")
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._writing = asyncio.Lock()

    @classmethod
    async def open(cls, client: Client, ttl_s: float | None = None) -> Session:
        s = cls(client)
        request = pb.OpenSession()
        if ttl_s is not None:
            request.ttl_ms = millis(ttl_s, "session ttl")
        sent = time.monotonic()
        s._call, opened = await s._open(request)
        s._ledger = Ledger(opened, sent)
        s.id, s.ttl_s = s._ledger.id, s._ledger.ttl_s
        s._tasks = [
            asyncio.ensure_future(s._read(s._call)),
            asyncio.ensure_future(s._beat()),
        ]
        return s

    async def _open(self, request: Any) -> tuple[Any, Any]:
        client = self._client
        deadline = time.monotonic() + client.timeout_s
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        while True:
            address = await client._ready_server(unreachable)
            call = client._stub(address).Session(metadata=client._metadata)
            try:
                await call.write(pb.SessionRequest(id=0, open=request))
                first = await asyncio.wait_for(call.read(), client.timeout_s)
            except grpc.RpcError as e:
                tried.append(address)
                if _wire.passed_over(client._servers, e, address, unreachable, False, deadline):
                    continue
                pause = client._servers.next_try(e, address, deadline, tried)
                if pause is None:
                    raise map_error(e, address, client.timeout_s) from None
                await asyncio.sleep(pause)
                continue
            except asyncio.TimeoutError:
                call.cancel()
                raise errors.Indeterminate("no answer to opening the session in time") from None
            which = first.WhichOneof("body") if first is not _EOF else None
            if which == "opened":
                return call, first.opened
            call.cancel()
            if which == "ended":
                raise SessionEnded(ENDED)
            if which == "error":
                raise _request_error(first.error)
            raise errors.Indeterminate(f"unexpected answer to open: {first}")

    async def _read(self, call: Any) -> None:
        try:
            while True:
                response = await call.read()
                if response is _EOF:
                    break
                rid, body, error, ended = self._ledger.read(response)
                if ended:
                    self._end(SessionEnded(ENDED))
                future = self._pending.pop(rid, None) if rid is not None else None
                if future is not None and not future.done():
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(body)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.PERMISSION_DENIED:
                self._end(errors.PermissionDenied(e.details() or ""))
                return
        except asyncio.CancelledError:
            return
        if not self._closing and not self.ended.is_set():
            await self._resume()

    async def _resume(self) -> None:
        pending, self._pending = self._pending, {}
        self._ledger.heartbeats.clear()
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    errors.Indeterminate(
                        "the session stream broke before an answer came; "
                        "the request may have taken effect"
                    )
                )
        pause = 0.02
        while not self._closing and time.monotonic() < self.safe_until:
            try:
                call, resumed = await self._open(pb.OpenSession(resume=self.id))
            except SessionEnded as e:
                self._end(e)
                return
            except errors.BatonError:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            self._ledger.note_revoked(resumed.revoked)
            self._call = call
            self.resumes += 1
            self._tasks.append(asyncio.ensure_future(self._read(call)))
            return
        self._end(SessionEnded("the session could not be resumed before its safe-until"))

    async def _beat(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while not self.ended.is_set():
                await asyncio.sleep(self.ttl_s / 3)
                if self._closing:
                    return
                if time.monotonic() >= self.safe_until:
                    self._end(SessionEnded("no heartbeat was acknowledged before the safe-until"))
                    return
                with contextlib.suppress(Exception):
                    await self._send(self._ledger.heartbeat(time.monotonic()))

    def _end(self, why: errors.BatonError) -> None:
        if self.ended.is_set():
            return
        self._why = why
        self.ended.set()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(why)
        self._call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def _withdraw(self, rid: int, answer: asyncio.Future[Any]) -> None:
        """The caller gave up on waiting acquire ``rid``: withdraw the wait,
        then read its answer, and give back a grant that came first (no
        one will hold it)."""
        cancel = pb.CancelWait(acquire_id=rid)
        with contextlib.suppress(Exception):
            await self._send(pb.SessionRequest(id=next(self._ids), cancel=cancel))
            body = await asyncio.wait_for(answer, self._client.timeout_s)
            if body.WhichOneof("outcome") == "granted":
                for lease in body.granted.leases:
                    release = pb.ReleaseRequest(
                        resource=lease.resource, acquisition_id=lease.acquisition_id
                    )
                    await self._send(pb.SessionRequest(id=next(self._ids), release=release))

    async def _send(self, request: Any) -> None:
        """Writes one request: grpc.aio allows one write in flight per
        stream, and a session is shared by many tasks."""
        async with self._writing:
            await self._call.write(request)

    @property
    def safe_until(self) -> float:
        return self._ledger.safe_until

    def why(self) -> str:
        """Why the session ended (once it did)."""
        return str(self._why)

    def revoked_token(self, resource: str) -> int | None:
        return self._ledger.revoked.get(resource)

    async def _request(self, op: dict[str, Any], timeout_s: float, waits: bool = False) -> Any:
        if self.ended.is_set():
            raise self._why
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[rid] = future
        # A timer, not wait_for: no extra task per request on the hot path.
        expiry = loop.call_later(timeout_s, _expire, future, timeout_s)
        await self._send(pb.SessionRequest(id=rid, **op))
        try:
            # Shielded, so that a cancelled waiting acquire can still read
            # the answer to its withdrawal.
            return await (asyncio.shield(future) if waits else future)
        except asyncio.CancelledError:
            if waits:
                await self._withdraw(rid, future)
            raise
        finally:
            expiry.cancel()
            self._pending.pop(rid, None)

    async def acquire(self, resource: str, wait_s: float = 0) -> Lease:
        """Acquires ``resource`` tied to this session. Cancelling the task
        that awaits a waiting acquire withdraws the wait on the server."""
        return (await self.acquire_all([resource], wait_s))[0]

    async def acquire_all(self, resources: Sequence[str], wait_s: float = 0) -> list[Lease]:
        acquire, n = _wire.session_acquire(resources, wait_s, self._client.holder)
        # A lease answered to a repeat counts from the first send too.
        sent = time.monotonic()
        budget = sent + self._client.timeout_s + wait_s
        repeat = _wire.repeater(acquire, sent)
        while True:
            resumes = self.resumes
            try:
                body = await self._request(
                    {"acquire": acquire},
                    max(budget - time.monotonic(), 0.001),
                    waits=acquire.wait_ms > 0,
                )
                return granted(body, sent, n)
            except errors.Indeterminate:
                # The stream broke with the answer in flight: the same
                # request again once the session is resumed, marked as a
                # repeat (same request id), until the call's time is up.
                if not await self._resumed_since(resumes, budget):
                    raise
                repeat()

    async def _resumed_since(self, resumes: int, until: float) -> bool:
        """Whether the session was resumed after ``resumes`` resumptions,
        waiting for it until ``until``; False once it ended."""
        while not self.ended.is_set() and time.monotonic() < until:
            if self.resumes > resumes:
                return True
            await asyncio.sleep(0.01)
        return False

    async def release(self, lease: Lease) -> bool:
        body = await self._request(
            {"release": _wire.release_request(lease)}, self._client.timeout_s
        )
        return bool(body.released)

    async def close(self) -> bool:
        """Ends the session, releasing its leases; False if it had ended."""
        if self.ended.is_set():
            return False
        try:
            body = await self._request({"close": pb.CloseSession()}, self._client.timeout_s)
        except SessionEnded:
            return False
        finally:
            self._closing = True
            self._end(SessionEnded("the session was closed"))
        return bool(body.was_open)


class SessionKeeper(keeper.SessionKeeper):
    """:class:`baton.keeper.SessionKeeper` for an asyncio session: a task,
    not a thread, sets :attr:`lost` on time."""

    def __init__(self, session: Session, lease: Lease) -> None:
        super().__init__(session, lease, start=False)
        self.lost: asyncio.Event = asyncio.Event()  # type: ignore[assignment]
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while self.is_owner():
                left = self.safe_until - self._now()
                await asyncio.sleep(max(0.0, min(left, self.session.ttl_s / 6)))

    async def __aenter__(self) -> SessionKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        if not self.lost.is_set():
            with contextlib.suppress(errors.BatonError):
                await self.session.release(self.lease)


class _SessionLease:
    """What ``client.lease()`` returns: acquired on entering."""

    def __init__(self, client: Client, resource: str, ttl_s: float | None, wait_s: float) -> None:
        self._args = (client, resource, ttl_s, wait_s)

    async def __aenter__(self) -> SessionKeeper:
        client, resource, ttl_s, wait_s = self._args
        session = await client.session(ttl_s)
        self._kept = SessionKeeper(session, await session.acquire(resource, wait_s))
        return self._kept

    async def __aexit__(self, *exc: object) -> None:
        await self._kept.__aexit__(*exc)


class Election:
    """The asyncio twin of :class:`baton.watch.Election`."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = check_resource(name)

    async def campaign(
        self, value: str, ttl_s: float | None = None, wait_s: float = 60
    ) -> SessionKeeper | None:
        """Waits in line on a new session whose holder is ``value`` until
        this candidate leads (the kept leadership; leaving its ``async
        with`` block releases it) or ``wait_s`` runs out (None)."""
        session = await self._client.with_holder(value).open_session(ttl_s)
        try:
            lease = await session.acquire(self.name, wait_s)
        except errors.NotAcquired:
            await session.close()
            return None
        except BaseException:
            with contextlib.suppress(errors.BatonError):
                await session.close()
            raise
        return SessionKeeper(session, lease)

    async def leader(self) -> Leader | None:
        st = await self._client.status(self.name)
        return None if st.holder_token is None else Leader(st.holder_token, st.holder)

    async def observe(self) -> AsyncGenerator[tuple[Change | None, Leader | None], None]:
        """The leader now, then each change of leader (see the sync twin)."""
        w = await self._client.watch(self.name)
        try:
            now = next((h for h in w.holders if h.resource == self.name), None)
            yield None, (Leader(now.token, now.holder) if now else None)
            async for change in w:
                if change.resource != self.name:
                    continue
                new = change.kind in ("granted", "handed_off")
                yield change, (Leader(change.token, change.holder) if new else None)
        finally:
            w.close()
