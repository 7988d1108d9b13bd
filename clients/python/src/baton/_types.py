"""The values both clients (sync and asyncio) return: leases, statuses,
fences, and what a watch or an election reports. Plain data, no I/O."""

from __future__ import annotations

import time
from dataclasses import dataclass


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
    #: The last token the server issued, to any resource, when it answered:
    #: every later grant gets a higher one (``None`` from an older server).
    issued_through: int | None = None


@dataclass(frozen=True)
class Fenced:
    """What an operator fence did."""

    token: int
    revoked_token: int | None


@dataclass(frozen=True)
class Holder:
    """A holder in a watch's snapshot."""

    resource: str
    token: int
    remaining_s: float
    n_waiters: int
    holder: str | None


@dataclass(frozen=True)
class Change:
    """One change of holder."""

    seq: int
    #: ``granted``, ``handed_off``, ``released``, ``expired`` or ``fenced``.
    kind: str
    resource: str
    #: The lease's token; for a fence, the fence's own.
    token: int
    #: For a fence: the revoked lease's token, if one was held.
    revoked_token: int | None
    #: The new holder's description (a grant), or the one that lost it.
    holder: str | None


@dataclass(frozen=True)
class Leader:
    """The leader as others see it."""

    token: int
    value: str | None
