"""Durable lock cycles per second from Python, side by side: the Baton
client on its session path against redis-py's ``Lock`` on Redis.

N threads in one process cycle acquire -> release on distinct names (one
per thread) for a fixed time; each system gets the same threads and
duration, in alternating rounds, and the medians are printed with the
acquire latency percentiles. Start the servers first (see
docs/performance.md for the commands); nothing here starts them.

    python bench/lock_bench.py --baton 127.0.0.1:7700 \\
        --redis always=127.0.0.1:6390 --redis everysec=127.0.0.1:6391
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable
from typing import Any, Callable

import redis
import redis.asyncio

import baton
from baton import aio

Cycle = Callable[[], float]


def baton_cycles(address: str, threads: int) -> list[Cycle]:
    client = baton.Client(address)
    cycles: list[Cycle] = []
    for i in range(threads):
        session = client.open_session(ttl_s=30)
        name = f"pybench:{i}"

        def cycle(session: baton.session.Session = session, name: str = name) -> float:
            started = time.perf_counter()
            lease = session.acquire(name)
            acquired = time.perf_counter() - started
            session.release(lease)
            return acquired

        cycles.append(cycle)
    return cycles


def baton_shared_session_cycles(address: str, threads: int) -> list[Cycle]:
    """All threads on the client's one shared session (what ``client.lease``
    uses): one stream, one reader and one heartbeat for every thread."""
    client = baton.Client(address)
    session = client.session(ttl_s=30)
    cycles: list[Cycle] = []
    for i in range(threads):
        name = f"pybench:shared:{i}"

        def cycle(name: str = name) -> float:
            started = time.perf_counter()
            lease = session.acquire(name)
            acquired = time.perf_counter() - started
            session.release(lease)
            return acquired

        cycles.append(cycle)
    return cycles


def baton_unary_cycles(address: str, threads: int) -> list[Cycle]:
    client = baton.Client(address)
    cycles: list[Cycle] = []
    for i in range(threads):
        name = f"pybench:u:{i}"

        def cycle(name: str = name) -> float:
            started = time.perf_counter()
            lease = client.acquire(name, ttl_s=30)
            acquired = time.perf_counter() - started
            client.release(lease)
            return acquired

        cycles.append(cycle)
    return cycles


def redis_cycles(address: str, threads: int) -> list[Cycle]:
    host, port = address.rsplit(":", 1)
    pool = redis.ConnectionPool(host=host, port=int(port), max_connections=threads)
    r = redis.Redis(connection_pool=pool)
    cycles: list[Cycle] = []
    for i in range(threads):
        lock = r.lock(f"pybench:{i}", timeout=30)

        def cycle(lock: redis.lock.Lock = lock) -> float:
            started = time.perf_counter()
            if not lock.acquire(blocking=False):
                raise RuntimeError("the bench's own lock was held")
            acquired = time.perf_counter() - started
            lock.release()
            return acquired

        cycles.append(cycle)
    return cycles


AsyncCycle = Callable[[], Awaitable[float]]


async def baton_aio_cycles(
    client: aio.Client, tasks: int, shared: bool, opened: list[aio.Session]
) -> list[AsyncCycle]:
    """A session per task, or (``shared``) one session for every task;
    each session opened is added to ``opened``."""
    cycles: list[AsyncCycle] = []
    one = await client.open_session(ttl_s=30) if shared else None
    for i in range(tasks):
        session = one or await client.open_session(ttl_s=30)
        if session not in opened:
            opened.append(session)
        name = f"pybench:aio:{'shared:' if shared else ''}{i}"

        async def cycle(session: aio.Session = session, name: str = name) -> float:
            started = time.perf_counter()
            lease = await session.acquire(name)
            acquired = time.perf_counter() - started
            await session.release(lease)
            return acquired

        cycles.append(cycle)
    return cycles


def redis_aio_cycles(address: str, tasks: int) -> list[AsyncCycle]:
    host, port = address.rsplit(":", 1)
    r = redis.asyncio.Redis(host=host, port=int(port), max_connections=tasks)
    cycles: list[AsyncCycle] = []
    for i in range(tasks):
        lock = r.lock(f"pybench:aio:{i}", timeout=30)

        async def cycle(lock: Any = lock) -> float:
            started = time.perf_counter()
            if not await lock.acquire(blocking=False):
                raise RuntimeError("the bench's own lock was held")
            acquired = time.perf_counter() - started
            await lock.release()
            return acquired

        cycles.append(cycle)
    return cycles


async def run_async(cycles: list[AsyncCycle], duration_s: float) -> tuple[float, list[float]]:
    """Like :func:`run`, with one task per cycle on this event loop."""
    stop = time.monotonic() + duration_s
    latencies: list[list[float]] = [[] for _ in cycles]

    async def worker(i: int) -> None:
        while time.monotonic() < stop:
            latencies[i].append(await cycles[i]())

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(len(cycles))))
    flat = [x for lat in latencies for x in lat]
    return len(flat) / (time.monotonic() - started), flat


def run(cycles: list[Cycle], duration_s: float) -> tuple[float, list[float]]:
    """Cycles per second and every acquire latency, all threads together."""
    stop = time.monotonic() + duration_s
    latencies: list[list[float]] = [[] for _ in cycles]

    def worker(i: int) -> None:
        while time.monotonic() < stop:
            latencies[i].append(cycles[i]())

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(cycles))]
    started = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - started
    flat = [x for lat in latencies for x in lat]
    return len(flat) / elapsed, flat


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baton", required=True, help="host:port of baton serve")
    parser.add_argument("--redis", action="append", default=[], help="LABEL=host:port")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    systems: dict[str, list[Cycle]] = {
        "baton session per thread": baton_cycles(args.baton, args.threads),
        "baton one shared session": baton_shared_session_cycles(args.baton, args.threads),
        "baton unary": baton_unary_cycles(args.baton, args.threads),
    }
    # Every Redis row's name; the first of each kind is the ratios' peer.
    redis_rows: list[str] = []
    for spec in args.redis:
        label, address = spec.split("=", 1)
        redis_rows.append(f"redis-py Lock, appendfsync {label}")
        systems[redis_rows[-1]] = redis_cycles(address, args.threads)
    rates: dict[str, list[float]] = {k: [] for k in systems}
    lats: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(args.rounds):
        for name, cycles in systems.items():
            rate, latencies = run(cycles, args.duration)
            rates[name].append(rate)
            lats[name].extend(latencies)

    async def asyncio_rounds() -> None:
        client = aio.Client(args.baton)
        opened: list[aio.Session] = []
        tasks: dict[str, list[AsyncCycle]] = {
            "asyncio: baton.aio session per task": await baton_aio_cycles(
                client, args.threads, shared=False, opened=opened
            ),
            "asyncio: baton.aio one shared session": await baton_aio_cycles(
                client, args.threads, shared=True, opened=opened
            ),
        }
        for spec in args.redis:
            label, address = spec.split("=", 1)
            redis_rows.append(f"asyncio: redis.asyncio Lock, {label}")
            tasks[redis_rows[-1]] = redis_aio_cycles(address, args.threads)
        for name in tasks:
            rates[name], lats[name] = [], []
        for _ in range(args.rounds):
            for name, cycles in tasks.items():
                rate, latencies = await run_async(cycles, args.duration)
                rates[name].append(rate)
                lats[name].extend(latencies)
        systems.update({name: [] for name in tasks})
        # Closed before the loop is: their streams' tasks end with them.
        for session in opened:
            await session.close()
        await client.close()

    asyncio.run(asyncio_rounds())
    print(
        f"{args.threads} threads (or tasks on one event loop), "
        f"{args.rounds} alternating rounds of {args.duration:g} s"
    )
    print(f"{'system':44} {'cycles/s (median)':>18} {'acquire p50':>12} {'p99':>10}")
    for name in systems:
        p50_ms = percentile(lats[name], 0.5) * 1e3
        p99_ms = percentile(lats[name], 0.99) * 1e3
        rate = statistics.median(rates[name])
        print(f"{name:44} {rate:>18.0f} {p50_ms:>10.2f}ms {p99_ms:>8.2f}ms")
    if args.redis:
        # Each Baton row against the first Redis of its kind (threads or
        # asyncio), round by round: the machine drifts between rounds.
        label = args.redis[0].split("=", 1)[0]
        print(f"\nmedian same-round ratio to redis {label}")
        n_redis = len(args.redis)
        for name in systems:
            if name in redis_rows:
                continue
            peer = redis_rows[n_redis if name.startswith("asyncio") else 0]
            ratios = [a / b for a, b in zip(rates[name], rates[peer])]
            print(f"{name:44} {statistics.median(ratios):>18.2f}")


if __name__ == "__main__":
    main()
