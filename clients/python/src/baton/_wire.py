"""What the sync and the asyncio clients share: the configuration they
read, the servers they follow, the requests they build and the answers
they read (as the values of :mod:`baton._types`). No I/O beyond reading
credential files."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from baton import _dial, errors
from baton._proto import baton_pb2 as pb
from baton._types import (
    Blocker,
    BlockingHolder,
    Change,
    Fenced,
    Holder,
    Lease,
    Shape,
    SlotHolder,
    Status,
)
from baton.rules import (
    check_holder,
    check_prefix,
    check_resource,
    check_shape,
    check_ttl,
    millis,
    parse_duration,
)

LEADER_METADATA = "baton-leader"
TIMEOUT_DEFAULT_S = 10.0


def _address(url: str) -> str:
    """``host:port`` from an address as users write it (see
    :func:`baton._dial.address`); ``ValueError`` naming the rule."""
    return _dial.address(url)


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
    if code == grpc.StatusCode.OUT_OF_RANGE:
        oldest = _metadata(e, OLDEST_SEQ_METADATA)
        if oldest is not None and oldest.isdigit():
            return errors.WatchTooOld(details, int(oldest))
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return errors.InvalidArgument(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Exhausted(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(details)
    return errors.Indeterminate(f"{code.name} from {address}: {details}")


#: The metadata of a watch refused for a number older than the server
#: keeps: the oldest number it resumes from.
OLDEST_SEQ_METADATA = "baton-oldest-seq"

#: How long a watch tries to resume without an answer before it raises
#: the last failure.
RESUME_FOR_S = 60.0


def mended_by_resuming(e: errors.BatonError) -> bool:
    """Whether a watch that ended with ``e`` may resume: its stream ended
    or its connection broke, or it fell behind; never a refusal."""
    return isinstance(
        e, (errors.WatchEnded, errors.Exhausted, errors.Indeterminate, errors.Unavailable)
    )


def _metadata(e: grpc.RpcError, key: str) -> str | None:
    """A trailing metadata value of a failed call."""
    pairs: Any = e.trailing_metadata() or ()
    for k, value in pairs:
        if k == key:
            return value if isinstance(value, str) else value.decode()
    return None


def _leader_hint(e: grpc.RpcError) -> str | None:
    """A follower's answer: UNAVAILABLE naming the leader ("" if unknown)."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    # Pairs: `_Metadatum` named tuples (sync) or plain tuples (grpc.aio).
    pairs: Any = e.trailing_metadata() or ()
    for key, value in pairs:
        if key == LEADER_METADATA:
            return value if isinstance(value, str) else value.decode()
    return None


