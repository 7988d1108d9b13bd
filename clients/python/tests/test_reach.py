"""A cluster the Python client can always reach: a stopped member (SIGSTOP:
TCP handshakes still complete, nothing answers) or a silent listener
listed first never holds up a call, sync or asyncio. The timeouts given
are far above the bounds (20 s), so an Indeterminate or a timeout fails
the test; the elapsed times are printed, not asserted."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import grpc
import pytest

import baton
from baton import _dial, aio, errors

from .conftest import Server, free_port
from .test_cluster import leader

TIMEOUT_S = 20.0


def stop(server: Server) -> None:
    """SIGSTOP, then wait (waitid, WSTOPPED) until the kernel has stopped
    it: a signal takes effect only when the target next runs, and a server
    still running would answer the dial the test expects to fail."""
    assert server.proc is not None
    server.signal(signal.SIGSTOP)
    os.waitid(os.P_PID, server.proc.pid, os.WSTOPPED | os.WNOWAIT)


def listed_first(nodes: list[Server], first: int) -> str:
    order = [first] + [i for i in range(len(nodes)) if i != first]
    return ",".join(nodes[i].address for i in order)


def timed(report: list[str], what: str, f: object) -> object:
    started = time.monotonic()
    out = f() if callable(f) else f
    report.append(f"{what} {(time.monotonic() - started) * 1000:.0f} ms")
    return out


async def aio_calls(servers: str, name: str, report: list[str]) -> None:
    started = time.monotonic()
    async with aio.Client(servers, timeout_s=TIMEOUT_S) as c:
        await c.status(name)
        lease = await c.acquire(name, ttl_s=60)
        assert lease.token > 0
        session = await c.open_session(ttl_s=60)
        await session.acquire(name + ":session")
        await session.close()
    report.append(f"asyncio status+acquire+session {(time.monotonic() - started) * 1000:.0f} ms")


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_stopped_member_listed_first_never_holds_up_a_call(
    cluster: list[Server], role: str
) -> None:
    first = leader(cluster)
    stopped = first if role == "leader" else (first + 1) % 3
    servers = listed_first(cluster, stopped)
    report: list[str] = []
    stop(cluster[stopped])
    try:
        c = baton.Client(servers, timeout_s=TIMEOUT_S)
        timed(report, "sync status", lambda: c.status(f"py:reach:{role}"))
        lease = timed(report, "sync acquire", lambda: c.acquire(f"py:reach:{role}", ttl_s=60))
        assert isinstance(lease, baton.Lease)
        asyncio.run(aio_calls(servers, f"py:reach:{role}:aio", report))
    finally:
        cluster[stopped].signal(signal.SIGCONT)
    print(f"{role} stopped, listed first: {', '.join(report)}")
    c.close()


def test_a_silent_listener_listed_first_is_passed_over(server: Server) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        c = baton.Client(f"{addr},{server.address}", timeout_s=TIMEOUT_S)
        started = time.monotonic()
        c.status("py:silent")
        c.acquire("py:silent", ttl_s=5)
        print(f"silent listener first: answered in {(time.monotonic() - started) * 1000:.0f} ms")
        c.close()
        alone = baton.Client(addr, timeout_s=TIMEOUT_S, dial_timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match="no answer within the dial timeout") as e:
            alone.acquire("py:silent", ttl_s=5)
        assert e.value.definite and "nothing was sent" in str(e.value)
        assert time.monotonic() - started < TIMEOUT_S / 2
        alone.close()


def test_refused_and_unresolvable_are_definite_and_end_at_once() -> None:
    port = free_port()
    for servers, says in [
        (f"127.0.0.1:{port}", "connection refused"),
        ("nosuch.invalid:7700", "nosuch.invalid does not resolve"),
    ]:
        c = baton.Client(servers, timeout_s=TIMEOUT_S)
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match=says) as e:
            c.acquire("py:x", ttl_s=5)
        assert e.value.definite
        elapsed = time.monotonic() - started
        assert elapsed < TIMEOUT_S / 2, f"{servers}: {elapsed:.1f} s"
        print(f"{servers}: definite after {elapsed * 1000:.0f} ms")
        c.close()

        async def aio_acquire(servers: str = servers) -> None:
            async with aio.Client(servers, timeout_s=TIMEOUT_S) as a:
                await a.acquire("py:x", ttl_s=5)

        with pytest.raises(errors.Unavailable, match=says):
            asyncio.run(aio_acquire())


def test_closing_a_channel_waited_on_twice_leaves_no_thread_exception() -> None:
    """A member that never answers is waited on again while gRPC's
    connectivity poller from the first wait still runs; the client then
    closes the channel. gRPC's poller raises "Channel closed!" in its own
    thread when closed so (the negative control, a plain close); the
    client's close leaves it nothing to raise."""

    def wait_twice_then_close(close: Callable[[grpc.Channel], None]) -> list[BaseException | None]:
        raised: list[BaseException | None] = []

        def record(args: threading.ExceptHookArgs) -> None:
            raised.append(args.exc_value)

        hook = threading.excepthook
        threading.excepthook = record
        before = set(threading.enumerate())
        try:
            with socket.socket() as silent:
                silent.bind(("127.0.0.1", 0))
                silent.listen(8)
                channel = grpc.insecure_channel(f"127.0.0.1:{silent.getsockname()[1]}")
                first = grpc.channel_ready_future(channel)
                with pytest.raises(grpc.FutureTimeoutError):
                    first.result(timeout=0.3)
                first.cancel()
                grpc.channel_ready_future(channel).cancel()
                close(channel)
                for t in set(threading.enumerate()) - before:
                    t.join(timeout=5)
                    assert not t.is_alive(), f"{t.name} still runs 5 s after the close"
        finally:
            threading.excepthook = hook
        return raised

    plain = wait_twice_then_close(lambda channel: channel.close())
    assert any("Channel closed" in str(e) for e in plain), (
        f"the negative control raised {plain!r}: this gRPC no longer has the race"
    )
    assert wait_twice_then_close(_dial.close_channel) == []
