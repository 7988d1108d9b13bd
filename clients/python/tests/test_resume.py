"""Watches that resume, from Python (sync and asyncio) against a real
server: across SIGKILLs right after a release, under eight threads of
churn, every number after the snapshot comes once and in order and the
changes lead to the holders a fresh snapshot shows; a number older than
the kept window and one from the future are refused; a watcher that
resumes too late takes a new snapshot and says so."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import baton
from baton import aio
from baton.watch import Change, Resnapshot

from .conftest import Server, free_port
from .test_cluster import leader

#: Every client of these tests, kept to the end of the session: a client
#: dropped within a fraction of a second of dialing several members races
#: grpcio's connectivity thread ("Channel deallocated" on stderr), noise
#: that is not these tests' subject.
KEPT: list[baton.Client] = []


def client(address: str, timeout_s: float = 10) -> baton.Client:
    c = baton.Client(address, timeout_s=timeout_s)
    KEPT.append(c)
    return c


class Churn:
    """Eight threads, each taking and giving back its own three ``r:``
    names until stopped, through restarts."""

    def __init__(self, address: str) -> None:
        self.stop = threading.Event()
        self.answers = 0
        self.unexpected: list[BaseException] = []

        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._work, args=(address, w), daemon=True) for w in range(8)
        ]
        for t in self.threads:
            t.start()

    def _work(self, address: str, w: int) -> None:
        c = client(address, timeout_s=2)
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                lease = c.acquire(f"r:{w}:{i % 3}", ttl_s=60)
                c.release(lease)
            except baton.BatonError:
                time.sleep(0.01)
                continue
            except Exception as e:
                self.unexpected.append(e)
                return
            with self.lock:
                self.answers += 2

    def after(self, n: int) -> None:
        """Waits for ``n`` more answers."""
        with self.lock:
            floor = self.answers + n
        deadline = time.monotonic() + 30
        while True:
            with self.lock:
                if self.answers >= floor:
                    return
            assert time.monotonic() < deadline, "the clients made no progress"
            time.sleep(0.005)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        assert not self.unexpected, f"a client raised what is not a BatonError: {self.unexpected}"


def holders_now(address: str) -> dict[str, int]:
    with client(address).watch("r:", once=True) as w:
        return {h.resource: h.token for h in w.holders}


def check(
    what: str, start: tuple[dict[str, int], int], changes: list[Change], now: dict[str, int]
) -> None:
    snapshot, seq = start
    assert [c.seq for c in changes] == list(range(seq + 1, seq + 1 + len(changes))), what
    held = dict(snapshot)
    for c in changes:
        if c.kind in ("granted", "handed_off"):
            assert c.resource not in held, (what, c)
            held[c.resource] = c.token
        else:
            assert held.pop(c.resource, None) == c.token, (what, c)
    assert held == now, f"{what}: the changes lead to the holders now"
    print(f"{what}: {len(changes)} changes after seq {seq}, every one once and in order")


@pytest.fixture
def churned(tmp_dir: str) -> Iterator[tuple[Server, Churn]]:
    server = Server(tmp_dir, listen=f"127.0.0.1:{free_port()}")
    churn = Churn(server.address)
    try:
        yield server, churn
    finally:
        churn.join()
        server.stop()


def kill_three_times(server: Server, churn: Churn) -> None:
    for _ in range(3):
        churn.after(100)
        server.restart()
    churn.after(100)
    churn.join()
    client(server.address).acquire("r:end", ttl_s=60)


def fail_over(cluster: list[Server], churn: Churn) -> None:
    first = leader(cluster)
    churn.after(100)
    cluster[first].kill9()
    leader(cluster, skip=first)
    churn.after(100)
    churn.join()
    client(",".join(n.address for n in cluster)).acquire("r:end", ttl_s=60)


def watch_sync(what: str, address: str, faults: Callable[[], None]) -> None:
    """A sync watch of ``r:`` followed on a thread while ``faults`` run
    (ending with a grant of ``r:end``), then checked."""
    w = client(address, timeout_s=2).watch("r:")
    start = ({h.resource: h.token for h in w.holders}, w.seq)
    changes: list[Change] = []
    done = threading.Event()

    def follow() -> None:
        for c in w:
            assert isinstance(c, Change), f"no resnapshot within the window: {c}"
            changes.append(c)
            if c.resource == "r:end":
                done.set()
                return

    threading.Thread(target=follow, daemon=True).start()
    faults()
    assert done.wait(60), "the watch saw the marker"
    w.close()
    check(what, start, changes, holders_now(address))


def watch_async(what: str, address: str, faults: Callable[[], None]) -> None:
    """The asyncio twin of :func:`watch_sync` (``faults`` on a thread)."""

    async def main() -> None:
        async with aio.Client(address, timeout_s=2) as c:
            w = await c.watch("r:")
            start = ({h.resource: h.token for h in w.holders}, w.seq)
            changes: list[Change] = []

            async def follow() -> None:
                async for ch in w:
                    assert isinstance(ch, Change), f"no resnapshot within the window: {ch}"
                    changes.append(ch)
                    if ch.resource == "r:end":
                        return

            task = asyncio.ensure_future(follow())
            await asyncio.to_thread(faults)
            await asyncio.wait_for(task, 60)
            w.close()
            now = await asyncio.to_thread(holders_now, address)
            check(what, start, changes, now)

    asyncio.run(main())


def test_a_sync_watch_resumes_across_sigkill(churned: tuple[Server, Churn]) -> None:
    server, churn = churned
    churn.after(100)
    watch_sync(
        "sync watch across 3 SIGKILLs", server.address, lambda: kill_three_times(server, churn)
    )


def test_an_asyncio_watch_resumes_across_sigkill(churned: tuple[Server, Churn]) -> None:
    server, churn = churned
    churn.after(100)
    watch_async(
        "asyncio watch across 3 SIGKILLs", server.address, lambda: kill_three_times(server, churn)
    )


def test_too_old_and_future_numbers_are_refused_and_a_late_resume_resnapshots(
    tmp_dir: str,
) -> None:
    server = Server(tmp_dir, extra=["--watch-history", "4"], listen=f"127.0.0.1:{free_port()}")
    try:
        c = baton.Client(server.address, timeout_s=2)
        w = c.watch("r:")
        # The watch's stream ends with the restart; ten changes happen
        # before it reads again, and the server keeps only four.
        server.restart()
        for _ in range(5):
            c.release(c.acquire("r:x", ttl_s=30))
        last = w.seq + 10
        first = next(w)
        assert isinstance(first, Resnapshot) and first.seq == last, first
        assert first.holders == ()
        c.release(c.acquire("r:y", ttl_s=30))
        after = next(w)
        assert isinstance(after, Change) and after.seq == last + 1
        w.close()
        with pytest.raises(baton.WatchTooOld) as too_old:
            c.watch("r:", after_seq=last - 5)
        assert too_old.value.oldest_seq == last + 2 - 4
        with pytest.raises(baton.InvalidArgument, match="above the last change"):
            c.watch("r:", after_seq=last + 3)
        with pytest.raises(ValueError, match="after_seq"):
            c.watch("r:", after_seq=-1)
    finally:
        server.stop()


def test_a_watch_resumes_on_the_new_leader_after_the_leader_is_killed(
    cluster: list[Server],
) -> None:
    addresses = ",".join(n.address for n in cluster)
    churn = Churn(addresses)
    try:
        churn.after(100)
        watch_sync(
            "sync watch across a leader SIGKILL", addresses, lambda: fail_over(cluster, churn)
        )
    finally:
        churn.join()


def test_an_asyncio_watch_resumes_on_the_new_leader(cluster: list[Server]) -> None:
    addresses = ",".join(n.address for n in cluster)
    churn = Churn(addresses)
    try:
        churn.after(100)
        watch_async(
            "asyncio watch across a leader SIGKILL", addresses, lambda: fail_over(cluster, churn)
        )
    finally:
        churn.join()
