"""Blocks that one command cannot check: several hosts, a pause, a
hand-over. Each scenario runs the blocks as written and asserts what the
docs say around them."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from blocks import Block
from expect import compare, split_expected
from shell import Failure, read_text, wait_for_line

if TYPE_CHECKING:
    from harness import Run


def run(name: str, ctx: Run, block: Block) -> str:
    table: dict[str, Callable[[Run, Block], str]] = {
        "cron": cron,
        "election": election,
        "publish": publish,
        "watch": watch,
        "elect-observe": elect_observe,
    }
    if name not in table:
        raise Failure(f"{block.where}: no scenario {name!r}")
    return table[name](ctx, block)


def read(ctx: Run, name: str) -> str:
    assert ctx.term is not None
    with open(os.path.join(ctx.term.work, name)) as f:
        return f.read()


def cron(ctx: Run, block: Block) -> str:
    """The crontab line on three hosts at the same minute: the job runs
    once, the two others find the night recorded and skip."""
    term = ctx.term
    assert term is not None
    line = read(ctx, "crontab").strip()
    command = " ".join(line.split()[5:])
    # The reader's servers and install path, as the reader substitutes them.
    command = command.replace("baton-1:7700,baton-2:7700", "127.0.0.1:7700")
    command = command.replace("/usr/local/bin/nightly-once", "./nightly-once")
    runs = os.path.join(term.work, "runs")
    report = os.path.join(term.work, "nightly-report")
    with open(report, "w") as f:
        f.write(f"#!/bin/sh\necho ran >> {runs}\nsleep 0.3\n")
    os.chmod(report, 0o755)
    hosts = [term.start(command, strict=False, env={"NIGHTLY_REPORT": report}) for _ in range(3)]
    said = []
    for proc, log in hosts:
        if proc.wait(timeout=120) != 0:
            raise Failure(f"a host exited {proc.returncode}:\n{read_text(log)}")
        said.append(read_text(log).strip())
    ran = read_text(runs).count("ran") if os.path.exists(runs) else 0
    done = sum(s.endswith(": done") for s in said)
    skipped = sum(s.endswith(": already done") for s in said)
    if (ran, done, skipped) != (1, 1, 2):
        raise Failure(
            f"three hosts: the job ran {ran} times, {done} done, {skipped} skipped: {said}"
        )
    return "\n".join(said)


def plan_write(ctx: Run) -> tuple[int, int]:
    """The token and sequence number of the last write to scheduler:plan."""
    row = ctx.pg.query(
        "SELECT generation, seq FROM baton.resources WHERE resource = 'scheduler:plan'",
        db="app",
    )
    if not row:
        return 0, 0
    token, seq = row.split("|")
    return int(token), int(seq or 0)


def wait_writes(ctx: Run, after_token: int, n: int, timeout_s: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        token, seq = plan_write(ctx)
        if token > after_token and seq >= n:
            return token, seq
        time.sleep(0.1)
    raise Failure(
        f"no leader above token {after_token} wrote {n} times in {timeout_s:.0f} s: "
        f"{plan_write(ctx)}"
    )


def election(ctx: Run, block: Block) -> str:
    """Two hosts run the election line; the first leads and writes at least
    five times, is paused (SIGSTOP, a frozen VM) until the second leads and
    writes five times under a newer token, and is refused when it wakes."""
    term = ctx.term
    assert term is not None
    command = read(ctx, "elect.sh").strip()
    env = {"PLAN_EVERY_S": "0.2"}
    a, a_log = term.start(command, strict=False, env=env)
    a_token, a_seq = wait_writes(ctx, 0, 5, 60)
    b, _ = term.start(command, strict=False, env=env)
    os.killpg(a.pid, signal.SIGSTOP)
    paused = time.monotonic()
    b_token, b_seq = wait_writes(ctx, a_token, 5, 60)
    os.killpg(a.pid, signal.SIGCONT)
    status = a.wait(timeout=60)
    paused_s = time.monotonic() - paused
    after = plan_write(ctx)
    term.kill_group(b.pid)
    if status == 0 or after[0] != b_token:
        raise Failure(
            f"the deposed leader exited {status}; scheduler:plan is at {after}, the new leader's "
            f"token is {b_token}:\n{read_text(a_log)}"
        )
    return (
        f"leader 1 token {a_token} wrote {a_seq}+, paused {paused_s:.1f} s, exited {status}; "
        f"leader 2 token {b_token} wrote {b_seq}+\n{read_text(a_log)}"
    )


def publish(ctx: Run, block: Block) -> str:
    """publish-statement.sh under `baton run` as its first comment says,
    then with an older token: applied, then stale with exit 1."""
    term = ctx.term
    assert term is not None
    command = next(line for line in block.text.splitlines() if "# Run by: " in line).split(
        "# Run by: "
    )[1]
    status, out = term.run(command, strict=False)
    if status != 0 or "publish: applied" not in out:
        raise Failure(f"{command}: exit {status}:\n{out}")
    resource = "statement:account-42:2026-09-13"
    token = int(
        ctx.pg.query(
            f"SELECT generation FROM baton.resources WHERE resource = '{resource}'",
            db="app",
        )
    )
    env = {"BATON_FENCING_TOKEN": str(token - 1), "BATON_RESOURCE": resource}
    status, stale = term.run("./publish-statement.sh", strict=False, env=env)
    if status != 1 or stale.strip() != "publish: stale":
        raise Failure(f"an older token: exit {status}, {stale!r} (the docs: `stale`, exit 1)")
    return out + stale


def watch(ctx: Run, block: Block) -> str:
    """`baton watch statement:` while a lease is held, released, granted,
    fenced with a waiter in line and handed to it."""
    term = ctx.term
    assert term is not None
    lines = block.text.strip().split("\n")
    command = lines[0].removeprefix("$ ")
    expected, _ = split_expected(lines[1:])
    day13, day14 = "statement:account-42:2026-09-13", "statement:account-42:2026-09-14"
    term.must(f"baton acquire {day13} --ttl 60s --json > held.json")
    proc, log = term.start(command, strict=False, env={})
    wait_for_line(log, r" held ", 30, proc)
    field = 'json.load(open("held.json"))["leases"][0]["acquisition_id"]'
    held = f"$(python3 -c 'import json; print({field})')"
    term.must(f"baton release {day13} --acquisition {held}")
    term.must(f"baton acquire {day14} --ttl 60s")
    waiter, _ = term.start(f"baton acquire {day14} --ttl 60s --wait 30s", strict=False, env={})
    term.must(
        f"until baton status {day14} | grep -q waiters=1; do sleep 0.1; done",
        timeout_s=30,
    )
    term.must(f"baton fence {day14}")
    wait_for_line(log, r" handed_off ", 30, proc)
    term.kill_group(proc.pid)
    term.kill_group(waiter.pid)
    out = read_text(log)
    diff = compare(ctx.bindings, expected, out)
    if diff:
        raise Failure(diff)
    return out


def elect_observe(ctx: Run, block: Block) -> str:
    """The transcript of `elect` and `observe`: host-a leads, stops
    heartbeating (SIGSTOP), its leadership expires and the next candidate,
    waiting in line, is handed the election."""
    term = ctx.term
    assert term is not None
    lines = block.text.strip().split("\n")
    elect_cmd = lines[0].removeprefix("$ ")
    observe_cmd = lines[2].removeprefix("$ ")
    a, a_log = term.start(elect_cmd, strict=False, env={})
    leading = wait_for_line(a_log, "^leading ", 30, a)
    diff = compare(ctx.bindings, split_expected([lines[1]])[0], leading)
    if diff:
        raise Failure(diff)
    observer, o_log = term.start(observe_cmd, strict=False, env={})
    wait_for_line(o_log, " current ", 30, observer)
    b, _ = term.start(elect_cmd, strict=False, env={})
    term.must(
        "until baton status scheduler | grep -q waiters=1; do sleep 0.1; done",
        timeout_s=30,
    )
    os.killpg(a.pid, signal.SIGSTOP)
    wait_for_line(o_log, " handed_off ", 30, observer)
    for p in (observer, b, a):
        os.killpg(p.pid, signal.SIGCONT)
        term.kill_group(p.pid)
    out = read_text(o_log)
    diff = compare(ctx.bindings, split_expected(lines[3:])[0], out)
    if diff:
        raise Failure(diff)
    return leading + "\n" + out
