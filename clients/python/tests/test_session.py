"""Sessions against a real server: leases tied to one heartbeat, waiting
on the stream, a resume after the server restarts, and the end of a
session seen by its keepers."""

from __future__ import annotations

import threading
import time

import pytest

import baton
from baton import errors
from baton.session import SessionEnded

from .conftest import Server


def test_leases_tied_to_a_session_live_and_end_with_it(server: Server) -> None:
    c = baton.Client(server.address, holder="py session")
    s = c.open_session(ttl_s=2)
    a, b = s.acquire_all(["py:s:a", "py:s:b"])
    assert a.session_bound and b.session_bound
    st = c.status("py:s:a")
    assert (st.holder_token, st.holder) == (a.token, "py session")
    time.sleep(2.5)  # past the TTL: only the heartbeat keeps them
    assert c.status("py:s:b").holder_token == b.token
    assert s.release(a) is True
    assert c.status("py:s:a").holder_token is None
    with pytest.raises(errors.NotAcquired):
        c.acquire("py:s:b", ttl_s=1)
    assert s.close() is True
    assert c.status("py:s:b").holder_token is None, "closing released it"
    with pytest.raises(SessionEnded):
        s.acquire("py:s:c")


def test_a_session_acquire_waits_in_line(server: Server) -> None:
    c = baton.Client(server.address)
    first = c.acquire("py:s:wait", ttl_s=5)
    s = c.open_session(ttl_s=3)
    got: list[baton.Lease] = []
    t = threading.Thread(target=lambda: got.append(s.acquire("py:s:wait", wait_s=5)))
    t.start()
    deadline = time.monotonic() + 5
    while c.status("py:s:wait").n_waiters == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.release(first)
    t.join(5)
    assert got and got[0].token > first.token and got[0].session_bound
    with pytest.raises(errors.NotAcquired) as refused:
        s.acquire("py:s:wait")
    assert refused.value.holder_token == got[0].token
    s.close()


def test_a_session_is_resumed_after_the_server_restarts(server: Server) -> None:
    c = baton.Client(server.address, timeout_s=2)
    with c.lease("py:s:restart", ttl_s=3) as kept:
        token = kept.token
        server.restart()
        restarted = time.monotonic()
        deadline = restarted + 10
        while kept.session.resumes == 0:
            assert time.monotonic() < deadline, "the session was not resumed"
            time.sleep(0.05)
        # A heartbeat acknowledged on the resumed stream moves it on.
        while kept.safe_until < restarted + 2.5:
            assert time.monotonic() < deadline, "no heartbeat after the resume"
            time.sleep(0.05)
        kept.check()
        assert c.status("py:s:restart").holder_token == token


def test_a_session_that_ends_makes_its_keepers_lose_at_once(server: Server) -> None:
    c = baton.Client(server.address)
    with c.lease("py:s:end", ttl_s=5) as kept:
        other = baton.Client(server.address)
        # The session's id is its own secret; closing it from the session
        # handle ends every lease tied to it.
        kept.session.close()
        assert kept.lost.wait(2)
        with pytest.raises(errors.OwnershipLost, match="session ended"):
            kept.check()
        assert other.status("py:s:end").holder_token is None


def test_a_waiting_session_acquire_can_be_cancelled(server: Server) -> None:
    c = baton.Client(server.address)
    first = c.acquire("py:s:cancel", ttl_s=10)
    s = c.open_session(ttl_s=3)
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            s.acquire("py:s:cancel", wait_s=30, cancel=cancel)
        except errors.NotAcquired as e:
            outcome.append(e)

    t = threading.Thread(target=wait)
    started = time.monotonic()
    t.start()
    deadline = started + 5
    while c.status("py:s:cancel").n_waiters == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cancel.set()
    t.join(5)
    assert not t.is_alive(), "the cancelled wait returned"
    assert time.monotonic() - started < 5, "long before its 30 s bound"
    assert len(outcome) == 1 and isinstance(outcome[0], errors.NotAcquired)
    assert outcome[0].reason == "cancelled"
    assert c.status("py:s:cancel").n_waiters == 0, "the wait was withdrawn"
    assert c.status("py:s:cancel").holder_token == first.token
    s.close()
