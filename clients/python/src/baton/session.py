"""Sessions: one stream, one heartbeat on a background thread, many leases.

A :class:`Session` owns one ``Session`` stream to the leader. A thread
sends a heartbeat every TTL/3 and keeps the session's *safe-until*: the
send time of the last acknowledged heartbeat, plus the TTL, minus a margin
(5%, at least 10 ms), on ``time.monotonic()``. The server extended the
session when it received that heartbeat, which was no earlier, so the
safe-until is never later than the server could end the session.

When the stream breaks, requests in flight fail as
:class:`errors.Indeterminate` and the session is resumed (on the leader,
following redirects) while its safe-until lasts; its leases are untouched
while the session lives. When the server answers that the session ended,
or the safe-until passes before a resume succeeds, the session is over:
every later call raises :class:`SessionEnded`.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from baton import _wire, errors
from baton._proto import baton_pb2 as pb
from baton.keeper import margin_s
from baton.rules import millis

if TYPE_CHECKING:
    from baton.client import Client, Lease

#: Ids of the session's own heartbeats; callers' ids count up from 1.
HEARTBEAT_ID_BIT = 1 << 63


class SessionEnded(errors.BatonError):
    """The session is over (expired, closed, or its safe-until passed
    without a resume): every lease tied to it has ended."""


class _Pending:
    """One request waiting for its answer."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.body: Any = None
        self.error: errors.BatonError | None = None

    def wait(self, timeout_s: float) -> Any:
        if not self.done.wait(timeout_s):
            raise errors.Indeterminate(
                f"no answer on the session stream within {timeout_s:g} s; "
                "the request may have taken effect"
            )
        if self.error is not None:
            raise self.error
        return self.body


class _Stream:
    """One open gRPC stream: a queue feeds its requests."""

    def __init__(self, outbox: queue.Queue[pb.SessionRequest | None], call: Any) -> None:
        self.outbox = outbox
        self.call = call

    def send(self, request: pb.SessionRequest) -> None:
        self.outbox.put(request)

    def end(self) -> None:
        self.outbox.put(None)
        with contextlib.suppress(Exception):
            self.call.cancel()


def _requests(outbox: queue.Queue[pb.SessionRequest | None]) -> Iterator[pb.SessionRequest]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item


class Ledger:
    """What a session knows about itself, whichever client drives its
    stream (threads here, tasks in :mod:`baton.aio`): its safe-until,
    the heartbeats in flight, the leases reported revoked. No I/O; the
    caller serializes access."""

    def __init__(self, opened: Any, sent: float) -> None:
        self.id: bytes = bytes(opened.session_id)
        self.ttl_s: float = float(opened.ttl_ms) / 1000
        self.margin_s = margin_s(self.ttl_s)
        self.safe_until: float = sent + self.ttl_s - self.margin_s
        self.heartbeats: dict[int, float] = {}
        self.revoked: dict[str, int] = {}
        self._heartbeat_ids = itertools.count(HEARTBEAT_ID_BIT)
        self.note_revoked(opened.revoked)

    def heartbeat(self, at: float) -> Any:
        """The next heartbeat request, sent at ``at``."""
        hid = next(self._heartbeat_ids)
        self.heartbeats[hid] = at
        return pb.SessionRequest(id=hid, heartbeat=pb.Heartbeat())

    def note_revoked(self, revoked: Any) -> None:
        for r in revoked:
            self.revoked[r.resource] = r.token

    def read(self, response: Any) -> tuple[int | None, Any, errors.BatonError | None, bool]:
        """Applies an answer: the id of the caller's request it answers
        (None for a heartbeat's), its body or error, and whether the
        server said the session is over."""
        which = response.WhichOneof("body")
        ended = which == "ended"
        if response.id >= HEARTBEAT_ID_BIT:
            sent = self.heartbeats.pop(response.id, None)
            if which == "heartbeat" and sent is not None:
                ack = response.heartbeat
                self.safe_until = max(
                    self.safe_until, sent + ack.remaining_ms / 1000 - self.margin_s
                )
                self.note_revoked(ack.revoked)
            return None, None, None, ended
        if which == "error":
            return response.id, None, _request_error(response.error), False
        if ended:
            return response.id, None, SessionEnded(ENDED), True
        return response.id, getattr(response, which), None, False


ENDED = "the session is not open (it expired or was closed)"


