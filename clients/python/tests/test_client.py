"""Every call against a real `baton serve`: waiting, all-or-nothing,
holders, the keeper losing a fenced lease, a restart, bad input and an
unreachable server."""

from __future__ import annotations

import threading
import time

import pytest

import baton
from baton import errors

from .conftest import Server


def test_every_call_round_trips(server: Server) -> None:
    c = baton.Client(server.address, holder="py test 1")
    lease = c.acquire("py:a", ttl_s=5)
    assert lease.token > 1 << 40
    assert 4.9 < lease.valid_for() <= 5.0
    with pytest.raises(errors.NotAcquired) as held:
        c.acquire("py:a", ttl_s=5)
    assert held.value.holder_token == lease.token
    assert held.value.reason == "held"
    renewed = c.renew(lease)
    assert renewed.token == lease.token
    assert renewed.valid_until > lease.valid_until
    st = c.status("py:a")
    assert (st.holder_token, st.holder, st.n_waiters) == (lease.token, "py test 1", 0)
    assert c.list("py:")[0].resource == "py:a"
    assert c.release(lease) is True
    assert c.release(lease) is False, "a second release changes nothing"
    with pytest.raises(errors.NotOwner):
        c.renew(lease)
    f = c.fence("py:a")
    assert f.token > lease.token and f.revoked_token is None
    again = c.acquire("py:a", ttl_s=5)
    assert again.token > f.token, "a fence's token is below every later grant"


def test_a_waiter_gets_the_lease_when_it_is_released(server: Server) -> None:
    c = baton.Client(server.address)
    first = c.acquire("py:wait", ttl_s=5)
    got: list[baton.Lease] = []
    t = threading.Thread(target=lambda: got.append(c.acquire("py:wait", ttl_s=5, wait_s=5)))
    t.start()
    deadline = time.monotonic() + 5
    while c.status("py:wait").n_waiters == 0:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    c.release(first)
    t.join(5)
    assert got and got[0].token > first.token
    with pytest.raises(errors.NotAcquired) as timed_out:
        c.acquire("py:wait", ttl_s=5, wait_s=0.2)
    assert timed_out.value.reason == "timed_out"


def test_multi_acquire_is_all_or_nothing(server: Server) -> None:
    c = baton.Client(server.address)
    b = c.acquire("py:m:b", ttl_s=5)
    with pytest.raises(errors.NotAcquired) as refused:
        c.acquire_all(["py:m:a", "py:m:b", "py:m:c"], ttl_s=5)
    assert refused.value.resource == "py:m:b"
    assert c.status("py:m:a").holder_token is None, "nothing was granted"
    c.release(b)
    leases = c.acquire_all(["py:m:a", "py:m:b", "py:m:c"], ttl_s=5)
    assert [x.resource for x in leases] == ["py:m:a", "py:m:b", "py:m:c"]
    assert len({x.token for x in leases}) == 3
    assert [x.resource for x in c.list_all("py:m:", page=2)] == ["py:m:a", "py:m:b", "py:m:c"]


@pytest.mark.parametrize("on_session", [True, False])
def test_the_keeper_renews_and_stops_vouching_once_fenced(server: Server, on_session: bool) -> None:
    c = baton.Client(server.address)
    with c.lease("py:kept", ttl_s=0.6, session=on_session) as kept:
        first_safe = kept.safe_until
        time.sleep(0.7)  # longer than the TTL: only renewals keep it
        kept.check()
        assert kept.safe_until > first_safe
        assert c.status("py:kept").holder_token == kept.token
        c.fence("py:kept")
        assert kept.lost.wait(2), "the next renewal learns of the fence"
        with pytest.raises(errors.OwnershipLost, match=r"revoked|no longer knows"):
            kept.check()
    # Lost: the keeper did not release (the fence's successor may hold it).
    assert c.status("py:kept").holder_token is None


