"""Watch and elections from Python against a real server."""

from __future__ import annotations

import threading
import time

import pytest

import baton
from baton.keeper import SessionKeeper
from baton.watch import Change, Leader, Resnapshot, WatchEnded

from .conftest import Server


def test_a_watch_gives_the_snapshot_then_every_change_with_holders(server: Server) -> None:
    c = baton.Client(server.address, holder="watched")
    kept = c.acquire("py:w:kept", ttl_s=30)
    c.acquire("py:other", ttl_s=30)
    with c.watch("py:w:") as w:
        assert [(h.resource, h.token, h.holder) for h in w.holders] == [
            ("py:w:kept", kept.token, "watched")
        ]
        lease = c.with_holder("second").acquire("py:w:a", ttl_s=30)
        c.acquire("py:not-watched", ttl_s=30)
        c.release(lease)
        fenced = c.fence("py:w:kept")
        changes = [change_of(next(w)) for _ in range(3)]
    assert [(x.kind, x.resource, x.holder) for x in changes] == [
        ("granted", "py:w:a", "second"),
        ("released", "py:w:a", "second"),
        ("fenced", "py:w:kept", "watched"),
    ]
    assert changes[2].token == fenced.token and changes[2].revoked_token == kept.token
    assert all(b.seq > a.seq for a, b in zip(changes, changes[1:]))
    assert changes[0].seq > w.seq


def change_of(update: Change | Resnapshot) -> Change:
    assert isinstance(update, Change), update
    return update


def test_a_watch_once_ends_at_a_restart(server: Server) -> None:
    c = baton.Client(server.address)
    w = c.watch("py:", once=True)
    server.restart()
    with pytest.raises(WatchEnded):
        next(w)


def test_an_election_hands_over_to_the_next_candidate_with_a_higher_token(
    server: Server,
) -> None:
    c = baton.Client(server.address)
    election = c.election("py:leader")
    observed: list[tuple[Change | None, Leader | None]] = []
    observer = election.observe()
    observed.append(next(observer))
    first = election.campaign("candidate-1", ttl_s=2, wait_s=5)
    assert isinstance(first, SessionKeeper)
    assert election.leader() == Leader(first.token, "candidate-1")
    second: list[SessionKeeper | None] = []
    t = threading.Thread(
        target=lambda: second.append(election.campaign("candidate-2", ttl_s=2, wait_s=10))
    )
    t.start()
    observed.append(next(observer))
    deadline = time.monotonic() + 5
    while c.status("py:leader").n_waiters == 0:
        assert time.monotonic() < deadline, "the second candidate never queued"
        time.sleep(0.01)
    # The first leader resigns: its session closes and the next leads.
    first.session.close()
    t.join(10)
    leader2 = second[0]
    assert leader2 is not None and leader2.token > first.token
    leader2.check()
    observed.append(next(observer))
    observed.append(next(observer))
    assert [(ch.kind if ch else None, ld) for ch, ld in observed] == [
        (None, None),
        ("granted", Leader(first.token, "candidate-1")),
        ("released", None),
        ("handed_off", Leader(leader2.token, "candidate-2")),
    ]
    with leader2:
        pass  # leaving the block resigns
    assert election.leader() is None
    assert election.campaign("late", ttl_s=2, wait_s=0.1) is not None
