"""What a session knows about itself, whichever client drives its stream
(threads in :mod:`baton.session`, tasks in :mod:`baton.aio`). No I/O."""

from __future__ import annotations

import itertools
from typing import Any

from baton import errors
from baton._kept import margin_s
from baton._proto import baton_pb2 as pb
from baton._wire import request_error

#: Ids of the session's own heartbeats; callers' ids count up from 1.
HEARTBEAT_ID_BIT = 1 << 63


class Ledger:
    """What a session knows about itself, whichever client drives its
    stream (threads here, tasks in :mod:`baton.aio`): its safe-until,
    the heartbeats in flight, the leases reported revoked. No I/O; the
    caller serializes access."""

    def __init__(self, opened: Any, sent: float) -> None:
        self.id: bytes = bytes(opened.session_id)
        self.ttl_s: float = float(opened.ttl_ms) / 1000
        self.margin_s = margin_s(self.ttl_s)
        self.safe_until: float = sent + self.ttl_s - self.margin_s
        self.heartbeats: dict[int, float] = {}
        self.revoked: dict[str, int] = {}
        #: The server takes several requests in one message.
        self.batches: bool = bool(opened.batches)
        self._heartbeat_ids = itertools.count(HEARTBEAT_ID_BIT)
        self.note_revoked(opened.revoked)

    def heartbeat(self, at: float) -> Any:
        """The next heartbeat request, sent at ``at``."""
        hid = next(self._heartbeat_ids)
        self.heartbeats[hid] = at
        return pb.SessionRequest(id=hid, heartbeat=pb.Heartbeat())

    def note_revoked(self, revoked: Any) -> None:
        for r in revoked:
            self.revoked[r.resource] = r.token

    def read(self, response: Any) -> tuple[int | None, Any, errors.BatonError | None, bool]:
        """Applies an answer: the id of the caller's request it answers
        (None for a heartbeat's), its body or error, and whether the
        server said the session is over."""
        which = response.WhichOneof("body")
        ended = which == "ended"
        if response.id >= HEARTBEAT_ID_BIT:
            sent = self.heartbeats.pop(response.id, None)
            if which == "heartbeat" and sent is not None:
                ack = response.heartbeat
                self.safe_until = max(
                    self.safe_until, sent + ack.remaining_ms / 1000 - self.margin_s
                )
                self.note_revoked(ack.revoked)
            return None, None, None, ended
        if which == "error":
            return response.id, None, request_error(response.error), False
        if ended:
            return response.id, None, errors.SessionEnded(ENDED), True
        return response.id, getattr(response, which), None, False


ENDED = "the session is not open (it expired or was closed)"
