"""What every kept lease shares, however it is kept (a thread in
:mod:`baton.keeper`, a task in :mod:`baton.aio`): the safe-until rule,
the loss that is never undone, and a session-bound lease's view of its
session. No I/O."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

from baton import errors
from baton._types import Lease

Clock = Callable[[], float]


def margin_s(ttl_s: float) -> float:
    """The default safety margin: 5% of the TTL, at least 10 ms."""
    return max(ttl_s / 20, 0.010)


def safe_until(sent: float, granted_s: float, margin: float) -> float:
    """Where a grant or renewal sent at ``sent`` (monotonic seconds) that
    the server granted ``granted_s`` from its arrival stops being certain."""
    return sent + granted_s - margin


class Kept:
    """What a worker asks of a kept lease, however it is kept."""

    lost: threading.Event
    loss_reason: str | None
    _lock: threading.Lock

    @property
    def lease(self) -> Lease:
        raise NotImplementedError

    @property
    def safe_until(self) -> float:
        """Monotonic seconds (``time.monotonic()``) until which the lease
        is certainly held, or was when last acknowledged."""
        raise NotImplementedError

    def _now(self) -> float:
        return time.monotonic()

    def _uncertain(self) -> str | None:
        """Why ownership is no longer certain now, if it is not."""
        if self._now() >= self.safe_until:
            return "no renewal was acknowledged before the lease's safe-until"
        return None

    @property
    def token(self) -> int:
        """The fencing token: carry it into every protected write."""
        return self.lease.token

    @property
    def resource(self) -> str:
        return self.lease.resource

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.loss_reason is None:
                self.loss_reason = why
        self.lost.set()

    def is_owner(self) -> bool:
        """True while ownership is certain; False forever once it was not."""
        if self.lost.is_set():
            return False
        why = self._uncertain()
        if why is not None:
            self._lose(why)
            return False
        return True

    def check(self) -> None:
        """Raises :class:`errors.OwnershipLost` unless ownership is certain
        now. Once it raised, it always raises."""
        if not self.is_owner():
            raise errors.OwnershipLost(
                f"{self.resource} (token {self.token}): {self.loss_reason}; stop the work"
            )


class SessionLike(Protocol):
    """What a :class:`SessionKeeper` reads of its session (the threaded
    one here, or :class:`baton.aio.Session`)."""

    ended: Any
    ttl_s: float

    @property
    def safe_until(self) -> float: ...

    def why(self) -> str: ...

    def revoked_token(self, resource: str) -> int | None: ...


class SessionKept(Kept):
    """A lease tied to a session: held while the session is, so its
    safe-until is the session's (the last acknowledged heartbeat's send
    time plus the TTL, minus the margin). It is lost when that passes,
    when the session ends, or when a heartbeat reports the lease fenced.
    What sets :attr:`lost` on time (a thread, a task) is the subclass's."""

    def __init__(self, session: SessionLike, lease: Lease) -> None:
        self._session: SessionLike = session
        self._lease = lease
        self._lock = threading.Lock()
        self.loss_reason = None

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def safe_until(self) -> float:
        if self._lease.session_bound:
            return self._session.safe_until
        return min(self._session.safe_until, self._lease.valid_until - margin_s(self._lease.ttl_s))

    def _uncertain(self) -> str | None:
        revoked = self._session.revoked_token(self._lease.resource)
        if revoked == self._lease.token:
            return "a heartbeat reported the lease revoked (fenced)"
        if self._session.ended.is_set():
            return f"the session ended ({self._session.why()})"
        if self._now() >= self.safe_until:
            return "no heartbeat was acknowledged before the session's safe-until"
        return None
