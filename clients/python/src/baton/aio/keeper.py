"""The asyncio keepers: a task renews a lease of its own, or follows a
lease tied to a session."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from baton import errors
from baton._kept import Kept, SessionKept, margin_s
from baton._types import Lease
from baton.aio.session import Session

if TYPE_CHECKING:
    from baton.aio.client import Client


class Keeper(Kept):
    """The asyncio keeper: a task renews the lease every TTL/3; the
    safe-until is the last acknowledged renewal's send time plus the time
    granted, minus 5% (at least 10 ms). :meth:`check` raises
    :class:`errors.OwnershipLost` once ownership is uncertain, and always
    after; :attr:`lost` is set then."""

    def __init__(
        self,
        client: Client,
        resource: str,
        ttl_s: float | None,
        wait_s: float,
        renew_interval_s: float | None = None,
        safety_margin_s: float | None = None,
    ) -> None:
        self._client = client
        self._request = (resource, ttl_s, wait_s)
        self._interval = renew_interval_s
        self._margin = safety_margin_s
        self._lock = threading.Lock()
        self.lost: asyncio.Event = asyncio.Event()  # type: ignore[assignment]
        self.loss_reason = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Keeper:
        resource, ttl_s, wait_s = self._request
        self._lease = await self._client.acquire(resource, ttl_s, wait_s)
        if self._interval is None:
            self._interval = self._lease.ttl_s / 3
        if self._margin is None:
            self._margin = margin_s(self._lease.ttl_s)
        self._safe_until = self._lease.valid_until - self._margin
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.lost.is_set():
            with contextlib.suppress(errors.BatonError):
                await self._client.release(self._lease)

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def safe_until(self) -> float:
        return self._safe_until

    async def _run(self) -> None:
        assert self._interval is not None and self._margin is not None
        next_renew = time.monotonic() + self._interval
        while self.is_owner():
            await asyncio.sleep(max(0.0, min(next_renew, self._safe_until) - time.monotonic()))
            if not self.is_owner():
                return
            if time.monotonic() < next_renew:
                continue
            budget = self._safe_until - time.monotonic()
            try:
                renewed = await self._client.renew(
                    self._lease, timeout_s=min(budget, self._client.timeout_s)
                )
            except errors.NotOwner as e:
                self._lose(f"the server no longer knows this lease as ours ({e})")
                return
            except errors.BatonError:
                pass  # unknown outcome: nothing learned
            else:
                self._lease = renewed
                self._safe_until = max(self._safe_until, renewed.valid_until - self._margin)
            next_renew = time.monotonic() + self._interval


class SessionKeeper(SessionKept):
    """:class:`baton.keeper.SessionKeeper` for an asyncio session: a task,
    not a thread, sets :attr:`lost` on time."""

    def __init__(self, session: Session, lease: Lease) -> None:
        super().__init__(session, lease)
        self._held_by = session
        self.lost: asyncio.Event = asyncio.Event()  # type: ignore[assignment]
        self._task = asyncio.ensure_future(self._follow())

    @property
    def session(self) -> Session:
        """The session the lease is tied to."""
        return self._held_by

    async def _follow(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while self.is_owner():
                left = self.safe_until - self._now()
                await asyncio.sleep(max(0.0, min(left, self.session.ttl_s / 6)))

    async def __aenter__(self) -> SessionKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        if not self.lost.is_set():
            with contextlib.suppress(errors.BatonError):
                await self.session.release(self.lease)


class SessionLease:
    """What ``client.lease()`` returns: acquired on entering."""

    def __init__(self, client: Client, resource: str, ttl_s: float | None, wait_s: float) -> None:
        self._args = (client, resource, ttl_s, wait_s)

    async def __aenter__(self) -> SessionKeeper:
        client, resource, ttl_s, wait_s = self._args
        session = await client.session(ttl_s)
        self._kept = SessionKeeper(session, await session.acquire(resource, wait_s))
        return self._kept

    async def __aexit__(self, *exc: object) -> None:
        await self._kept.__aexit__(*exc)