@pytest.mark.parametrize("on_session", [True, False])
def test_a_stopped_server_makes_the_keeper_give_up_at_its_safe_until(
    server: Server, on_session: bool
) -> None:
    import signal

    c = baton.Client(server.address, timeout_s=0.3)
    with c.lease("py:paused", ttl_s=0.6, session=on_session) as kept:
        server.signal(signal.SIGSTOP)
        try:
            assert kept.lost.wait(2), "lost without any answer from the server"
            assert time.monotonic() >= kept.safe_until
            if not on_session:
                assert kept.safe_until <= kept.lease.valid_until
            with pytest.raises(errors.OwnershipLost, match="safe-until"):
                kept.check()
        finally:
            server.signal(signal.SIGCONT)


def test_a_lease_survives_a_restart_with_its_token_and_holder(server: Server) -> None:
    c = baton.Client(server.address, holder="survivor")
    lease = c.acquire("py:restart", ttl_s=30)
    server.restart()
    st = c.status("py:restart")
    assert (st.holder_token, st.holder) == (lease.token, "survivor")
    assert c.renew(lease).token == lease.token


def test_bad_input_is_refused_before_sending_and_the_servers_rule_is_named(
    server: Server,
) -> None:
    c = baton.Client(server.address)
    with pytest.raises(ValueError, match="whitespace"):
        c.acquire(" py:x", ttl_s=5)
    with pytest.raises(ValueError, match="positive"):
        c.acquire("py:x", ttl_s=0)
    with pytest.raises(ValueError, match="control character"):
        baton.Client(server.address, holder="a\nb")
    with pytest.raises(ValueError, match="list of names"):
        c.acquire_all("py:x")
    with pytest.raises(errors.InvalidArgument, match="ttl 3600000ms is out of range"):
        c.acquire("py:x", ttl_s=3600)


def test_an_unreachable_server_fails_within_the_timeout_naming_the_addresses() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = baton.Client(f"127.0.0.1:{port}", timeout_s=1)
    started = time.monotonic()
    with pytest.raises(errors.Unavailable, match=f"127.0.0.1:{port}") as e:
        c.status("py:x")
    assert e.value.definite
    assert time.monotonic() - started < 3


def test_a_quota_refusal_is_definite_and_names_the_quota(tmp_dir: str) -> None:
    quotas = f"{tmp_dir}/quotas.toml"
    with open(quotas, "w") as f:
        f.write('[[prefix]]\nprefix = "team-a:"\nleases = 1\n')
    server = Server(f"{tmp_dir}/data", ["--quota-file", quotas])
    try:
        c = baton.Client(server.address)
        c.acquire("team-a:1", ttl_s=5)
        with pytest.raises(errors.Exhausted) as over:
            c.acquire_all(["team-b:1", "team-a:2"], ttl_s=5)
        assert 'leases quota of prefix "team-a:"' in str(over.value)
        assert "at most 1 live leases" in str(over.value)
        assert c.status("team-b:1").holder_token is None, "all or nothing"
        c.acquire("team-b:1", ttl_s=5)
    finally:
        server.stop()


def test_a_refusal_names_every_blocker_with_its_holder_and_line(server: Server) -> None:
    owner = baton.Client(server.address, holder="py owner")
    held = owner.acquire("py:why:a", ttl_s=30)
    peer = baton.Client(server.address, holder="py peer")
    with pytest.raises(errors.NotAcquired) as refused:
        peer.acquire_all(["py:why:free", "py:why:a"], ttl_s=5)
    (b,) = refused.value.blockers
    assert (b.resource, b.readable, b.n_holders, b.n_waiters_ahead) == ("py:why:a", True, 1, 0)
    (h,) = b.holders
    assert (h.token, h.holder, h.session_bound) == (held.token, "py owner", False)
    assert h.held_s is not None and h.held_s < 20
    assert h.remaining_s is not None and 20 < h.remaining_s <= 30
    assert "py:why:a held token=" in str(refused.value)
    assert 'holder="py owner"' in str(refused.value)
    with pytest.raises(errors.NotAcquired) as timed_out:
        peer.acquire("py:why:a", ttl_s=5, wait_s=0.2)
    assert timed_out.value.reason == "timed_out"
    assert [x.resource for x in timed_out.value.blockers] == ["py:why:a"]


