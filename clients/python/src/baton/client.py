"""The synchronous client: one or several servers, following the leader,
never repeating a call that may have taken effect."""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import grpc

from baton import errors
from baton._proto import baton_pb2 as pb
from baton._proto import baton_pb2_grpc as pb_grpc
from baton.rules import check_holder, check_resource, check_ttl, millis, parse_duration

LEADER_METADATA = "baton-leader"
TIMEOUT_DEFAULT_S = 10.0

T = TypeVar("T")


@dataclass(frozen=True)
class Lease:
    """A granted lease. ``acquisition_id`` is a secret: it renews and
    releases the lease."""

    resource: str
    acquisition_id: bytes
    token: int
    ttl_s: float
    #: On this process's ``time.monotonic()`` clock: the request's send
    #: time, plus the time the server says it waited in line, plus the TTL.
    #: The server cannot expire the lease before then.
    valid_until: float
    session_bound: bool = False

    def valid_for(self) -> float:
        """Seconds left until :attr:`valid_until` (0 once passed)."""
        return max(0.0, self.valid_until - time.monotonic())

    def is_expired(self) -> bool:
        return time.monotonic() >= self.valid_until


@dataclass(frozen=True)
class Status:
    """A resource as the server reports it (never the acquisition id)."""

    resource: str
    holder_token: int | None
    remaining_s: float
    ttl_s: float
    n_waiters: int
    holder: str | None


@dataclass(frozen=True)
class Fenced:
    """What an operator fence did."""

    token: int
    revoked_token: int | None


def _address(url: str) -> str:
    """``host:port`` from ``host:port``, ``http://host:port`` or ``https://...``."""
    url = url.strip()
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    return url.rstrip("/")


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _never_connected(e: grpc.RpcError) -> bool:
    """UNAVAILABLE because no connection could be made: nothing was sent."""
    details = (e.details() or "").lower()
    return e.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details
        or "connection refused" in details
        or "dns resolution failed" in details
        or "handshake failed" in details
    )


