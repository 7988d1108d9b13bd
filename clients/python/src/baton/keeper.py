"""The keeper: holds one lease on a background thread, as strictly as the
Rust keeper.

Its *safe-until* is where ownership stops being certain, on this
process's ``time.monotonic()`` clock: the send time of the last
acknowledged grant or renewal, plus the time the server granted from
then, minus a safety margin (5% of the TTL, at least 10 ms) for clock-rate
differences. The server cannot expire the lease before it, whatever the
network does, because the server received the request no earlier than it
was sent. The keeper gives the lease up at its safe-until on its own
clock whether or not the server answers, and once lost, it never vouches
for the lease again.

    with client.lease("statement:42", ttl_s=30) as kept:
        for chunk in work:
            kept.check()                # raises OwnershipLost once uncertain
            write(chunk, kept.token)    # and the resource checks the token
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

from baton import errors
from baton._kept import Clock, Kept, SessionKept, SessionLike, margin_s, safe_until
from baton._types import Lease

if TYPE_CHECKING:
    from baton.client import Client
    from baton.session import Session

__all__ = [
    "Clock",
    "Keeper",
    "Kept",
    "SessionKeeper",
    "SessionLike",
    "margin_s",
    "safe_until",
]


class Keeper(Kept):
    """Keeps one lease with its own TTL by unary renewals on a thread,
    until :meth:`stop` (or the ``with`` block's end, which also releases
    it). See the module docs."""

    def __init__(
        self,
        client: Client,
        lease: Lease,
        *,
        renew_interval_s: float | None = None,
        safety_margin_s: float | None = None,
        clock: Clock = time.monotonic,
        start: bool = True,
    ) -> None:
        self._client = client
        self._lease = lease
        self._clock = clock
        self._interval = renew_interval_s if renew_interval_s is not None else lease.ttl_s / 3
        self._margin = safety_margin_s if safety_margin_s is not None else margin_s(lease.ttl_s)
        self._safe_until = lease.valid_until - self._margin
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Set once ownership is lost or uncertain (fenced, not owner, or
        #: the safe-until passed without an acknowledged renewal).
        self.lost = threading.Event()
        self.loss_reason: str | None = None
        self._thread: threading.Thread | None = None
        if self._clock() >= self._safe_until:
            self._lose("the lease was already past its safe-until when it was granted")
        elif start:
            self._thread = threading.Thread(
                target=self._run, name=f"baton-keeper {lease.resource}", daemon=True
            )
            self._thread.start()

    @classmethod
    def acquire(
        cls,
        client: Client,
        resource: str,
        ttl_s: float | None = None,
        wait_s: float = 0,
        **options: float,
    ) -> Keeper:
        """Acquires ``resource`` and keeps it."""
        lease = client.acquire(resource, ttl_s, wait_s)
        return cls(client, lease, **options)  # type: ignore[arg-type]

    # -- what the worker asks ---------------------------------------------

    @property
    def lease(self) -> Lease:
        with self._lock:
            return self._lease

    @property
    def safe_until(self) -> float:
        with self._lock:
            return self._safe_until

    def _now(self) -> float:
        return self._clock()

    # -- the background thread --------------------------------------------

    def _run(self) -> None:
        next_renew = self._clock() + self._interval
        while not self._stop.is_set() and not self.lost.is_set():
            now = self._clock()
            wake = min(next_renew, self.safe_until)
            if self._stop.wait(max(0.0, wake - now)):
                return
            if not self.is_owner():
                return
            if self._clock() < next_renew:
                continue
            self.renew_once()
            next_renew = self._clock() + self._interval

    def renew_once(self) -> None:
        """One renewal, bounded by the safe-until; moves the safe-until on
        success, loses the lease on a definite refusal, and keeps the old
        safe-until when the outcome is unknown (a later renewal may yet
        succeed before it passes)."""
        lease = self.lease
        budget = self.safe_until - self._clock()
        if budget <= 0:
            self.is_owner()
            return
        try:
            renewed = self._client.renew(lease, timeout_s=min(budget, self._client.timeout_s))
        except errors.NotOwner as e:
            self._lose(f"the server no longer knows this lease as ours ({e})")
            return
        except errors.BatonError:
            # Unknown outcome or server unreachable: nothing is learned.
            return
        with self._lock:
            self._lease = renewed
            # valid_until counts from the renewal's send time (see Lease).
            self._safe_until = max(self._safe_until, renewed.valid_until - self._margin)

    def stop(self) -> Lease:
        """Stops renewing (the lease then runs out at its TTL)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        return self.lease

    def __enter__(self) -> Keeper:
        return self

    def __exit__(self, *exc: object) -> None:
        lease = self.stop()
        if not self.lost.is_set():
            # If the release fails, the lease runs out at its TTL.
            with contextlib.suppress(errors.BatonError):
                self._client.release(lease)


class SessionKeeper(SessionKept):
    """Follows one lease tied to a session (see :class:`SessionKept` for
    when it is lost). A thread sets :attr:`lost` when that happens; the
    ``with`` block's end releases the lease (the session lives on)."""

    def __init__(self, session: Session, lease: Lease, start: bool = True) -> None:
        super().__init__(session, lease)
        self._held_by = session
        self._stop = threading.Event()
        self.lost = threading.Event()
        if start:
            threading.Thread(
                target=self._watch, name=f"baton-kept {lease.resource}", daemon=True
            ).start()

    @property
    def session(self) -> Session:
        """The session the lease is tied to."""
        return self._held_by

    def _watch(self) -> None:
        while not self._stop.is_set() and self.is_owner():
            left = self.safe_until - self._now()
            self._session.ended.wait(max(0.0, min(left, self._session.ttl_s / 6)))

    def stop(self) -> Lease:
        """Stops following the lease (it stays held while the session is)."""
        self._stop.set()
        return self._lease

    def __enter__(self) -> SessionKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        lease = self.stop()
        if not self.lost.is_set():
            with contextlib.suppress(errors.BatonError):
                self.session.release(lease)
