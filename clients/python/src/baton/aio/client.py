"""The asyncio client: connections, the leader, and unary calls."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Callable, Literal, overload

import grpc
import grpc.aio

from baton import _dial, _wire, errors
from baton._proto import baton_pb2 as pb
from baton._proto import baton_pb2_grpc as pb_grpc
from baton._types import Claim, Fenced, Lease, Status
from baton._wire import granted, map_error
from baton.aio.election import Election
from baton.aio.keeper import Keeper, SessionLease
from baton.aio.session import Session
from baton.aio.watch import Watch
from baton.rules import (
    check_after_seq,
    check_holder,
    check_lease_args,
    check_prefix,
    check_resource,
    check_session_ttl,
)


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

    async def acquire(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> Lease:
        """As :meth:`baton.Client.acquire`."""
        leases = await self.acquire_all([resource], ttl_s, wait_s, shared=shared, permits=permits)
        return leases[0]

    async def acquire_all(
        self,
        resources: Sequence[Claim],
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> list[Lease]:
        """As :meth:`baton.Client.acquire_all`."""
        request, n = _wire.acquire_request(resources, ttl_s, wait_s, self.holder, shared, permits)
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

    async def set_permits(self, resource: str, permits: int) -> int:
        """As :meth:`baton.Client.set_permits`."""
        request = _wire.set_permits_request(resource, permits)
        return int((await self._call("SetPermits", request)).previous)

    @overload
    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: Literal[True] = True,
    ) -> SessionLease: ...

    @overload
    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: Literal[False],
        **keeper_options: float,
    ) -> Keeper: ...

    @overload
    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: bool,
        **keeper_options: float,
    ) -> Keeper | SessionLease: ...

    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: bool = True,
        **keeper_options: float,
    ) -> Keeper | SessionLease:
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
        return SessionLease(self, resource, ttl_s, wait_s)

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

    async def watch(
        self, prefix: str = "", after_seq: int | None = None, once: bool = False
    ) -> Watch:
        """Watches every change of holder under ``prefix``: the snapshot is
        read before this returns (or, with ``after_seq``, the changes after
        that number come first); ``async for change in watch``. Resumes by
        itself unless ``once`` (see :class:`baton.watch.Watch`)."""
        check_prefix(prefix)
        return await Watch.start(self, prefix, check_after_seq(after_seq), once)
