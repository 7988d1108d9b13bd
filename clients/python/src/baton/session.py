"""Sessions: one stream, one heartbeat, many leases.

A :class:`Session` owns one ``Session`` stream to the leader. It sends a
heartbeat every TTL/3 and keeps the session's *safe-until*: the
send time of the last acknowledged heartbeat, plus the TTL, minus a margin
(5%, at least 10 ms), on ``time.monotonic()``. The server extended the
session when it received that heartbeat, which was no earlier, so the
safe-until is never later than the server could end the session.

When the stream breaks, requests in flight fail as
:class:`errors.Indeterminate` and the session is resumed (on the leader,
following redirects) while its safe-until lasts; its leases are untouched
while the session lives. When the server answers that the session ended,
or the safe-until passes before a resume succeeds, the session is over:
every later call raises :class:`SessionEnded`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from baton import aio, errors
from baton._ledger import ENDED, HEARTBEAT_ID_BIT, Ledger
from baton._types import Claim, Lease
from baton.errors import SessionEnded

if TYPE_CHECKING:
    from baton.client import Client

__all__ = ["ENDED", "HEARTBEAT_ID_BIT", "Ledger", "Session", "SessionEnded"]

T = TypeVar("T")


class _Loop:
    """The process's one background event loop, on a daemon thread, that
    runs every synchronous session's stream (``grpc.aio``): one thread for
    all of them, and two thread hand-offs per request."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="baton-sessions", daemon=True
                ).start()
                cls._loop = loop
            return cls._loop


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on the sessions' loop and waits for it. If the caller
    is interrupted, the coroutine is cancelled (a waiting acquire is
    withdrawn) before the interruption goes on."""
    future = asyncio.run_coroutine_threadsafe(coro, _Loop.get())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


class Session:
    """A session: one stream, a heartbeat every TTL/3, the safe-until, and
    a resume while it lasts (see the module docs). Open one with
    :meth:`Client.open_session`; use it from any thread. It runs on
    :mod:`baton.aio`'s session, on one background event loop shared by the
    process's sessions."""

    def __init__(self, client: Client, ttl_s: float | None = None) -> None:
        self._client = client
        self._s = _run(aio.Session.open(client._aio_twin(), ttl_s))
        self.id = self._s.id
        self.ttl_s = self._s.ttl_s
        #: Set once the session is over.
        self.ended = threading.Event()
        asyncio.run_coroutine_threadsafe(self._mirror_end(), _Loop.get())

    async def _mirror_end(self) -> None:
        await self._s.ended.wait()
        self.ended.set()

    @property
    def resumes(self) -> int:
        """How many times the stream broke and the session was resumed."""
        return self._s.resumes

    @property
    def safe_until(self) -> float:
        """Monotonic seconds until which the session, and every lease tied
        to it, is certainly held (as of the last acknowledged heartbeat)."""
        return self._s.safe_until

    def why(self) -> str:
        """Why the session ended (once it did)."""
        return self._s.why()

    def is_live(self) -> bool:
        return not self.ended.is_set() and time.monotonic() < self.safe_until

    def revoked_token(self, resource: str) -> int | None:
        """The token of this session's lease on ``resource`` that a fence
        revoked, as a heartbeat reported it."""
        return self._s.revoked_token(resource)

    def acquire(
        self,
        resource: str,
        wait_s: float = 0,
        cancel: threading.Event | None = None,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> Lease:
        """Acquires ``resource`` tied to this session (it lives while the
        session does); :class:`errors.NotAcquired` if it is held, the wait
        ran out, or ``cancel`` was set while it waited (reason
        ``cancelled``; a grant that raced with the cancel is given back).
        ``shared`` or ``permits`` as in :meth:`baton.Client.acquire`."""
        return self.acquire_all([resource], wait_s, cancel, shared=shared, permits=permits)[0]

    def acquire_all(
        self,
        resources: Sequence[Claim],
        wait_s: float = 0,
        cancel: threading.Event | None = None,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> list[Lease]:
        """Acquires every resource or none, tied to this session."""
        if cancel is None or wait_s == 0:
            return _run(self._s.acquire_all(resources, wait_s, shared=shared, permits=permits))
        loop = _Loop.get()
        # Made on the loop (Python 3.9's asyncio.Event binds where it is made).
        box: list[asyncio.Event] = []

        def withdraw() -> None:
            if box:
                box[0].set()

        async def cancellable() -> list[Lease]:
            box.append(asyncio.Event())
            asked = asyncio.ensure_future(box[0].wait())
            task = asyncio.ensure_future(
                self._s.acquire_all(resources, wait_s, shared=shared, permits=permits)
            )
            await asyncio.wait({task, asked}, return_when=asyncio.FIRST_COMPLETED)
            asked.cancel()
            if not task.done():
                # Withdrawn on the server (and a grant that came first
                # given back) before this returns.
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise errors.NotAcquired("not acquired: the wait was cancelled", reason="cancelled")
            return task.result()

        future = asyncio.run_coroutine_threadsafe(cancellable(), loop)
        try:
            while True:
                try:
                    return future.result(timeout=0.02)
                except concurrent.futures.TimeoutError:
                    if cancel.is_set():
                        loop.call_soon_threadsafe(withdraw)
        except BaseException:
            # Interrupted (KeyboardInterrupt): withdraw the wait too.
            loop.call_soon_threadsafe(withdraw)
            raise

    def release(self, lease: Lease) -> bool:
        """Gives a lease back; False if it was not held."""
        return _run(self._s.release(lease))

    def close(self) -> bool:
        """Ends the session: its leases are released and its waiters
        withdrawn. False if it had already ended."""
        try:
            return _run(self._s.close())
        finally:
            self.ended.set()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(errors.BatonError):
            self.close()
