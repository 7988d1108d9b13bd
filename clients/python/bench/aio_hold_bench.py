"""``baton.aio``'s session writer with and without its hold (see
``Session._write``), beside ``redis.asyncio``'s ``Lock``: N tasks on one
event loop, one shared session, alternating rounds in one process, and
the same-round ratios. Start the servers first (docs/performance.md);
nothing here starts them.

    python bench/aio_hold_bench.py --baton 127.0.0.1:7770 \\
        --redis 127.0.0.1:6390 --tasks 16 --rounds 5 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from lock_bench import baton_aio_cycles, redis_aio_cycles, run_async

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


async def main(args: argparse.Namespace) -> None:
    rows: dict[str, list[float]] = {"without": [], "with": [], "redis": []}
    for r in range(args.rounds):
        rows["without"].append(await baton_round(args.baton, args.tasks, False, args.duration))
        rows["with"].append(await baton_round(args.baton, args.tasks, True, args.duration))
        rate, _ = await run_async(redis_aio_cycles(args.redis, args.tasks), args.duration)
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
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