def map_error(e: grpc.RpcError, address: str, timeout_s: float) -> errors.BatonError:
    """The exception for a failed call at ``address``: definite when the
    status says nothing was done, :class:`errors.Indeterminate` otherwise."""
    code = e.code()
    details = e.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.Indeterminate(
            f"no answer from {address} within {timeout_s:g} s: the server may be stopped, "
            "overloaded or cut off; the request may have taken effect"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        if _never_connected(e):
            return errors.Unavailable(f"cannot connect to {address}: {details}")
        return errors.Indeterminate(
            f"the connection to {address} broke before an answer came ({details}); "
            "the request may have taken effect"
        )
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return errors.InvalidArgument(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Exhausted(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(details)
    return errors.Indeterminate(f"{code.name} from {address}: {details}")


def _leader_hint(e: grpc.RpcError) -> str | None:
    """A follower's answer: UNAVAILABLE naming the leader ("" if unknown)."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for item in e.trailing_metadata() or ():
        if item.key == LEADER_METADATA:
            value = item.value
            return value if isinstance(value, str) else value.decode()
    return None


class Client:
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
    from several threads.
    """

    def __init__(
        self,
        servers: str | None = None,
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        token_file: str | None = None,
        timeout_s: float | None = None,
        holder: str | None = None,
    ) -> None:
        env = os.environ
        servers = servers if servers is not None else env.get("BATON_SERVER", "127.0.0.1:7700")
        self._addresses = [_address(s) for s in servers.split(",") if s.strip()]
        if not self._addresses:
            raise ValueError("servers: name at least one host:port")
        ca_file = ca_file or env.get("BATON_TLS_CA")
        cert_file = cert_file or env.get("BATON_CLIENT_CERT")
        key_file = key_file or env.get("BATON_CLIENT_KEY")
        token_file = token_file or env.get("BATON_TOKEN_FILE")
        if (cert_file is None) != (key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if cert_file is not None and ca_file is None:
            raise ValueError("a client certificate needs TLS: give ca_file too")
        self._credentials: grpc.ChannelCredentials | None = None
        if ca_file is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file),
                private_key=_read(key_file),
                certificate_chain=_read(cert_file),
            )
        self._metadata: list[tuple[str, str]] = []
        if token_file is not None:
            token = (_read(token_file) or b"").decode().strip()
            if not token:
                raise ValueError(f"token file {token_file} is empty")
            self._metadata.append(("authorization", f"Bearer {token}"))
        if timeout_s is None:
            raw = env.get("BATON_TIMEOUT")
            timeout_s = parse_duration(raw, "BATON_TIMEOUT") if raw else TIMEOUT_DEFAULT_S
        if timeout_s <= 0:
            raise ValueError(f"timeout {timeout_s} s: it must be positive")
        self.timeout_s = timeout_s
        holder = holder if holder is not None else env.get("BATON_HOLDER")
        self.holder = check_holder(holder) if holder else None
        self._lock = threading.Lock()
        self._current = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._watch_channels: dict[str, grpc.Channel] = {}
        self._sessions: dict[float | None, Any] = {}

    # -- connections ------------------------------------------------------

    def _stub(self, address: str, own: bool = False) -> pb_grpc.LeasesStub:
        """A stub on the shared channel to ``address``, or with ``own`` on a
        channel for watches alone (a slow watcher must not hold up leases)."""
        channels = self._watch_channels if own else self._channels
        with self._lock:
            channel = channels.get(address)
            if channel is None:
                # Reconnect soon after a server comes back (gRPC's default
                # first backoff is a second, during which calls fail fast).
                options = [
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ]
                if self._credentials is not None:
                    channel = grpc.secure_channel(address, self._credentials, options)
                else:
                    channel = grpc.insecure_channel(address, options)
                channels[address] = channel
        return pb_grpc.LeasesStub(channel)

    def current_server(self) -> str:
        """The server the next call goes to."""
        with self._lock:
            return self._addresses[self._current]

    def _switch_to(self, leader: str) -> None:
        leader = _address(leader)
        with self._lock:
            if leader not in self._addresses:
                self._addresses.append(leader)
            self._current = self._addresses.index(leader)

    def _rotate(self, address: str) -> None:
        with self._lock:
            if self._addresses[self._current] == address:
                self._current = (self._current + 1) % len(self._addresses)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: str, request: Any, extra_s: float = 0.0, timeout_s: float | None = None
    ) -> Any:
        """Sends ``request`` to the leader, moving on from followers and
        from servers that refuse connections (both definite) until the
        timeout; any other failure is raised as it is, never repeated."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        tried: list[str] = []
        while True:
            address = self.current_server()
            rpc: Callable[..., Any] = getattr(self._stub(address), method)
            try:
                return rpc(request, timeout=timeout_s + extra_s, metadata=self._metadata)
            except grpc.RpcError as e:
                tried.append(address)
                if not self._follow(e, address, deadline, tried):
                    raise self._error(e, address, timeout_s + extra_s) from None

    def _follow(
        self, e: grpc.RpcError, address: str, deadline: float, tried: list[str] | None = None
    ) -> bool:
        """After a call at ``address`` failed with ``e``: True if the server
        certainly did nothing and the call should go to the next server
        (the named leader, or the next address; already switched to),
        False if ``e`` must be raised. Raises :class:`errors.Unavailable`
        once every server was tried and ``deadline`` passed."""
        tried = tried if tried is not None else [address]
        hint = _leader_hint(e)
        if hint and _address(hint) != address:
            self._switch_to(hint)
        elif hint is not None or _never_connected(e):
            # Nothing was sent: trying again (here, or on the next server)
            # is safe until the deadline. A lone server is tried again too:
            # a restarted one is back before the channel's next reconnect.
            self._rotate(address)
        else:
            return False
        if time.monotonic() >= deadline:
            raise self._unavailable(e, tried) from None
        if len(tried) % len(self._addresses) == 0:
            time.sleep(min(0.02 * 2 ** (len(tried) // len(self._addresses)), 0.5))
        return True

    def _error(
        self, e: grpc.RpcError, address: str, timeout_s: float | None = None
    ) -> errors.BatonError:
        return map_error(e, address, self.timeout_s if timeout_s is None else timeout_s)

    def _unavailable(self, e: grpc.RpcError, tried: list[str]) -> errors.Unavailable:
        details = e.details() or ""
        servers = ", ".join(dict.fromkeys(tried))
        return errors.Unavailable(
            f"no server could serve the call (tried {servers}): {details}; nothing was done"
        )

    # -- leases -----------------------------------------------------------

    def acquire(self, resource: str, ttl_s: float | None = None, wait_s: float = 0) -> Lease:
        """Acquires one resource; raises :class:`errors.NotAcquired` if it is
        held (``wait_s`` 0) or the wait ran out. ``ttl_s`` None: the
        server's default."""
        return self.acquire_all([resource], ttl_s, wait_s)[0]

    def acquire_all(
        self, resources: Sequence[str], ttl_s: float | None = None, wait_s: float = 0
    ) -> list[Lease]:
        """Acquires every resource or none, in one request."""
        if isinstance(resources, str):
            raise ValueError("resources: a list of names, not one string")
        names = [check_resource(r) for r in resources]
        if not names:
            raise ValueError("resources: name at least one")
        request = pb.AcquireRequest(resources=names, wait_ms=millis(wait_s, "wait", zero_ok=True))
        if ttl_s is not None:
            request.ttl_ms = millis(check_ttl(ttl_s), "ttl")
        if self.holder is not None:
            request.holder = self.holder
        sent = time.monotonic()
        response = self._call("Acquire", request, extra_s=wait_s)
        leases = granted(response, sent, len(names))
        if any(lease.is_expired() for lease in leases):
            # Nobody may act on it: give it back, best effort.
            for lease in leases:
                with contextlib.suppress(errors.BatonError):
                    self.release(lease)
            raise errors.NotAcquired(
                "the grant came back after its TTL, counted from when the request was sent",
                resource=leases[0].resource,
                reason="expired_on_arrival",
            )
        return leases

    def renew(self, lease: Lease, timeout_s: float | None = None) -> Lease:
        """Extends the lease by its TTL; raises :class:`errors.NotOwner` if
        it is no longer this holder's (nothing is extended). The result's
        ``valid_until`` counts from this renewal's send time."""
        request = pb.RenewRequest(resource=lease.resource, acquisition_id=lease.acquisition_id)
        sent = time.monotonic()
        r = self._call("Renew", request, timeout_s=timeout_s)
        if not r.renewed:
            raise errors.NotOwner(
                f"{lease.resource}: the lease with token {lease.token} is no longer held "
                "(expired, released, fenced or replaced); nothing was extended"
            )
        return Lease(
            resource=lease.resource,
            acquisition_id=lease.acquisition_id,
            token=r.token,
            ttl_s=lease.ttl_s,
            valid_until=sent + r.remaining_ms / 1000,
            session_bound=lease.session_bound,
        )

    def release(self, lease: Lease) -> bool:
        """Gives the lease back; False if it was not held (an old or wrong
        id changes nothing)."""
        request = pb.ReleaseRequest(resource=lease.resource, acquisition_id=lease.acquisition_id)
        return bool(self._call("Release", request).released)

    def status(self, resource: str) -> Status:
        """The holder token, remaining TTL, waiters and holder of a resource."""
        return _status(self._call("Status", pb.StatusRequest(resource=check_resource(resource))))

    def list(self, prefix: str = "", start_after: str = "", limit: int = 100) -> list[Status]:
        """One page of resources with a lease or waiters, in name order."""
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit {limit}: it must be between 1 and 1000")
        request = pb.ListRequest(prefix=prefix, start_after=start_after, limit=limit)
        return [_status(e) for e in self._call("List", request).entries]

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
        """Revokes the lease, if any, and issues a token above every earlier one."""
        r = self._call("Fence", pb.FenceRequest(resource=check_resource(resource)))
        return Fenced(token=r.token, revoked_token=r.revoked_token if r.revoked else None)

    def open_session(self, ttl_s: float | None = None) -> Any:
        """Opens a :class:`baton.session.Session` on the leader: one
        stream, one heartbeat thread, many leases tied to it. ``ttl_s``
        None: the server's default TTL."""
        from baton.session import Session

        return Session(self, ttl_s)

    def with_holder(self, holder: str) -> Client:
        """This client (its servers, credentials and connections) with
        another holder description, and sessions of its own."""
        other = copy.copy(self)
        other.holder = check_holder(holder)
        other._sessions = {}
        return other

    def watch(self, prefix: str = "") -> Any:
        """Watches every change of holder under ``prefix`` (see
        :class:`baton.watch.Watch`); needs ``read`` on the prefix."""
        from baton.watch import Watch

        return Watch(self, prefix)

    def election(self, name: str) -> Any:
        """The fenced election named ``name`` (see :class:`baton.watch.Election`)."""
        from baton.watch import Election

        return Election(self, name)

    def session(self, ttl_s: float | None = None) -> Any:
        """The session this client shares among its users for ``ttl_s``,
        opened on first use and again after one ended."""
        key = ttl_s
        with self._lock:
            s = self._sessions.get(key)
        if s is not None and not s.ended.is_set():
            return s
        s = self.open_session(ttl_s)
        with self._lock:
            self._sessions[key] = s
        return s

    def lease(
        self,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        *,
        session: bool = True,
        **keeper_options: Any,
    ) -> Any:
        """``with client.lease(name, ttl_s=30) as kept:`` acquires, keeps
        the lease and releases it on exit. By default the lease is tied to
        this client's shared session for ``ttl_s`` (one heartbeat for all
        its leases; :class:`baton.keeper.SessionKeeper`); ``session=False``
        renews it on its own (:class:`baton.keeper.Keeper`)."""
        from baton.keeper import Keeper, SessionKeeper

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
            for channel in [*self._channels.values(), *self._watch_channels.values()]:
                channel.close()
            self._channels.clear()
            self._watch_channels.clear()


def granted(response: Any, sent: float, n: int) -> list[Lease]:
    """The leases of an :class:`AcquireResponse`, counted from ``sent``, or
    :class:`errors.NotAcquired`."""
    which = response.WhichOneof("outcome")
    if which == "not_acquired":
        na = response.not_acquired
        reason = pb.NotAcquired.Reason.Name(na.reason).lower()
        held = f" (held by token {na.holder_token})" if na.holder_token else ""
        raise errors.NotAcquired(
            f"not acquired: {na.resource or 'a resource'} {reason}{held}",
            resource=na.resource,
            holder_token=na.holder_token or None,
            reason=reason,
        )
    if which != "granted" or len(response.granted.leases) != n:
        raise errors.Indeterminate(f"unexpected answer to acquire: {response}")
    return [
        Lease(
            resource=lease.resource,
            acquisition_id=bytes(lease.acquisition_id),
            token=lease.token,
            ttl_s=lease.ttl_ms / 1000,
            valid_until=sent + (lease.waited_ms + lease.ttl_ms) / 1000,
            session_bound=lease.session_bound,
        )
        for lease in response.granted.leases
    ]


def _status(s: Any) -> Status:
    return Status(
        resource=s.resource,
        holder_token=s.holder_token if s.held else None,
        remaining_s=s.remaining_ms / 1000,
        ttl_s=s.ttl_ms / 1000,
        n_waiters=s.n_waiters,
        holder=s.holder or None,
    )
