"""A three-server cluster on PostgreSQL: the leader SIGKILLed while a
Python worker holds a lease; the worker keeps its lease, with the same
token, on the new leader."""

from __future__ import annotations

import time

import baton

from .conftest import Server


def leader(nodes: list[Server], skip: int = -1) -> int:
    deadline = time.monotonic() + 30
    while True:
        for i, n in enumerate(nodes):
            if i != skip and "ok leader" in n.healthz():
                return i
        assert time.monotonic() < deadline, "no leader within 30 s"
        time.sleep(0.05)


def test_a_held_lease_keeps_its_token_through_a_leader_kill(cluster: list[Server]) -> None:
    nodes = cluster
    first = leader(nodes)
    c = baton.Client(",".join(n.address for n in nodes), holder="py cluster worker")
    # Unary renewals, then a session: both keep the lease through the
    # failover with the same token.
    with (
        c.lease("py:cluster:unary", ttl_s=30, session=False, renew_interval_s=0.2) as unary,
        c.lease("py:cluster", ttl_s=3) as kept,
    ):
        token = kept.token
        nodes[first].kill9()
        killed_at = time.monotonic()
        new = leader(nodes, skip=first)
        assert new != first
        # A heartbeat acknowledged by the new leader (after a
        # resume) moves the safe-until past the kill.
        deadline = time.monotonic() + 30
        while kept.session.resumes == 0 or kept.safe_until < killed_at + 2.5:
            assert time.monotonic() < deadline, "the session was not resumed"
            time.sleep(0.05)
        kept.check()
        st = c.status("py:cluster")
        assert (st.holder_token, st.holder) == (token, "py cluster worker")
        renewed = c.renew(unary.lease)
        assert renewed.token == unary.token
        unary.check()
        print(f"session resumed on the new leader {new} with token {token}")