class Config:
    """A client's settings, from its arguments or the command line's
    environment variables (see :class:`baton.Client`)."""

    def __init__(
        self,
        servers: str | None,
        ca_file: str | None,
        cert_file: str | None,
        key_file: str | None,
        token_file: str | None,
        timeout_s: float | None,
        holder: str | None,
        dial_timeout_s: float | None = None,
    ) -> None:
        env = os.environ
        servers = servers if servers is not None else env.get("BATON_SERVER", "127.0.0.1:7700")
        self.addresses = [_address(s) for s in servers.split(",") if s.strip()]
        if not self.addresses:
            raise ValueError("servers: name at least one host:port")
        ca_file = ca_file or env.get("BATON_TLS_CA")
        cert_file = cert_file or env.get("BATON_CLIENT_CERT")
        key_file = key_file or env.get("BATON_CLIENT_KEY")
        token_file = token_file or env.get("BATON_TOKEN_FILE")
        if (cert_file is None) != (key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if cert_file is not None and ca_file is None:
            raise ValueError("a client certificate needs TLS: give ca_file too")
        #: (root certificates, private key, certificate chain) for TLS.
        self.tls: tuple[bytes | None, bytes | None, bytes | None] | None = None
        if ca_file is not None:
            self.tls = (_read(ca_file), _read(key_file), _read(cert_file))
        self.metadata: list[tuple[str, str]] = []
        if token_file is not None:
            token = (_read(token_file) or b"").decode().strip()
            if not token:
                raise ValueError(f"token file {token_file} is empty")
            self.metadata.append(("authorization", f"Bearer {token}"))
        if timeout_s is None:
            raw = env.get("BATON_TIMEOUT")
            timeout_s = parse_duration(raw, "BATON_TIMEOUT") if raw else TIMEOUT_DEFAULT_S
        if timeout_s <= 0:
            raise ValueError(f"timeout {timeout_s} s: it must be positive")
        self.timeout_s = timeout_s
        if dial_timeout_s is None:
            raw = env.get("BATON_DIAL_TIMEOUT")
            dial_timeout_s = (
                parse_duration(raw, "BATON_DIAL_TIMEOUT") if raw else _dial.DIAL_TIMEOUT_DEFAULT_S
            )
        if isinstance(dial_timeout_s, bool) or not isinstance(dial_timeout_s, (int, float)):
            raise ValueError(f"dial_timeout_s {dial_timeout_s!r}: it must be a number of seconds")
        if not dial_timeout_s > 0:
            raise ValueError(f"dial timeout {dial_timeout_s} s: it must be positive")
        self.dial_timeout_s = float(dial_timeout_s)
        holder = holder if holder is not None else env.get("BATON_HOLDER")
        self.holder = check_holder(holder) if holder else None


class Settings:
    """What both clients (sync and asyncio) set up from their arguments:
    see :class:`baton.Client` for each."""

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
        dial_timeout_s: float | None = None,
        _share: Settings | None = None,
    ) -> None:
        """``_share`` (internal): another client whose settings, holder
        and servers this one takes as they are, the others then unset (a
        sync client's sessions run on an asyncio client sharing them)."""
        if _share is not None:
            self.timeout_s: float = _share.timeout_s
            self.dial_timeout_s: float = _share.dial_timeout_s
            self.holder: str | None = _share.holder
            self._metadata: tuple[tuple[str, str], ...] = _share._metadata
            self._servers: Servers = _share._servers
            self._credentials: grpc.ChannelCredentials | None = _share._credentials
            self._setup()
            return
        config = Config(
            servers, ca_file, cert_file, key_file, token_file, timeout_s, holder, dial_timeout_s
        )
        self.timeout_s = config.timeout_s
        self.dial_timeout_s = config.dial_timeout_s
        self.holder = config.holder
        self._metadata = tuple(config.metadata)
        self._servers = Servers(config.addresses)
        self._credentials = None
        if config.tls is not None:
            root, key, chain = config.tls
            self._credentials = grpc.ssl_channel_credentials(root, key, chain)
        self._setup()

    def _setup(self) -> None:
        """A client's own state (its connections), after the settings."""

    @property
    def _addresses(self) -> list[str]:
        return self._servers.addresses

    def current_server(self) -> str:
        """The server the next call goes to."""
        return self._servers.current()


