"""Baton's Python client: leases with fencing tokens, a keeper as strict as
the Rust one, and the fence kit over psycopg (``baton.fence``).

    import baton

    client = baton.Client("127.0.0.1:7700")
    with client.lease("statement:account-42:2026-09-13", ttl_s=30) as kept:
        kept.check()                       # OwnershipLost once uncertain
        publish(..., token=kept.token)     # the resource checks the token
"""

from baton._types import Blocker, BlockingHolder, Claim, Resnapshot, Shape, SlotHolder
from baton.client import Client, Fenced, Lease, Status
from baton.errors import (
    BatonError,
    Exhausted,
    Indeterminate,
    InvalidArgument,
    NotAcquired,
    NotOwner,
    OwnershipLost,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    WatchEnded,
    WatchTooOld,
)
from baton.keeper import Keeper

__all__ = [
    "BatonError",
    "Blocker",
    "BlockingHolder",
    "Claim",
    "Client",
    "Exhausted",
    "Fenced",
    "Indeterminate",
    "InvalidArgument",
    "Keeper",
    "Lease",
    "NotAcquired",
    "NotOwner",
    "OwnershipLost",
    "PermissionDenied",
    "Resnapshot",
    "Shape",
    "SlotHolder",
    "Status",
    "Unauthenticated",
    "Unavailable",
    "WatchEnded",
    "WatchTooOld",
]
