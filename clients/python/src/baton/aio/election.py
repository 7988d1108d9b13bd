"""The asyncio election: one lease whose holder is the leader."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from baton import errors
from baton._types import Change, Leader, Resnapshot, leader_in
from baton.aio.keeper import SessionKeeper
from baton.rules import check_resource

if TYPE_CHECKING:
    from baton.aio.client import Client


class Election:
    """The asyncio twin of :class:`baton.watch.Election`."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = check_resource(name)

    async def campaign(
        self, value: str, ttl_s: float | None = None, wait_s: float = 60
    ) -> SessionKeeper | None:
        """Waits in line on a new session whose holder is ``value`` until
        this candidate leads (the kept leadership; leaving its ``async
        with`` block releases it) or ``wait_s`` runs out (None)."""
        session = await self._client.with_holder(value).open_session(ttl_s)
        try:
            lease = await session.acquire(self.name, wait_s)
        except errors.NotAcquired:
            await session.close()
            return None
        except BaseException:
            with contextlib.suppress(errors.BatonError):
                await session.close()
            raise
        return SessionKeeper(session, lease)

    async def leader(self) -> Leader | None:
        st = await self._client.status(self.name)
        return None if st.holder_token is None else Leader(st.holder_token, st.holder)

    async def observe(
        self, once: bool = False
    ) -> AsyncGenerator[tuple[Change | None, Leader | None], None]:
        """The leader now, then each change of leader, resumed across
        restarts and failovers (see the sync twin)."""
        w = await self._client.watch(self.name, once=once)
        try:
            leader = leader_in(self.name, w.holders)
            yield None, leader
            async for change in w:
                if isinstance(change, Resnapshot):
                    now = leader_in(self.name, change.holders)
                    if now != leader:
                        leader = now
                        yield None, leader
                    continue
                if change.resource != self.name:
                    continue
                new = change.kind in ("granted", "handed_off")
                leader = Leader(change.token, change.holder) if new else None
                yield change, leader
        finally:
            w.close()