def test_semaphores_and_shared_locks_sync_asyncio_unary_and_session(server: Server) -> None:
    import asyncio

    c = baton.Client(server.address, holder="py shapes")
    first = c.acquire("py:jobs", ttl_s=30, permits=2)
    second = c.acquire("py:jobs", ttl_s=30, permits=2)
    assert (first.slot, second.slot) == (0, 1)
    assert second.token > first.token
    with pytest.raises(errors.NotAcquired) as full:
        c.acquire("py:jobs", ttl_s=30, permits=2)
    assert full.value.reason == "held"
    # Another kind or N is a definite error naming both; nothing changes.
    for wrong in ({}, {"permits": 3}, {"shared": True}):
        with pytest.raises(errors.InvalidArgument, match="semaphore of 2 permits"):
            c.acquire("py:jobs", ttl_s=30, **wrong)
    # Refused before anything is sent.
    for bad in ({"permits": 0}, {"permits": 4097}, {"shared": True, "permits": 2}):
        with pytest.raises(ValueError, match="permits"):
            c.acquire("py:new", ttl_s=30, **bad)  # type: ignore[arg-type]
    st = c.status("py:jobs")
    assert st.permits == 2
    assert [(s.slot, s.token) for s in st.slots] == [(0, first.token), (1, second.token)]
    assert c.set_permits("py:jobs", 3) == 2
    # A session's permit, and shared holders beside each other.
    with c.open_session(ttl_s=5) as s:
        third = s.acquire("py:jobs", permits=3)
        assert third.slot == 2
        reader = s.acquire("py:doc", shared=True)
        assert reader.slot == 0
    assert c.release(first)

    async def shared_side() -> None:
        async with baton.aio.Client(server.address) as a:
            r1 = await a.acquire("py:doc", ttl_s=30, shared=True)
            r2 = await a.acquire("py:doc", ttl_s=30, shared=True)
            assert {r1.slot, r2.slot} == {0, 1}
            with pytest.raises(errors.NotAcquired):
                await a.acquire("py:doc", ttl_s=30)
            s = await a.open_session(ttl_s=5)
            permit = await s.acquire("py:jobs", permits=3)
            assert permit.slot == 0, "the lowest free slot"
            await s.close()
            assert await a.set_permits("py:jobs", 2) == 3

    asyncio.run(shared_side())


def test_one_request_mixes_shapes_all_or_nothing(server: Server) -> None:
    import asyncio

    c = baton.Client(server.address)
    mixed: list[baton.Claim] = [
        ("py:mix-jobs", baton.Shape(permits=2)),
        ("py:mix-doc", baton.Shape(shared=True)),
        "py:mix-db",
    ]
    leases = c.acquire_all(mixed, ttl_s=30)
    assert [lease.slot for lease in leases] == [0, 0, None]
    second = c.acquire_all(mixed[:2], ttl_s=30)
    assert [lease.slot for lease in second] == [1, 1]
    # The semaphore is full: nothing of the request is granted.
    with pytest.raises(errors.NotAcquired) as refused:
        c.acquire_all([("py:mix-doc", baton.Shape(shared=True)), mixed[0]], ttl_s=30)
    assert refused.value.blockers[0].resource == "py:mix-jobs"
    assert refused.value.blockers[0].n_holders == 2
    assert len(c.status("py:mix-doc").slots) == 2
    for bad, rule in [
        (("py:x", "shared"), "a name, or a \\(name, baton.Shape"),
        (("py:x", baton.Shape(shared=True, permits=2)), "not both"),
        (("py:x", baton.Shape(permits=0)), "from 1 to 4096"),
    ]:
        with pytest.raises(ValueError, match=rule):
            c.acquire_all([bad], ttl_s=30)  # type: ignore[list-item]

    async def on_a_session() -> None:
        async with baton.aio.Client(server.address) as a:
            s = await a.open_session(ttl_s=5)
            held = await s.acquire_all([("py:mix-doc", baton.Shape(shared=True)), "py:mix-other"])
            assert [lease.slot for lease in held] == [2, None]
            await s.close()

    asyncio.run(on_a_session())
