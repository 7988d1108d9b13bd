"""A lost acquire answer, sent again, never leaves an orphan lease: a
proxy (a thread here) lets the request through, drops the server's answer
and resets the connection; the client sends the same request id again and
gets that same lease. The negative control sends no request id: the
repeat finds the orphan holding the resource."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

import grpc

import baton
from baton import aio
from baton._proto import baton_pb2 as pb
from baton._proto import baton_pb2_grpc as pb_grpc

from .conftest import Server, free_port
from .test_cluster import leader


class DropProxy:
    """Forwards loopback TCP to ``upstream``. Once armed with a pattern,
    the connection whose request carries it gets no answer: the request
    reaches the server, whose bytes are then discarded for 300 ms (time to
    apply it and answer; a reset sooner can reach the server before it
    applied the request), and both sides are reset."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.pattern: bytes | None = None
        self.dropped = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, pattern: bytes) -> None:
        with self.lock:
            self.pattern = pattern

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            doomed = threading.Event()
            threading.Thread(target=self._up, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, doomed), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        while chunk := _recv(client):
            with self.lock:
                if self.pattern is not None and self.pattern in chunk:
                    self.pattern = None
                    doomed.set()
            _send(server, chunk)
            if doomed.is_set():
                time.sleep(0.3)
                with self.lock:
                    self.dropped += 1
                _reset(client)
                _reset(server)
                return
        _close(server)

    def _down(self, server: socket.socket, client: socket.socket, doomed: threading.Event) -> None:
        while chunk := _recv(server):
            if doomed.is_set():
                continue  # the answer of a doomed request: never forwarded
            _send(client, chunk)
        _close(client)

    def close(self) -> None:
        self.listener.close()


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(65536)
    except OSError:
        return b""


def _send(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        s.sendall(data)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_WR)


def _reset(s: socket.socket) -> None:
    """Resets ``s``: linger 0, then shut down, which also wakes the other
    thread's ``recv`` on it (a bare ``close`` would wait for that)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    except OSError:
        pass


def _held_token(server: Server, name: str) -> int | None:
    with baton.Client(server.address) as direct:
        return direct.status(name).holder_token


def test_a_lost_answer_is_sent_again_and_grants_once_sync_async_and_session(
    server: Server,
) -> None:
    proxy = DropProxy(server.address)
    try:
        with baton.Client(proxy.address, timeout_s=10) as c:
            c.status("warm")  # the handshake's round trip, before arming
            proxy.arm(b"lost:sync")
            lease = c.acquire("lost:sync", ttl_s=30)
            assert proxy.dropped == 1, "the fault fired"
            assert _held_token(server, "lost:sync") == lease.token, "one lease, the client's"
            assert c.release(lease)
            assert _held_token(server, "lost:sync") is None, "no orphan"

            with c.session(ttl_s=20) as s:
                s.acquire("warm:session")
                proxy.arm(b"lost:session")
                held = s.acquire("lost:session")
                assert proxy.dropped == 2, "the fault fired on the session"
                assert _held_token(server, "lost:session") == held.token
                assert s.release(held)
            assert _held_token(server, "lost:session") is None

        async def asyncio_client() -> int:
            async with aio.Client(proxy.address, timeout_s=10) as a:
                await a.status("warm")
                proxy.arm(b"lost:aio")
                got = await a.acquire("lost:aio", ttl_s=30)
                assert _held_token(server, "lost:aio") == got.token
                assert await a.release(got)
                return got.token

        asyncio.run(asyncio_client())
        assert proxy.dropped == 3, "the fault fired for asyncio"
        assert _held_token(server, "lost:aio") is None
        print(f"faults fired: {proxy.dropped}; each lost answer was answered with one lease")
    finally:
        proxy.close()


def test_without_a_request_id_the_lost_answer_leaves_an_orphan(server: Server) -> None:
    proxy = DropProxy(server.address)
    try:
        request = pb.AcquireRequest(resources=["lost:bare"], ttl_ms=30_000)
        with grpc.insecure_channel(proxy.address) as channel:
            stub = pb_grpc.LeasesStub(channel)
            stub.Status(pb.StatusRequest(resource="warm"), timeout=5)
            proxy.arm(b"lost:bare")
            try:
                stub.Acquire(request, timeout=5)
                raise AssertionError("the answer was to be dropped")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert proxy.dropped == 1, "the fault fired"
        with grpc.insecure_channel(server.address) as channel:
            again = pb_grpc.LeasesStub(channel).Acquire(request, timeout=5)
        assert again.WhichOneof("outcome") == "not_acquired", again
        orphan = _held_token(server, "lost:bare")
        assert orphan is not None and orphan == again.not_acquired.holder_token
        print(f"negative control: the orphan (token {orphan}) holds lost:bare for nobody")
    finally:
        proxy.close()


def test_in_a_cluster_the_repeat_goes_to_another_member_and_grants_once(
    tmp_dir: str, pg_db: str
) -> None:
    """Three servers, each behind a proxy it advertises; the leader's
    proxy drops the answer. The client moves on to another member, which
    sends it back to the leader: the same lease."""
    listens = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    proxies = [DropProxy(a) for a in listens]
    nodes = [
        Server(
            os.path.join(tmp_dir, f"n{i}"),
            ["--store", pg_db, "--leader-ttl", "1s", "--advertise", f"http://{p.address}"],
            listen=listens[i],
        )
        for i, p in enumerate(proxies)
    ]
    try:
        first = leader(nodes)
        servers = ",".join(
            p.address for p in [proxies[first], *proxies[:first], *proxies[first + 1 :]]
        )
        with baton.Client(servers, timeout_s=20) as c:
            c.status("warm")
            proxies[first].arm(b"lost:cluster")
            lease = c.acquire("lost:cluster", ttl_s=30)
            assert proxies[first].dropped == 1, "the fault fired"
            assert _held_token(nodes[first], "lost:cluster") == lease.token, "one lease"
            assert c.release(lease)
            assert _held_token(nodes[first], "lost:cluster") is None, "no orphan"
        print(f"cluster: fault fired once; token {lease.token} held once")
    finally:
        for n in nodes:
            n.stop()
        for p in proxies:
            p.close()