class Session:
    """A session with its stream, its heartbeat thread and its safe-until.
    Open one with :meth:`Client.open_session`; use it from any thread."""

    def __init__(self, client: Client, ttl_s: float | None = None) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self.ended = threading.Event()
        #: How many times the stream broke and the session was resumed.
        self.resumes = 0
        self._why: errors.BatonError = SessionEnded("the session is open")
        self._closing = False
        open_request = pb.OpenSession()
        if ttl_s is not None:
            open_request.ttl_ms = millis(ttl_s, "session ttl")
        sent = time.monotonic()
        self._stream, opened = self._open(open_request)
        self._ledger = Ledger(opened, sent)
        self.id = self._ledger.id
        self.ttl_s = self._ledger.ttl_s
        self._reader = threading.Thread(target=self._read, args=(self._stream,), daemon=True)
        self._reader.start()
        self._beater = threading.Thread(target=self._beat, name="baton-session", daemon=True)
        self._beater.start()

    # -- the stream ---------------------------------------------------------

    def _open(self, open_request: pb.OpenSession) -> tuple[_Stream, Any]:
        """Opens a stream on the leader (following redirects, like a unary
        call) and reads the answer to ``open``."""
        client = self._client
        deadline = time.monotonic() + client.timeout_s
        while True:
            address = client.current_server()
            outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
            outbox.put(pb.SessionRequest(id=0, open=open_request))
            stub = client._stub(address)
            call = stub.Session(_requests(outbox), metadata=tuple(client._metadata))
            stream = _Stream(outbox, call)
            try:
                first = next(iter(call))
            except grpc.RpcError as e:
                stream.end()
                if client._follow(e, address, deadline):
                    continue
                raise client._error(e, address) from None
            except StopIteration:
                raise errors.Indeterminate("the session stream ended at once") from None
            which = first.WhichOneof("body")
            if which == "opened":
                return stream, first.opened
            stream.end()
            if which == "ended":
                raise SessionEnded("the session is not open (it expired or was closed)")
            if which == "error":
                raise _request_error(first.error)
            raise errors.Indeterminate(f"unexpected answer to open: {first}")

    def _read(self, stream: _Stream) -> None:
        try:
            for response in stream.call:
                self._dispatch(response)
        except grpc.RpcError as e:
            if self._closing or self.ended.is_set():
                return
            if e.code() == grpc.StatusCode.PERMISSION_DENIED:
                self._end(errors.PermissionDenied(e.details() or ""))
                return
        if not self._closing and not self.ended.is_set():
            self._broken(stream)

    def _dispatch(self, response: Any) -> None:
        with self._lock:
            rid, body, error, ended = self._ledger.read(response)
            pending = self._pending.pop(rid, None) if rid is not None else None
        if ended:
            self._end(SessionEnded(ENDED))
        if pending is not None:
            pending.body, pending.error = body, error
            pending.done.set()

    def _broken(self, stream: _Stream) -> None:
        """Fails what was in flight, then resumes the session while its
        safe-until lasts."""
        stream.end()
        with self._lock:
            pending, self._pending = self._pending, {}
            self._ledger.heartbeats.clear()
        for p in pending.values():
            p.error = errors.Indeterminate(
                "the session stream broke before an answer came; the request may have taken effect"
            )
            p.done.set()
        pause = 0.02
        while not self._closing and time.monotonic() < self.safe_until:
            try:
                new, resumed = self._open(pb.OpenSession(resume=self.id))
            except SessionEnded as e:
                self._end(e)
                return
            except errors.BatonError:
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            with self._lock:
                self._ledger.note_revoked(resumed.revoked)
                self._stream = new
                self.resumes += 1
            self._reader = threading.Thread(target=self._read, args=(new,), daemon=True)
            self._reader.start()
            return
        self._end(SessionEnded("the session could not be resumed before its safe-until"))

    def _beat(self) -> None:
        while not self.ended.wait(self.ttl_s / 3):
            if self._closing:
                return
            if time.monotonic() >= self.safe_until:
                self._end(SessionEnded("no heartbeat was acknowledged before the safe-until"))
                return
            with self._lock:
                beat = self._ledger.heartbeat(time.monotonic())
                stream = self._stream
            stream.send(beat)

    def _end(self, why: errors.BatonError) -> None:
        with self._lock:
            if self.ended.is_set():
                return
            self._why = why
            pending, self._pending = self._pending, {}
        self.ended.set()
        for p in pending.values():
            p.error = why
            p.done.set()
        self._stream.end()

    # -- what callers see ----------------------------------------------------

    @property
    def safe_until(self) -> float:
        """Monotonic seconds until which the session, and every lease tied
        to it, is certainly held (as of the last acknowledged heartbeat)."""
        with self._lock:
            return self._ledger.safe_until

    def why(self) -> str:
        """Why the session ended (once it did)."""
        return str(self._why)

    def is_live(self) -> bool:
        return not self.ended.is_set() and time.monotonic() < self.safe_until

    def revoked_token(self, resource: str) -> int | None:
        """The token of this session's lease on ``resource`` that a fence
        revoked, as a heartbeat reported it."""
        with self._lock:
            return self._ledger.revoked.get(resource)

    def _request(
        self, op: dict[str, Any], timeout_s: float, cancel: threading.Event | None = None
    ) -> Any:
        """Sends one request and waits for its answer. With ``cancel`` (a
        waiting acquire): when it is set, or the caller is interrupted, a
        ``CancelWait`` withdraws the wait; the acquire's own answer (a
        cancellation, or a grant that came first) is still returned."""
        if self.ended.is_set():
            raise self._why
        rid = next(self._ids)
        pending = _Pending()
        with self._lock:
            self._pending[rid] = pending
            stream = self._stream
        stream.send(pb.SessionRequest(id=rid, **op))
        try:
            if cancel is None:
                return pending.wait(timeout_s)
            deadline = time.monotonic() + timeout_s
            cancelled = False
            try:
                while not pending.done.wait(0.02):
                    if not cancelled and cancel.is_set():
                        self._cancel(rid)
                        cancelled = True
                    if time.monotonic() >= deadline:
                        break
            except BaseException:
                # Interrupted (KeyboardInterrupt): withdraw the wait first.
                self._cancel(rid)
                raise
            return pending.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._pending.pop(rid, None)

    def _cancel(self, acquire_id: int) -> None:
        with self._lock:
            stream = self._stream
        cancel = pb.CancelWait(acquire_id=acquire_id)
        stream.send(pb.SessionRequest(id=next(self._ids), cancel=cancel))

    def acquire(
        self, resource: str, wait_s: float = 0, cancel: threading.Event | None = None
    ) -> Lease:
        """Acquires ``resource`` tied to this session (it lives while the
        session does); :class:`errors.NotAcquired` if it is held, the wait
        ran out, or ``cancel`` was set while it waited (reason
        ``cancelled``; a grant that came first is returned)."""
        return self.acquire_all([resource], wait_s, cancel)[0]

    def acquire_all(
        self,
        resources: Sequence[str],
        wait_s: float = 0,
        cancel: threading.Event | None = None,
    ) -> list[Lease]:
        """Acquires every resource or none, tied to this session."""
        from baton.client import granted

        acquire, n = _wire.session_acquire(resources, wait_s, self._client.holder)
        sent = time.monotonic()
        timeout_s = self._client.timeout_s + wait_s
        body = self._request({"acquire": acquire}, timeout_s, cancel if wait_s > 0 else None)
        leases = granted(body, sent, n)
        # A lease tied to the session lives as long as the session: its
        # safe-until is the session's.
        return leases

    def release(self, lease: Lease) -> bool:
        """Gives a lease back; False if it was not held."""
        request = pb.ReleaseRequest(resource=lease.resource, acquisition_id=lease.acquisition_id)
        return bool(self._request({"release": request}, self._client.timeout_s).released)

    def close(self) -> bool:
        """Ends the session: its leases are released and its waiters
        withdrawn. False if it had already ended."""
        if self.ended.is_set():
            return False
        try:
            body = self._request({"close": pb.CloseSession()}, self._client.timeout_s)
        except SessionEnded:
            return False
        finally:
            self._closing = True
            self._end(SessionEnded("the session was closed"))
        return bool(body.was_open)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(errors.BatonError):
            self.close()


def _request_error(e: Any) -> errors.BatonError:
    code = grpc.StatusCode.UNKNOWN
    for c in grpc.StatusCode:
        if c.value[0] == e.code:
            code = c
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(e.message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Exhausted(e.message)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(e.message)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(e.message)
    return errors.Indeterminate(f"{code.name}: {e.message}")
