"""The values both clients (sync and asyncio) return: leases, statuses,
fences, and what a watch or an election reports. Plain data, no I/O."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union


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
    #: A shared holder's or a permit's slot (the lowest free one when it was
    #: granted; a permit's is below the semaphore's N): a slot's tokens only
    #: rise, so a permit's writes are fenced by slot. None when exclusive.
    slot: int | None = None

    def valid_for(self) -> float:
        """Seconds left until :attr:`valid_until` (0 once passed)."""
        return max(0.0, self.valid_until - time.monotonic())

    def is_expired(self) -> bool:
        return time.monotonic() >= self.valid_until


@dataclass(frozen=True)
class Shape:
    """How one resource of an ``acquire_all`` is held, beside the others:
    ``("report", Shape(shared=True))``, ``("builders", Shape(permits=3))``;
    a plain name takes the call's ``shared`` and ``permits``. Checked when
    the request is built (:class:`ValueError` naming the rule)."""

    shared: bool = False
    permits: int | None = None


#: A resource of ``acquire_all``: a name, or a name and its :class:`Shape`.
Claim = Union[str, tuple[str, Shape]]


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
    #: A semaphore's number of permits while it has holders or waiters
    #: (None: a lock, or free).
    permits: int | None = None
    #: Its shared holders or permits, by slot (``holder_token`` and the
    #: fields after it describe an exclusive holder only).
    slots: tuple[SlotHolder, ...] = ()


@dataclass(frozen=True)
class SlotHolder:
    """A shared holder or a permit, as status reports it."""

    slot: int
    token: int
    remaining_s: float
    ttl_s: float
    holder: str | None


@dataclass(frozen=True)
class BlockingHolder:
    """A holder of a resource that blocked an acquire."""

    token: int
    #: Its description, if it gave one (and the caller may read it).
    holder: str | None
    #: Whole seconds it has held the resource: since its grant, or, when
    #: ``held_since_recovery``, since the server restart or leader takeover
    #: that loaded it (it was granted earlier). ``None`` when not readable.
    held_s: int | None
    held_since_recovery: bool
    #: Its TTL left; ``None`` when tied to a session (``session_bound``) or
    #: not readable.
    remaining_s: float | None
    session_bound: bool

    def clause(self) -> str:
        """``token=T holder="D" for=12s remaining=3000ms``, as the CLI says it."""
        out = f"token={self.token}"
        if self.holder is not None:
            out += f' holder="{self.holder}"'
        if self.held_s is not None:
            out += f" for{'>' if self.held_since_recovery else ''}={self.held_s}s"
        if self.remaining_s is not None:
            out += f" remaining={round(self.remaining_s * 1000)}ms"
        elif self.session_bound:
            out += " remaining=session"
        return out


@dataclass(frozen=True)
class Blocker:
    """A requested resource that stood in the way of an acquire."""

    resource: str
    #: False when the caller may not ``read`` it: its holders give their
    #: tokens only (and the counts are given).
    readable: bool
    #: Its holders (an exclusive lock has at most one), at most 16.
    holders: tuple[BlockingHolder, ...]
    n_holders: int
    #: Requests waiting ahead of this one (for a try-once request, all).
    n_waiters_ahead: int

    def clause(self) -> str:
        """``NAME held token=... waiters_ahead=N``, as the CLI says it."""
        out = self.resource
        if self.holders:
            out += " held " + ", ".join(h.clause() for h in self.holders)
            more = self.n_holders - len(self.holders)
            if more > 0:
                out += f" (and {more} more)"
        return f"{out} waiters_ahead={self.n_waiters_ahead}"


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
    #: A shared holder's or a permit's slot (None: an exclusive holder).
    slot: int | None = None


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
    #: The slot of the shared holder or permit it concerns (None: exclusive).
    slot: int | None = None


@dataclass(frozen=True)
class Resnapshot:
    """A watch resumed after the server had dropped the changes since the
    last one it yielded (it was away longer than the server keeps them):
    these are the holders now, at ``seq``; what changed in between is not
    told."""

    seq: int
    holders: tuple[Holder, ...]


@dataclass(frozen=True)
class Leader:
    """The leader as others see it."""

    token: int
    value: str | None


def leader_in(name: str, holders: Iterable[Holder]) -> Leader | None:
    """The leader of the election ``name`` among a snapshot's holders."""
    now = next((h for h in holders if h.resource == name), None)
    return Leader(now.token, now.holder) if now else None
