"""The synchronous client: one or several servers, following the leader,
never repeating a call that may have taken effect."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Literal, overload

import grpc

from baton import _dial, _wire, aio, errors
from baton._proto import baton_pb2 as pb
from baton._proto import baton_pb2_grpc as pb_grpc
from baton._types import Claim, Fenced, Lease, Status
from baton._wire import (
    LEADER_METADATA,
    _leader_hint,
    granted,
    map_error,
)
from baton.keeper import Keeper, SessionKeeper
from baton.rules import (
    check_after_seq,
    check_holder,
    check_lease_args,
    check_prefix,
    check_resource,
    check_session_ttl,
)
from baton.session import Session, _run
from baton.watch import Election, Watch

__all__ = [
    "LEADER_METADATA",
    "Client",
    "Fenced",
    "Lease",
    "Status",
    "_leader_hint",
    "granted",
    "map_error",
]


class Client(_wire.Settings):
    """A connection to a Baton server, or to the leader of a cluster.

    ``servers``: ``"host:port"`` or several separated by commas (default:
    ``BATON_SERVER``, else ``127.0.0.1:7700``). TLS with ``ca_file`` (and a
    client certificate with ``cert_file`` and ``key_file``), a bearer token
    from ``token_file``; by default from ``BATON_TLS_CA``,
    ``BATON_CLIENT_CERT``, ``BATON_CLIENT_KEY`` and ``BATON_TOKEN_FILE``,
    as the command line reads them. ``timeout_s`` bounds every call beyond
    its server-side wait (``BATON_TIMEOUT``, like ``10s``). ``holder``
    describes who holds the leases this client acquires (``BATON_HOLDER``).

    Calls go to the leader: a follower's answer names it and the call is
    sent there (a follower did nothing). A call that may have taken effect
    is never repeated: it raises :class:`errors.Indeterminate`. Safe to use
    from several threads. :mod:`baton.aio` is the asyncio twin.
    """

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, pb_grpc.LeasesStub] = {}
        self._watch_channels: dict[str, pb_grpc.LeasesStub] = {}
        self._open_channels: list[grpc.Channel] = []
        self._channel_of: dict[tuple[str, bool], grpc.Channel] = {}
        self._sessions: dict[float | None, Session] = {}
        self._twin: aio.Client | None = None

    # -- connections ------------------------------------------------------

    def _stub(self, address: str, own: bool = False) -> pb_grpc.LeasesStub:
        """A stub on the shared channel to ``address``, or with ``own`` on a
        channel for watches alone (a slow watcher must not hold up leases)."""
        channels = self._watch_channels if own else self._channels
        with self._lock:
            stub = channels.get(address)
            if stub is None:
                options = _wire.channel_options(self.dial_timeout_s)
                if self._credentials is not None:
                    channel = grpc.secure_channel(address, self._credentials, options)
                else:
                    channel = grpc.insecure_channel(address, options)
                # One stub per channel: making one builds every method's callable.
                stub = pb_grpc.LeasesStub(channel)
                channels[address] = stub
                self._open_channels.append(channel)
                self._channel_of[(address, own)] = channel
        return stub

    def _ready_server(self, unreachable: list[tuple[str, str]], own: bool = False) -> str:
        """The server for the next call: the current one once it answered
        a dial; else every member not yet found unreachable is dialed at
        once and the first to answer becomes current. Raises a definite
        :class:`errors.Unavailable` naming each once none is left."""
        while True:
            address = self._servers.current_if_answered()
            if address is not None:
                return address
            candidates = self._servers.candidates(unreachable)
            if not candidates:
                raise _wire.none_reachable(unreachable)
            alive = []
            for a in candidates:
                why = _dial.tcp_check(a, self.dial_timeout_s)
                if why is None:
                    alive.append(a)
                else:
                    self._servers.pass_over(a)
                    unreachable.append((a, why))
            winner = self._first_ready(alive, own) if alive else None
            if winner is not None:
                self._servers.answered(winner)
                return winner
            for a in alive:
                self._servers.pass_over(a)
                unreachable.append((a, _dial.no_answer(self.dial_timeout_s)))

    def _first_ready(self, addresses: list[str], own: bool) -> str | None:
        """The first of ``addresses`` whose channel is READY (the server
        sent its SETTINGS) within the dial timeout."""
        won: list[str] = []
        event = threading.Event()
        futures = []
        for a in addresses:
            self._stub(a, own)
            future = grpc.channel_ready_future(self._channel_of[(a, own)])

            def done(f: Any, a: str = a) -> None:
                if not f.cancelled():
                    won.append(a)
                event.set()

            future.add_done_callback(done)
            futures.append(future)
        event.wait(self.dial_timeout_s)
        for future in futures:
            future.cancel()
        return won[0] if won else None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        request: Any,
        extra_s: float = 0.0,
        timeout_s: float | None = None,
        read: bool | Callable[[], None] = False,
    ) -> Any:
        """Sends ``request`` to the leader, moving on from followers and
        from members that fail to dial (both definite) until the timeout;
        a ``read`` whose connection broke goes to another member (as does
        an acquire, marked as a repeat by ``read`` then, until its wait is
        over too); any other failure is raised as it is, never repeated."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s + (extra_s if callable(read) else 0.0)
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        lost: errors.BatonError | None = None
        while True:
            try:
                address = self._ready_server(unreachable)
            except errors.BatonError as e:
                raise _wire.after_lost(lost, e) from None
            rpc: Callable[..., Any] = getattr(self._stub(address), method)
            try:
                return rpc(request, timeout=timeout_s + extra_s, metadata=self._metadata)
            except grpc.RpcError as e:
                tried.append(address)
                if callable(read) and lost is None and _wire.lost_answer(e):
                    lost = self._error(e, address, timeout_s + extra_s)
                if _wire.passed_over(self._servers, e, address, unreachable, read, deadline):
                    continue
                if not self._follow(e, address, deadline, tried):
                    error = self._error(e, address, timeout_s + extra_s)
                    raise _wire.after_lost(lost, error) from None

    def _follow(
        self, e: grpc.RpcError, address: str, deadline: float, tried: list[str] | None = None
    ) -> bool:
        """True (after a pause, if every server was tried) if the call
        should go to the next server; False if ``e`` must be raised."""
        pause = self._servers.next_try(e, address, deadline, tried or [address])
        if pause is None:
            return False
        time.sleep(pause)
        return True

    def _error(
        self, e: grpc.RpcError, address: str, timeout_s: float | None = None
    ) -> errors.BatonError:
        return map_error(e, address, self.timeout_s if timeout_s is None else timeout_s)

    # -- leases -----------------------------------------------------------

    def acquire(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> Lease:
        """Acquires one resource; raises :class:`errors.NotAcquired` if it is
        held (``wait_s`` 0) or the wait ran out. ``ttl_s`` None: the
        server's default. ``shared``: a shared lock (beside other shared
        holders, never an exclusive one); ``permits``: one of that many
        permits of a semaphore (docs/locks.md); the lease's ``slot`` says
        which."""
        return self.acquire_all([resource], ttl_s, wait_s, shared=shared, permits=permits)[0]

    def acquire_all(
        self,
        resources: Sequence[Claim],
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> list[Lease]:
        """Acquires every resource or none, in one request, each held as
        ``shared`` and ``permits`` say (see :meth:`acquire`), or as the
        :class:`baton.Shape` paired with its name: shapes mix in one
        request (``["db", ("report", Shape(shared=True)), ("builders",
        Shape(permits=3))]``)."""
        request, n = _wire.acquire_request(resources, ttl_s, wait_s, self.holder, shared, permits)
        # A lease answered to a repeat counts from the first send too.
        sent = time.monotonic()
        repeat = _wire.repeater(request, sent)
        leases = granted(self._call("Acquire", request, extra_s=wait_s, read=repeat), sent, n)
        late = _wire.expired_on_arrival(leases)
        if late is not None:
            # Nobody may act on it: give it back, best effort.
            for lease in leases:
                with contextlib.suppress(errors.BatonError):
                    self.release(lease)
            raise late
        return leases

    def renew(self, lease: Lease, timeout_s: float | None = None) -> Lease:
        """Extends the lease by its TTL; raises :class:`errors.NotOwner` if
        it is no longer this holder's (nothing is extended). The result's
        ``valid_until`` counts from this renewal's send time."""
        sent = time.monotonic()
        r = self._call("Renew", _wire.renew_request(lease), timeout_s=timeout_s)
        return _wire.renewed(lease, r, sent)

    def release(self, lease: Lease) -> bool:
        """Gives the lease back; False if it was not held (an old or wrong
        id changes nothing)."""
        return bool(self._call("Release", _wire.release_request(lease)).released)

    def status(self, resource: str) -> Status:
        """The holder token, remaining TTL, waiters and holder of a resource."""
        request = pb.StatusRequest(resource=check_resource(resource, existing=True))
        return _wire.status(self._call("Status", request, read=True))

    def list(self, prefix: str = "", start_after: str = "", limit: int = 100) -> list[Status]:
        """One page of resources with a lease or waiters, in name order."""
        request = _wire.list_request(prefix, start_after, limit)
        return [_wire.status(e) for e in self._call("List", request, read=True).entries]

    def list_all(self, prefix: str = "", page: int = 1000) -> Iterator[Status]:
        """Every resource under ``prefix``, a page at a time."""
        after = ""
        while True:
            entries = self.list(prefix, after, page)
            yield from entries
            if len(entries) < page:
                return
            after = entries[-1].resource

    def fence(self, resource: str) -> Fenced:
        """Revokes the lease, if any (every holder of a shared lock or a
        semaphore), and issues a token above every earlier one."""
        request = pb.FenceRequest(resource=check_resource(resource, existing=True))
        return _wire.fenced(self._call("Fence", request))

    def set_permits(self, resource: str, permits: int) -> int:
        """Operator: changes a semaphore's number of permits while it has
        holders or waiters; returns the number it replaced. Lowering it
        revokes no permit held."""
        request = _wire.set_permits_request(resource, permits)
        return int(self._call("SetPermits", request).previous)

    # -- sessions, keepers, watches -------------------------------------------

    def _aio_twin(self) -> aio.Client:
        """The asyncio client its sessions run on (see
        :class:`baton.session.Session`): the same settings, holder and
        servers, made once per client and holder."""
        with self._lock:
            twin = self._twin
            if twin is None or twin.holder != self.holder:
                twin = aio.Client(_share=self)
                self._twin = twin
            return twin

    def open_session(self, ttl_s: float | None = None) -> Session:
        """Opens a :class:`baton.session.Session` on the leader: one
        stream, one heartbeat thread, many leases tied to it. ``ttl_s``
        None: the server's default TTL."""
        check_session_ttl(ttl_s)
        return Session(self, ttl_s)

    def with_holder(self, holder: str) -> Client:
        """This client (its servers, credentials and connections) with
        another holder description, and sessions of its own."""
        other = copy.copy(self)
        other.holder = check_holder(holder)
        other._sessions = {}
        other._twin = None
        return other

    def watch(self, prefix: str = "", after_seq: int | None = None, once: bool = False) -> Watch:
        """Watches every change of holder under ``prefix`` (see
        :class:`baton.watch.Watch`): from a snapshot, or after the change
        numbered ``after_seq``; resuming by itself unless ``once``. Needs
        ``read`` on the prefix."""
        return Watch(self, check_prefix(prefix), check_after_seq(after_seq), once)

    def election(self, name: str) -> Election:
        """The fenced election named ``name`` (see :class:`baton.watch.Election`)."""
        return Election(self, name)

    def session(self, ttl_s: float | None = None) -> Session:
        """The session this client shares among its users for ``ttl_s``,
        opened on first use and again after one ended."""
        check_session_ttl(ttl_s)
        with self._lock:
            s = self._sessions.get(ttl_s)
        if s is not None and not s.ended.is_set():
            return s
        s = self.open_session(ttl_s)
        with self._lock:
            self._sessions[ttl_s] = s
        return s

    @overload
    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: Literal[True] = True,
    ) -> SessionKeeper: ...

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
    ) -> Keeper | SessionKeeper: ...

    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: bool = True,
        **keeper_options: float,
    ) -> Keeper | SessionKeeper:
        """``with client.lease(name, ttl_s=30) as kept:`` acquires, keeps
        the lease and releases it on exit. By default the lease is tied to
        this client's shared session for ``ttl_s`` (one heartbeat for all
        its leases; :class:`baton.keeper.SessionKeeper`); ``session=False``
        renews it on its own (:class:`baton.keeper.Keeper`)."""
        check_lease_args(resource, ttl_s, wait_s)
        if not session:
            return Keeper.acquire(self, resource, ttl_s, wait_s, **keeper_options)
        if keeper_options:
            raise TypeError(
                f"{', '.join(keeper_options)}: options of a lease renewed on its own "
                "(session=False); a session's heartbeat keeps this one"
            )
        s = self.session(ttl_s)
        return SessionKeeper(s, s.acquire(resource, wait_s))

    def close(self) -> None:
        """Closes this client's sessions (releasing their leases) and
        every connection."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for s in sessions:
            with contextlib.suppress(errors.BatonError):
                s.close()
        with self._lock:
            twin, self._twin = self._twin, None
        if twin is not None:
            with contextlib.suppress(Exception):
                _run(twin.close())
        with self._lock:
            for channel in self._open_channels:
                _dial.close_channel(channel)
            self._open_channels.clear()
            self._channels.clear()
            self._watch_channels.clear()
