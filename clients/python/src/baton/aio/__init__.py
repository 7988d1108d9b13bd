"""The asyncio twin of :mod:`baton.client`, on ``grpc.aio``: the same
names, the same rules (leader following, nothing that may have taken
effect is repeated, the keeper's safe-until from the last acknowledged
send time), awaited.

    from baton import aio

    async def main() -> None:
        async with aio.Client("127.0.0.1:7700") as client:
            async with client.lease("statement:42", ttl_s=30) as kept:
                kept.check()
                await publish(..., token=kept.token)
"""

from __future__ import annotations

from baton._types import Fenced, Leader, Lease, Status
from baton.aio.client import Client
from baton.aio.election import Election
from baton.aio.keeper import Keeper, SessionKeeper
from baton.aio.session import Session
from baton.aio.watch import Watch
from baton.errors import SessionEnded

__all__ = [
    "Client",
    "Election",
    "Fenced",
    "Keeper",
    "Leader",
    "Lease",
    "Session",
    "SessionEnded",
    "SessionKeeper",
    "Status",
    "Watch",
]