#: Reconnect soon after a server comes back (gRPC's default first backoff
#: is a second, during which calls fail fast).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def channel_options(dial_timeout_s: float) -> list[tuple[str, int]]:
    """:data:`CHANNEL_OPTIONS`, connections of the channel's own, and a
    PING after a dial timeout of silence that must be answered within
    another: an open connection to a server that stopped answering is
    closed, and the next call dials again."""
    ms = max(1, int(dial_timeout_s * 1000))
    return [
        *CHANNEL_OPTIONS,
        # A channel's own connections: gRPC otherwise shares a READY
        # connection to the same address across channels, and READY would
        # then say nothing of whether the server answers a dial now.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


#: How long a member that failed a dial is passed over.
PASS_OVER_FOR_S = 5.0


class Servers:
    """The servers of one client, the one its next call goes to, those
    that answered a dial, and those passed over for a while."""

    def __init__(self, addresses: list[str]) -> None:
        self._lock = threading.Lock()
        self.addresses = list(addresses)
        self._current = 0
        self._answered: set[str] = set()
        self._passed_over: dict[str, float] = {}

    def current(self) -> str:
        with self._lock:
            return self.addresses[self._current]

    def current_if_answered(self) -> str | None:
        """The current server if it answered a dial and was not passed
        over since; None when the next call must dial."""
        with self._lock:
            address = self.addresses[self._current]
            return address if address in self._answered else None

    def answered(self, address: str) -> None:
        """``address`` answered a dial: calls go there."""
        with self._lock:
            self._answered.add(address)
            self._passed_over.pop(address, None)
            if address not in self.addresses:
                self.addresses.append(address)
            self._current = self.addresses.index(address)

    def pass_over(self, address: str) -> None:
        """``address`` failed: dial again before using it, others first."""
        with self._lock:
            self._answered.discard(address)
            self._passed_over[address] = time.monotonic() + PASS_OVER_FOR_S

    def candidates(self, unreachable: list[tuple[str, str]]) -> list[str]:
        """Members not found unreachable by this call: those not passed
        over first, the passed-over ones only when nothing else is left."""
        now = time.monotonic()
        failed = {a for a, _ in unreachable}
        with self._lock:
            untried = [a for a in self.addresses if a not in failed]
            fresh = [a for a in untried if self._passed_over.get(a, 0.0) <= now]
        return fresh or untried

    def switch_to(self, leader: str) -> None:
        leader = _address(leader)
        with self._lock:
            if leader not in self.addresses:
                self.addresses.append(leader)
            self._current = self.addresses.index(leader)

    def rotate(self, address: str) -> None:
        with self._lock:
            if self.addresses[self._current] == address:
                self._current = (self._current + 1) % len(self.addresses)

    def next_try(
        self, e: grpc.RpcError, address: str, deadline: float, tried: list[str]
    ) -> float | None:
        """After a call at ``address`` failed with ``e``: the pause before
        trying the next server (the named leader, or the next address,
        already switched to) when the server certainly did nothing; None
        when ``e`` must be raised. Raises :class:`errors.Unavailable` once
        ``deadline`` passed."""
        hint = _leader_hint(e)
        if hint and _address(hint) != address:
            self.switch_to(hint)
        elif hint is not None or _never_connected(e):
            # Nothing was sent: trying again (here, or on the next server)
            # is safe until the deadline. A lone server is tried again too:
            # a restarted one is back before the channel's next reconnect.
            self.rotate(address)
        else:
            return None
        if time.monotonic() >= deadline:
            raise unavailable(e, tried)
        rounds, rest = divmod(len(tried), len(self.addresses))
        return 0.0 if rest else min(0.02 * 2**rounds, 0.5)


def passed_over(
    servers: Servers,
    e: grpc.RpcError,
    address: str,
    unreachable: list[tuple[str, str]],
    read: bool | Callable[[], None],
    deadline: float,
) -> bool:
    """After a call at ``address`` failed with ``e``: True if the call
    goes on with another member at once. So it does when nothing was sent
    (the connection was never made), and for a read whose connection broke
    or timed out (a read may be sent again) until ``deadline``. ``read``
    may instead be a function that marks the request as a repeat (an
    acquire carrying a request id): it is called before the request goes
    again."""
    if _leader_hint(e) is not None:
        return False
    if _never_connected(e):
        servers.pass_over(address)
        unreachable.append((address, e.details() or e.code().name))
        return True
    trouble = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    if read and trouble and time.monotonic() < deadline:
        servers.pass_over(address)
        if callable(read):
            read()
        return True
    return False


def lost_answer(e: grpc.RpcError) -> bool:
    """Whether ``e`` says the request may have reached a server whose
    answer was then lost (not a follower's answer, not a failed dial)."""
    trouble = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return trouble and _leader_hint(e) is None and not _never_connected(e)


def after_lost(first: errors.BatonError | None, e: errors.BatonError) -> errors.BatonError:
    """The error of a call whose earlier attempt's answer (``first``) was
    lost: what that attempt did is unknown, however the repeats failed."""
    if first is None or isinstance(e, errors.Indeterminate):
        return e
    return errors.Indeterminate(
        f"{first}; sent again until the call's time was up, no repeat was answered: {e}"
    )


def repeater(request: Any, sent: float) -> Callable[[], None]:
    """Marks ``request`` (an acquire first sent at ``sent``, carrying a
    request id) as a repeat: the time since its first attempt, and what is
    left of its wait."""
    wait_ms = request.wait_ms

    def mark() -> None:
        since_ms = max(1, int((time.monotonic() - sent) * 1000))
        request.first_sent_ms_ago = since_ms
        request.wait_ms = max(0, wait_ms - since_ms)

    return mark


def none_reachable(unreachable: list[tuple[str, str]]) -> errors.Unavailable:
    """Every member failed to dial: definite, naming each and why."""
    if len(unreachable) == 1:
        address, why = unreachable[0]
        return errors.Unavailable(f"cannot connect to {address}: {why}; nothing was sent")
    reasons = "; ".join(f"{a}: {why}" for a, why in unreachable)
    return errors.Unavailable(f"cannot connect to any server ({reasons}); nothing was sent")


def unavailable(e: grpc.RpcError, tried: list[str]) -> errors.Unavailable:
    details = e.details() or ""
    servers = ", ".join(dict.fromkeys(tried))
    return errors.Unavailable(
        f"no server could serve the call (tried {servers}): {details}; nothing was done"
    )


# -- requests --------------------------------------------------------------


def claims(resources: Any, shared: bool, permits: int | None) -> tuple[list[str], list[Any]]:
    """The canonical names of an acquire's resources (at least one) and
    the wire's shapes: each name held as ``shared`` and ``permits`` say, or
    as the :class:`Shape` paired with it; no shapes when every one is
    exclusive (the request older servers know)."""
    if isinstance(resources, str):
        raise ValueError("resources: a list of names, not one string")
    default = check_shape(shared, permits)
    names: list[str] = []
    held: list[tuple[bool, int]] = []
    for r in resources:
        if isinstance(r, tuple):
            if len(r) != 2 or not isinstance(r[1], Shape):
                raise ValueError(f"resource {r!r}: a name, or a (name, baton.Shape(...)) pair")
            name, shape = r
            names.append(check_resource(name))
            held.append(check_shape(shape.shared, shape.permits))
        else:
            names.append(check_resource(r))
            held.append(default)
    if not names:
        raise ValueError("resources: name at least one")
    if all(not s and not n for s, n in held):
        return names, []
    return names, [pb.LockShape(shared=s, permits=n) for s, n in held]


def session_acquire(
    resources: Any,
    wait_s: float,
    holder: str | None,
    shared: bool = False,
    permits: int | None = None,
) -> tuple[Any, int]:
    """The ``acquire`` of a session request, and how many leases it asks for."""
    names, held = claims(resources, shared, permits)
    acquire = pb.SessionAcquire(
        resources=names,
        wait_ms=millis(wait_s, "wait", zero_ok=True),
        request_id=os.urandom(16),
        shapes=held,
    )
    if holder is not None:
        acquire.holder = holder
    return acquire, len(names)


def acquire_request(
    resources: Any,
    ttl_s: float | None,
    wait_s: float,
    holder: str | None,
    shared: bool = False,
    permits: int | None = None,
) -> tuple[Any, int]:
    """The request of an acquire and how many leases it asks for."""
    names, held = claims(resources, shared, permits)
    # A request id, the same on every attempt: the leader answers a repeat
    # (after a lost answer) with what it granted, never a second lease.
    request = pb.AcquireRequest(
        resources=names,
        wait_ms=millis(wait_s, "wait", zero_ok=True),
        request_id=os.urandom(16),
        shapes=held,
    )
    if ttl_s is not None:
        request.ttl_ms = millis(check_ttl(ttl_s), "ttl")
    if holder is not None:
        request.holder = holder
    return request, len(names)


def check_lease(lease: object) -> Lease:
    """``lease`` as a :class:`Lease`, or :class:`ValueError`."""
    if not isinstance(lease, Lease):
        raise ValueError(f"lease must be a baton.Lease, not {type(lease).__name__}")
    return lease


def renew_request(lease: Lease) -> Any:
    check_lease(lease)
    return pb.RenewRequest(resource=lease.resource, acquisition_id=lease.acquisition_id)


def release_request(lease: Lease) -> Any:
    check_lease(lease)
    return pb.ReleaseRequest(resource=lease.resource, acquisition_id=lease.acquisition_id)


def set_permits_request(resource: str, permits: int) -> Any:
    """An operator's change of a semaphore's number of permits."""
    _, n = check_shape(False, permits)
    return pb.SetPermitsRequest(resource=check_resource(resource, existing=True), permits=n)


def list_request(prefix: str, start_after: str, limit: int) -> Any:
    check_prefix(prefix)
    if not isinstance(start_after, str):
        raise ValueError(f"start_after must be a str, not {type(start_after).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError(f"limit {limit!r}: it must be a whole number")
    if not 1 <= limit <= 1000:
        raise ValueError(f"limit {limit}: it must be between 1 and 1000")
    return pb.ListRequest(prefix=prefix, start_after=start_after, limit=limit)


# -- answers -----------------------------------------------------------------


def expired_on_arrival(leases: list[Lease]) -> errors.NotAcquired | None:
    """The refusal for a grant that came back after its TTL (the caller
    releases it), or None."""
    if not any(lease.is_expired() for lease in leases):
        return None
    return errors.NotAcquired(
        "the grant came back after its TTL, counted from when the request was sent",
        resource=leases[0].resource,
        reason="expired_on_arrival",
    )


def renewed(lease: Lease, r: Any, sent: float) -> Lease:
    """The lease after a renewal sent at ``sent``, or :class:`errors.NotOwner`."""
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
        slot=lease.slot,
    )


def fenced(r: Any) -> Fenced:
    return Fenced(token=r.token, revoked_token=r.revoked_token if r.revoked else None)


def blockers(found: Any) -> tuple[Blocker, ...]:
    """The blockers of a refusal, as the client reports them."""
    return tuple(
        Blocker(
            resource=b.resource,
            readable=b.readable,
            holders=tuple(
                BlockingHolder(
                    token=h.token,
                    holder=h.holder if h.HasField("holder") else None,
                    held_s=h.held_s if h.HasField("held_s") else None,
                    held_since_recovery=h.held_since_recovery,
                    remaining_s=h.remaining_ms / 1000 if h.HasField("remaining_ms") else None,
                    session_bound=h.session_bound,
                )
                for h in b.holders
            ),
            n_holders=b.n_holders,
            n_waiters_ahead=b.n_waiters_ahead,
        )
        for b in found
    )


def granted(response: Any, sent: float, n: int) -> list[Lease]:
    """The leases of an :class:`AcquireResponse`, counted from ``sent``, or
    :class:`errors.NotAcquired`."""
    which = response.WhichOneof("outcome")
    if which == "not_acquired":
        na = response.not_acquired
        reason = pb.NotAcquired.Reason.Name(na.reason).lower()
        found = blockers(na.blockers)
        if found:
            why = "; ".join(b.clause() for b in found)
        else:  # a server before 2026-12-05 names one blocker at most
            held = f" (held by token {na.holder_token})" if na.holder_token else ""
            why = f"{na.resource or 'a resource'}{held}"
        raise errors.NotAcquired(
            f"not acquired ({reason}): {why}",
            resource=na.resource,
            holder_token=na.holder_token or None,
            reason=reason,
            blockers=found,
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
            slot=lease.slot if lease.HasField("slot") else None,
        )
        for lease in response.granted.leases
    ]


