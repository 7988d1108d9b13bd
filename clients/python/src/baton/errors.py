"""Errors, split as the Rust client splits them: a *definite* error means
the request certainly did not take effect; :class:`Indeterminate` means it
may have (a timeout or a broken connection after it was sent) and must not
be blindly repeated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton._types import Blocker


class BatonError(Exception):
    """Every error this package raises (besides :class:`ValueError` for
    input refused before anything is sent)."""

    #: True when the request certainly did not take effect.
    definite: bool = True


class Indeterminate(BatonError):
    """The request may have taken effect: no answer came in time, or the
    connection broke after it was sent. Never repeated by the client."""

    definite = False


class Unavailable(BatonError):
    """No server could be reached, or none leads: nothing was sent or done."""


class InvalidArgument(BatonError, ValueError):
    """The server refused the input; the message names its rule."""


class Exhausted(BatonError):
    """A server limit or a quota was reached (waiters, sessions,
    connections, a tenant's quota: the message names it). Nothing was
    applied; retry later."""


class Unauthenticated(BatonError):
    """No credential, or one the server does not know."""


class PermissionDenied(BatonError):
    """The principal's rules do not allow this action on this name."""


class NotAcquired(BatonError):
    """The lease was not granted: held by another (``holder_token``), the
    wait ran out, or the grant came back after its TTL had passed."""

    def __init__(
        self,
        message: str,
        *,
        resource: str = "",
        holder_token: int | None = None,
        reason: str = "held",
        blockers: tuple[Blocker, ...] = (),
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.holder_token = holder_token
        #: Every requested resource that was held or had requests waiting
        #: ahead, in request order (empty from servers before 2026-12-05).
        self.blockers = blockers
        #: ``held``, ``timed_out``, ``cancelled``, ``expired_on_arrival`` or
        #: ``ended`` (the answer to the first attempt was lost, and the
        #: request sent again found its lease already ended: nothing is held).
        self.reason = reason


class NotOwner(BatonError):
    """The lease is no longer this holder's (expired, released, fenced or
    replaced): nothing was extended or recreated."""


class OwnershipLost(BatonError):
    """A keeper no longer vouches for its lease: its safe-until passed, or
    the lease was fenced or lost. Stop the work; the token may be stale."""


class SessionEnded(BatonError):
    """The session is over (expired, closed, or its safe-until passed
    without a resume): every lease tied to it has ended."""


class WatchEnded(BatonError):
    """The server ended the watch (a restart, a leadership change, a
    shutdown) and it was not resumed (``once=True``): resume with
    ``after_seq``, or watch again from a new snapshot."""


class WatchTooOld(BatonError):
    """A watch asked to resume after a number older than the changes the
    server keeps: watch again from a new snapshot (a watch resuming by
    itself does so). Nothing was streamed."""

    def __init__(self, message: str, oldest_seq: int) -> None:
        super().__init__(message)
        #: The oldest number the server resumes a watch from.
        self.oldest_seq = oldest_seq
