"""The session writer with and without its hold (see
``baton.aio.session.Session._write``), beside Redis's ``Lock``: N tasks
on one event loop on one shared ``baton.aio`` session against
``redis.asyncio``, or (``--threads``) N threads on one shared synchronous
session (which runs on the same asyncio session) against redis-py;
alternating rounds in one process, and the same-round ratios. Start the
servers first (docs/performance.md); nothing here starts them.

    python bench/aio_hold_bench.py --baton 127.0.0.1:7770 \\
        --redis 127.0.0.1:6390 --tasks 16 --rounds 5 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from lock_bench import (
    baton_aio_cycles,
    baton_shared_session_cycles,
    redis_aio_cycles,
    redis_cycles,
    run,
    run_async,
)

from baton import aio
from baton.aio import session as aio_session

HOLD = aio_session.Session._hold_for_an_answer


async def no_hold(self: aio_session.Session) -> None:
    """The writer as it was before the hold: the next message at once."""


async def baton_round(address: str, tasks: int, hold: bool, duration_s: float) -> float:
    aio_session.Session._hold_for_an_answer = HOLD if hold else no_hold  # type: ignore[method-assign]
    async with aio.Client(address) as client:
        opened: list[aio.Session] = []
        cycles = await baton_aio_cycles(client, tasks, True, opened)
        rate, _ = await run_async(cycles, duration_s)
        for session in opened:
            await session.close()
    return rate


def threads_round(address: str, threads: int, hold: bool, duration_s: float) -> float:
    aio_session.Session._hold_for_an_answer = HOLD if hold else no_hold  # type: ignore[method-assign]
    return run(baton_shared_session_cycles(address, threads), duration_s)[0]


async def main(args: argparse.Namespace) -> None:
    rows: dict[str, list[float]] = {"without": [], "with": [], "redis": []}
    n, duration_s = args.tasks, args.duration
    for r in range(args.rounds):
        if args.threads:
            rows["without"].append(threads_round(args.baton, n, False, duration_s))
            rows["with"].append(threads_round(args.baton, n, True, duration_s))
            rate, _ = run(redis_cycles(args.redis, n), duration_s)
        else:
            rows["without"].append(await baton_round(args.baton, n, False, duration_s))
            rows["with"].append(await baton_round(args.baton, n, True, duration_s))
            rate, _ = await run_async(redis_aio_cycles(args.redis, n), duration_s)
        rows["redis"].append(rate)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items()))
    for k, v in rows.items():
        print(f"{k}: median {statistics.median(v):.0f} cycles/s")
    for a, b in (("with", "without"), ("with", "redis"), ("without", "redis")):
        ratios = [x / y for x, y in zip(rows[a], rows[b], strict=True)]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"{a} / {b}, same-round: median {statistics.median(ratios):.2f} ({each})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--baton", required=True, help="host:port of baton serve")
    parser.add_argument("--redis", required=True, help="host:port of Redis, appendfsync always")
    parser.add_argument("--tasks", type=int, default=16, help="tasks, or threads")
    parser.add_argument("--threads", action="store_true", help="threads on a synchronous session")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