def status(s: Any) -> Status:
    return Status(
        resource=s.resource,
        holder_token=s.holder_token if s.held else None,
        remaining_s=s.remaining_ms / 1000,
        ttl_s=s.ttl_ms / 1000,
        n_waiters=s.n_waiters,
        holder=s.holder or None,
        issued_through=s.issued_through or None,
        permits=s.permits or None,
        slots=tuple(
            SlotHolder(
                slot=x.slot,
                token=x.token,
                remaining_s=x.remaining_ms / 1000,
                ttl_s=x.ttl_ms / 1000,
                holder=x.holder or None,
            )
            for x in s.slots
        ),
    )


_KINDS = {1: "granted", 2: "handed_off", 3: "released", 4: "expired", 5: "fenced"}


def holder_of(h: Any) -> Holder:
    """A snapshot entry as a :class:`Holder`."""
    slot = h.slot if h.HasField("slot") else None
    return Holder(h.resource, h.token, h.remaining_ms / 1000, h.n_waiters, h.holder or None, slot)


def change_of(ev: Any) -> Change:
    """A wire event as a :class:`Change`."""
    return Change(
        seq=ev.seq,
        kind=_KINDS.get(ev.kind, "unknown"),
        resource=ev.resource,
        token=ev.token,
        revoked_token=ev.revoked_token or None,
        holder=ev.holder or None,
        slot=ev.slot if ev.HasField("slot") else None,
    )


def request_error(e: Any) -> errors.BatonError:
    """A session answer's error as the exception for it."""
    code = grpc.StatusCode.UNKNOWN
    for c in grpc.StatusCode:
        if c.value[0] == e.code:
            code = c
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(e.message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Exhausted(e.message)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(e.message)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(e.message)
    return errors.Indeterminate(f"{code.name}: {e.message}")
