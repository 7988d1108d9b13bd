"""The asyncio twin against a real server: the same core scenarios."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from baton import aio, errors
from baton.watch import Change

from .conftest import Server


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_every_call_round_trips(server: Server) -> None:
    async def main() -> None:
        async with aio.Client(server.address, holder="aio test") as c:
            lease = await c.acquire("py:aio:a", ttl_s=5)
            with pytest.raises(errors.NotAcquired) as held:
                await c.acquire("py:aio:a", ttl_s=5)
            assert held.value.holder_token == lease.token
            renewed = await c.renew(lease)
            assert renewed.token == lease.token and renewed.valid_until > lease.valid_until
            st = await c.status("py:aio:a")
            assert (st.holder_token, st.holder) == (lease.token, "aio test")
            assert [s.resource async for s in c.list_all("py:aio:", page=1)] == ["py:aio:a"]
            assert await c.release(lease) is True
            assert await c.release(lease) is False
            with pytest.raises(errors.NotOwner):
                await c.renew(lease)
            f = await c.fence("py:aio:a")
            assert f.token > lease.token

    run(main())


def test_waiting_and_all_or_nothing(server: Server) -> None:
    async def main() -> None:
        async with aio.Client(server.address) as c:
            first = await c.acquire("py:aio:w", ttl_s=5)
            waiter = asyncio.ensure_future(c.acquire("py:aio:w", ttl_s=5, wait_s=5))
            while (await c.status("py:aio:w")).n_waiters == 0:
                await asyncio.sleep(0.01)
            await c.release(first)
            second = await waiter
            assert second.token > first.token
            with pytest.raises(errors.NotAcquired):
                await c.acquire_all(["py:aio:x", "py:aio:w"], ttl_s=5)
            assert (await c.status("py:aio:x")).holder_token is None

    run(main())


@pytest.mark.parametrize("on_session", [True, False])
def test_the_keeper_renews_then_loses_a_fenced_lease(server: Server, on_session: bool) -> None:
    async def main() -> None:
        c = aio.Client(server.address)
        async with c, c.lease("py:aio:k", ttl_s=0.6, session=on_session) as kept:
            first = kept.safe_until
            await asyncio.sleep(0.7)
            kept.check()
            assert kept.safe_until > first
            await c.fence("py:aio:k")
            await asyncio.wait_for(kept.lost.wait(), 2)
            with pytest.raises(errors.OwnershipLost, match=r"no longer knows|revoked"):
                kept.check()

    run(main())


@pytest.mark.parametrize("on_session", [True, False])
def test_the_keeper_gives_up_at_its_safe_until_when_the_server_stops(
    server: Server, on_session: bool
) -> None:
    async def main() -> None:
        c = aio.Client(server.address, timeout_s=0.3)
        async with c, c.lease("py:aio:p", ttl_s=0.6, session=on_session) as kept:
            server.signal(signal.SIGSTOP)
            try:
                await asyncio.wait_for(kept.lost.wait(), 2)
                assert time.monotonic() >= kept.safe_until
                with pytest.raises(errors.OwnershipLost, match="safe-until"):
                    kept.check()
            finally:
                server.signal(signal.SIGCONT)

    run(main())


def test_a_watch_gives_the_snapshot_then_changes(server: Server) -> None:
    async def main() -> None:
        async with aio.Client(server.address, holder="aio watched") as c:
            held = await c.acquire("py:aio:wt:a", ttl_s=30)
            w = await c.watch("py:aio:wt:")
            assert [(h.resource, h.holder) for h in w.holders] == [("py:aio:wt:a", "aio watched")]
            await c.release(held)
            change = await w.__anext__()
            assert isinstance(change, Change)
            assert (change.kind, change.resource, change.token) == (
                "released",
                "py:aio:wt:a",
                held.token,
            )
            w.close()

    run(main())


def test_a_session_keeps_its_leases_waits_cancels_and_resumes(server: Server) -> None:
    async def main() -> None:
        async with aio.Client(server.address, holder="aio session", timeout_s=2) as c:
            s = await c.open_session(ttl_s=2)
            a = await s.acquire("py:aio:s:a")
            assert a.session_bound
            await asyncio.sleep(2.5)  # past the TTL: the heartbeat keeps it
            st = await c.status("py:aio:s:a")
            assert (st.holder_token, st.holder) == (a.token, "aio session")

            # A waiting acquire withdrawn by cancelling its task.
            other = await c.acquire("py:aio:s:busy", ttl_s=10)
            waiting = asyncio.ensure_future(s.acquire("py:aio:s:busy", wait_s=30))
            while (await c.status("py:aio:s:busy")).n_waiters == 0:
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            while (await c.status("py:aio:s:busy")).n_waiters:
                await asyncio.sleep(0.01)
            assert (await c.status("py:aio:s:busy")).holder_token == other.token

            # A restart: the session is resumed and keeps its lease.
            server.restart()
            restarted = time.monotonic()
            while s.resumes == 0:
                assert time.monotonic() < restarted + 10, "not resumed"
                await asyncio.sleep(0.05)
            assert (await c.status("py:aio:s:a")).holder_token == a.token
            assert await s.release(a) is True
            assert await s.close() is True
            with pytest.raises(aio.SessionEnded):
                await s.acquire("py:aio:s:c")

    run(main())


def test_an_election_hands_over_with_a_higher_token(server: Server) -> None:
    async def main() -> None:
        async with aio.Client(server.address) as c:
            election = c.election("py:aio:leader")
            observer = election.observe()
            assert await observer.__anext__() == (None, None)
            first = await election.campaign("one", ttl_s=2, wait_s=5)
            assert first is not None
            assert await election.leader() == aio.Leader(first.token, "one")
            second = asyncio.ensure_future(election.campaign("two", ttl_s=2, wait_s=10))
            while (await c.status("py:aio:leader")).n_waiters == 0:
                await asyncio.sleep(0.01)
            await first.session.close()
            leader2 = await second
            assert leader2 is not None and leader2.token > first.token
            kinds = [(await observer.__anext__())[0] for _ in range(3)]
            assert [k.kind for k in kinds if k] == ["granted", "released", "handed_off"]
            async with leader2:
                leader2.check()
            assert await election.leader() is None
            await observer.aclose()

    run(main())


@pytest.mark.parametrize("server_takes_batches", [True, False])
def test_many_tasks_share_one_session(server: Server, server_takes_batches: bool) -> None:
    """grpc.aio allows one write in flight per stream: the session's
    writer sends what tasks queued meanwhile in one batch message (only
    to a server that says it takes batches), so tasks may share it
    freely and every request is written once."""

    async def main() -> None:
        async with aio.Client(server.address) as c:
            s = await c.open_session(ttl_s=5)
            assert s._ledger.batches, "this server takes batches"
            s._ledger.batches = server_takes_batches
            written: list[int] = []  # requests per message written
            write = s._call.write

            async def recording(message: Any) -> None:
                is_batch = message.WhichOneof("op") == "batch"
                written.append(len(message.batch.requests) if is_batch else 1)
                await write(message)

            s._call.write = recording

            async def cycles(i: int) -> int:
                for _ in range(20):
                    lease = await s.acquire(f"py:aio:shared:{i}")
                    assert await s.release(lease)
                return 20

            done = await asyncio.gather(*(cycles(i) for i in range(16)))
            assert sum(done) == 320
            assert sum(written) >= 640, "every acquire and release written"
            if server_takes_batches:
                assert max(written) > 1, "16 tasks' requests went out together"
            else:
                assert max(written) == 1, "one request a message to this server"
            assert await s.close()

    run(main())


def test_a_held_back_batch_goes_at_an_answer_and_never_waits_on_a_waiting_acquire(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer holds the next batch back until the last one is
    answered: with the hold's bound set far beyond the client's timeout,
    16 tasks still cycle (each answer lets the next batch go), and a
    request sent while another task's acquire waits on the server is not
    held back for that acquire's answer."""
    from baton.aio import session as aio_session

    monkeypatch.setattr(aio_session, "BATCH_HOLD_S", 60.0)

    async def main() -> None:
        async with (
            aio.Client(server.address, timeout_s=5) as c,
            aio.Client(server.address, timeout_s=5) as other,
        ):
            s = await c.open_session(ttl_s=10)
            assert s._ledger.batches, "this server takes batches"

            async def cycles(i: int) -> int:
                for _ in range(20):
                    lease = await s.acquire(f"py:aio:hold:{i}")
                    assert await s.release(lease)
                return 20

            assert sum(await asyncio.gather(*(cycles(i) for i in range(16)))) == 320
            # Enough waiting acquires to hold batches back, were they waited for.
            busy = [
                f"py:aio:hold:busy:{k}" for k in range(2 * aio_session.BATCH_HOLD_UNANSWERED_MIN)
            ]
            held = [await other.acquire(name, ttl_s=30) for name in busy]
            waiting = [asyncio.create_task(s.acquire(name, wait_s=20)) for name in busy]
            for name in busy:
                while not (await other.status(name)).n_waiters:
                    await asyncio.sleep(0.01)
            assert await cycles(99) == 20, "not held back by the waiting acquires"
            assert not any(w.done() for w in waiting)
            for lease in held:
                assert await other.release(lease)
            for lease, w in zip(held, waiting):
                assert (await w).token > lease.token
            assert await s.close()

    run(main())
