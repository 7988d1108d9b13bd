"""Every bad input raises ValueError before anything is opened: a
listener that counts its connections sees none, sync and asyncio."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import baton
from baton import aio


class Counting:
    """A TCP listener that accepts and counts connections, answering nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Counting]:
    c = Counting()
    yield c
    c.close()


BAD_NAMES: list[Any] = ["", 42, None, "a::b", "x" * 600, "a\nb"]
BAD_SECONDS: list[Any] = [0, -1, "30", float("nan"), True]


def bind(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: f(*args, **kwargs)


def sync_calls(c: Any) -> list[tuple[str, Callable[[], Any]]]:
    calls: list[tuple[str, Callable[[], Any]]] = []
    for n in BAD_NAMES:
        calls += [
            (f"lease({n!r})", bind(c.lease, n, ttl_s=2)),
            (f"lease({n!r}, session=False)", bind(c.lease, n, ttl_s=2, session=False)),
            (f"acquire({n!r})", bind(c.acquire, n, ttl_s=2)),
            (f"status({n!r})", bind(c.status, n)),
            (f"fence({n!r})", bind(c.fence, n)),
            (f"election({n!r})", bind(c.election, n)),
        ]
    for t in BAD_SECONDS:
        calls += [
            (f"lease(ttl_s={t!r})", bind(c.lease, "ok:1", ttl_s=t)),
            (f"acquire(ttl_s={t!r})", bind(c.acquire, "ok:1", ttl_s=t)),
            (f"open_session({t!r})", bind(c.open_session, t)),
        ]
    calls += [
        ("lease(wait_s=-1)", bind(c.lease, "ok:1", ttl_s=2, wait_s=-1)),
        ("acquire_all([])", bind(c.acquire_all, [], ttl_s=2)),
        ("acquire_all('ok:1')", bind(c.acquire_all, "ok:1", ttl_s=2)),
        ("list(limit=0)", bind(c.list, limit=0)),
        ("list(limit='5')", bind(c.list, limit="5")),
        ("list(prefix=7)", bind(c.list, prefix=7)),
        ("list(prefix='a\\x00')", bind(c.list, prefix="a\x00")),
        ("watch(7)", bind(c.watch, 7)),
        ("watch('x'*600)", bind(c.watch, "x" * 600)),
        ("release('lease')", bind(c.release, "lease")),
        ("renew(None)", bind(c.renew, None)),
        ("with_holder('a\\nb')", bind(c.with_holder, "a\nb")),
    ]
    return calls


def test_every_bad_input_is_refused_before_any_connection(listener: Counting) -> None:
    c: Any = baton.Client(listener.address, timeout_s=2)
    for what, call in sync_calls(c):
        with pytest.raises(ValueError):
            call()
        assert listener.accepted == 0, f"{what} connected before refusing its input"
    c.close()


def test_every_bad_input_is_refused_before_any_connection_asyncio(listener: Counting) -> None:
    async def run() -> None:
        c: Any = aio.Client(listener.address, timeout_s=2)
        calls: list[tuple[str, Callable[[], Any]]] = []
        for n in BAD_NAMES:
            calls += [
                (f"acquire({n!r})", bind(c.acquire, n, ttl_s=2)),
                (f"status({n!r})", bind(c.status, n)),
                (f"fence({n!r})", bind(c.fence, n)),
            ]
        for t in BAD_SECONDS:
            calls += [
                (f"acquire(ttl_s={t!r})", bind(c.acquire, "ok:1", ttl_s=t)),
                (f"open_session({t!r})", bind(c.open_session, t)),
            ]
        calls += [
            ("list(limit=0)", bind(c.list, limit=0)),
            ("watch(7)", bind(c.watch, 7)),
            ("watch('x'*600)", bind(c.watch, "x" * 600)),
        ]
        for what, call in calls:
            with pytest.raises(ValueError):
                await call()
            assert listener.accepted == 0, f"{what} connected before refusing its input"
        for n in BAD_NAMES:
            with pytest.raises(ValueError):
                async with c.lease(n, ttl_s=2):
                    pass
            with pytest.raises(ValueError):
                c.election(n)
            assert listener.accepted == 0, f"lease({n!r}) connected before refusing its input"
        await c.close()

    asyncio.run(run())
