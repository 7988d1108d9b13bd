"""Real `baton serve` processes on ephemeral ports, and a PostgreSQL
database per test (``BATON_TEST_PG``, as the Rust tests use it)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def baton_bin() -> str:
    """``BATON_BIN``, else the workspace's debug build (``cargo build``)."""
    path = os.environ.get("BATON_BIN") or str(ROOT / "target" / "debug" / "baton")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no baton binary at {path}: run `cargo build` or set BATON_BIN")
    return path


class Server:
    """One ``baton serve`` on its own data directory."""

    def __init__(
        self, data_dir: str, extra: list[str] | None = None, listen: str = "127.0.0.1:0"
    ) -> None:
        self.data_dir = data_dir
        self.extra = extra or []
        self.listen = listen
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                baton_bin(),
                "serve",
                "--listen",
                self.listen,
                "--http-listen",
                "127.0.0.1:0",
                "--ttl-min",
                "100ms",
                "--data-dir",
                self.data_dir,
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("baton listening"):
            self.proc.kill()
            raise RuntimeError(f"baton serve did not start: {line!r}")
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        self.address = fields["grpc"]
        self.http = fields["http"]
        # A restart comes back on the same port.
        self.listen = self.address

    def healthz(self) -> str:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{self.http}/healthz", timeout=2) as r:
                return str(r.read().decode())
        except OSError as e:
            return f"unreachable: {e}"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.kill9()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def tmp_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="baton-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(tmp_dir: str) -> Iterator[Server]:
    s = Server(os.path.join(tmp_dir, "data"))
    yield s
    s.stop()


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A fresh database with the fence kit's schema; its conninfo."""
    import psycopg

    base = os.environ.get("BATON_TEST_PG")
    if not base:
        pytest.fail("BATON_TEST_PG is not set (for example: host=127.0.0.1 user=postgres)")
    name = f"pyclient_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    conninfo = f"{base} dbname={name}"
    # The documented install: one psql command.
    install = ROOT / "crates" / "fence" / "sql" / "install.sql"
    psql = shutil.which("psql") or "psql"
    subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", str(install)],
        check=True,
        capture_output=True,
    )
    yield conninfo
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def cluster(tmp_dir: str, pg_db: str) -> Iterator[list[Server]]:
    """Three servers on one PostgreSQL database, leader TTL 1 s; each is
    resumed (if a test stopped it) and stopped at the end."""
    nodes = [
        Server(
            os.path.join(tmp_dir, f"n{i}"),
            ["--store", pg_db, "--leader-ttl", "1s"],
            listen=f"127.0.0.1:{free_port()}",
        )
        for i in range(3)
    ]
    try:
        yield nodes
    finally:
        for n in nodes:
            n.signal(signal.SIGCONT)
            n.stop()


def dump(obj: Any) -> str:
    return repr(obj)
