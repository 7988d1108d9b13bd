"""The stale-worker story with Python workers: the first is paused with
SIGSTOP after its last check and before it publishes; its lease expires;
a second worker publishes with a higher token; the first wakes up and its
publish is refused as ``stale`` by the fence kit."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time

import psycopg

import baton
from baton import fence

from .conftest import Server

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "statement_worker.py"


def worker(server: Server, db: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE),
            "--server",
            server.address,
            "--db",
            db,
            "--statement",
            "account-42:2026-09-13",
            "--ttl",
            "1",
            *extra,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_paused_worker_wakes_up_and_is_refused_as_stale(server: Server, pg_db: str) -> None:
    first = worker(server, pg_db, "--hold-before-publish")
    assert first.stdout is not None and first.stdin is not None
    line = first.stdout.readline()
    assert line.startswith("checked token="), line
    t1 = int(line.split("=")[1])
    first.send_signal(signal.SIGSTOP)
    stops = 1
    try:
        client = baton.Client(server.address)
        deadline = time.monotonic() + 10
        while client.status("statement:account-42:2026-09-13").holder_token is not None:
            assert time.monotonic() < deadline, "the paused worker's lease never expired"
            time.sleep(0.05)
        second = worker(server, pg_db)
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 0, out
        t2 = int(out.split("token=")[1])
        assert out.startswith("publish: applied") and t2 > t1
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate("\n", timeout=30)
    assert first.returncode == 1
    assert out.strip() == f"publish: stale token={t1}"
    with psycopg.connect(pg_db) as conn:
        g = fence.generation(conn, "statement:account-42:2026-09-13")
    assert g is not None
    assert g.generation == t2 and g.published_token == t2
    assert g.published_key == f"statements/account-42:2026-09-13/generation-{t2}.pdf"
    print(f"pauses: {stops}; stale publishes refused: 1 (token {t1} < {t2})")


def test_a_readers_late_output_is_refused_after_a_writer_wrote(server: Server, pg_db: str) -> None:
    """Readers write their own output under shared leases (``shared=True``);
    a writer's grant comes after them and its write raises the floor; the
    reader that wakes after it is refused, while readers never refuse each
    other."""
    client = baton.Client(server.address)
    name = "report:py"
    r1 = client.acquire(name, ttl_s=30, shared=True)
    r2 = client.acquire(name, ttl_s=30, shared=True)
    with psycopg.connect(pg_db) as conn:
        # The later reader writes first: the earlier one is not refused.
        assert fence.fence(conn, name, r2.token, "r2", b"r2", shared=True).outcome == "applied"
        assert fence.fence(conn, name, r1.token, "r1", b"r1", shared=True).outcome == "applied"
        conn.commit()
    assert client.release(r2)
    # Reader 1 pauses; its lease ends; a writer takes the lock and writes.
    assert client.fence(name).token > r1.token
    writer = client.acquire(name, ttl_s=30)
    with psycopg.connect(pg_db) as conn:
        assert fence.fence(conn, name, writer.token, "w", b"w").outcome == "applied"
        late = fence.fence(conn, name, r1.token, "r1-late", b"r1", shared=True)
        assert (late.outcome, late.current_token) == ("stale", writer.token)
        conn.commit()
    assert client.release(writer)
    r3 = client.acquire(name, ttl_s=30, shared=True)
    with psycopg.connect(pg_db) as conn:
        assert fence.fence(conn, name, r3.token, "r3", b"r3", shared=True).outcome == "applied"
        # A write by a stale writer below a recorded reader's token: stale.
        stale_writer = fence.fence(conn, name, writer.token, "w-late", b"w")
        assert (stale_writer.outcome, stale_writer.current_token) == ("stale", r3.token)
    print(f"stale attempts refused: 2 (reader {r1.token}, writer {writer.token})")
