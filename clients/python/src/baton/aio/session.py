"""The asyncio session: one stream, a heartbeat task every TTL/3, a
reader task, the safe-until, and a resume while it lasts."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from baton import _wire, errors
from baton._ledger import ENDED, Ledger
from baton._proto import baton_pb2 as pb
from baton._types import Claim, Lease
from baton._wire import granted, map_error, request_error
from baton.aio._grpc import EOF
from baton.errors import SessionEnded
from baton.rules import millis

if TYPE_CHECKING:
    from baton.aio.client import Client


#: The most requests in one batch message (the server's limit).
BATCH_MAX = 256

#: How long the writer holds requests back for an answer (see
#: ``Session._write``), at most, and from how many requests written and
#: not yet answered it does.
BATCH_HOLD_S = 0.001
BATCH_HOLD_UNANSWERED_MIN = 4


def _prompt(request: Any) -> bool:
    """Whether the server answers ``request`` without waiting for a
    holder (everything but an acquire that waits)."""
    return not (request.WhichOneof("op") == "acquire" and request.acquire.wait_ms > 0)


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(
            errors.Indeterminate(
                f"no answer on the session stream within {timeout_s:g} s; "
                "the request may have taken effect"
            )
        )


class Session:
    """The asyncio twin of :class:`baton.session.Session`: one stream, a
    heartbeat task every TTL/3, a reader task, the same safe-until, and a
    resume (following the leader) while it lasts. Open one with
    ``await client.open_session(ttl_s)``."""

    _ledger: Ledger
    _call: Any
    id: bytes
    ttl_s: float

    def __init__(self, client: Client) -> None:
        self._client = client
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self.ended = asyncio.Event()
        #: How many times the stream broke and the session was resumed.
        self.resumes = 0
        self._why: errors.BatonError = SessionEnded("the session is open")
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        # Requests waiting for the writer task, each with the future of
        # its answer (None for a heartbeat's or a withdrawal's).
        self._outbox: list[tuple[Any, asyncio.Future[Any] | None]] = []
        self._queued = asyncio.Event()
        # The requests written that expect a prompt answer and have none
        # yet; those of the last batch written, until one is answered;
        # and whether one of those was.
        self._unanswered: set[int] = set()
        self._last: set[int] = set()
        self._heard = asyncio.Event()

    @classmethod
    async def open(cls, client: Client, ttl_s: float | None = None) -> Session:
        s = cls(client)
        request = pb.OpenSession(batches=True)
        if ttl_s is not None:
            request.ttl_ms = millis(ttl_s, "session ttl")
        sent = time.monotonic()
        s._call, opened = await s._open(request)
        s._ledger = Ledger(opened, sent)
        s.id, s.ttl_s = s._ledger.id, s._ledger.ttl_s
        s._tasks = [
            asyncio.ensure_future(s._read(s._call)),
            asyncio.ensure_future(s._beat()),
            asyncio.ensure_future(s._write()),
        ]
        return s

    async def _open(self, request: Any) -> tuple[Any, Any]:
        client = self._client
        deadline = time.monotonic() + client.timeout_s
        tried: list[str] = []
        unreachable: list[tuple[str, str]] = []
        while True:
            address = await client._ready_server(unreachable)
            call = client._stub(address).Session(metadata=client._metadata)
            try:
                await call.write(pb.SessionRequest(id=0, open=request))
                first = await asyncio.wait_for(call.read(), client.timeout_s)
            except grpc.RpcError as e:
                tried.append(address)
                if _wire.passed_over(client._servers, e, address, unreachable, False, deadline):
                    continue
                pause = client._servers.next_try(e, address, deadline, tried)
                if pause is None:
                    raise map_error(e, address, client.timeout_s) from None
                await asyncio.sleep(pause)
                continue
            except asyncio.TimeoutError:
                call.cancel()
                raise errors.Indeterminate("no answer to opening the session in time") from None
            which = first.WhichOneof("body") if first is not EOF else None
            if which == "opened":
                return call, first.opened
            call.cancel()
            if which == "ended":
                raise SessionEnded(ENDED)
            if which == "error":
                raise request_error(first.error)
            raise errors.Indeterminate(f"unexpected answer to open: {first}")

    async def _read(self, call: Any) -> None:
        try:
            while True:
                response = await call.read()
                if response is EOF:
                    break
                if response.WhichOneof("body") == "batch":
                    for answer in response.batch.answers:
                        self._answered(answer)
                else:
                    self._answered(response)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.PERMISSION_DENIED:
                self._end(errors.PermissionDenied(e.details() or ""))
                return
        except asyncio.CancelledError:
            return
        if not self._closing and not self.ended.is_set():
            await self._resume()

    def _answered(self, response: Any) -> None:
        rid, body, error, ended = self._ledger.read(response)
        if ended:
            self._end(SessionEnded(ENDED))
        future = self._pending.pop(rid, None) if rid is not None else None
        self._unanswered.discard(rid)
        if rid in self._last:
            self._last.clear()
            self._heard.set()
        if future is not None and not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(body)

    async def _resume(self) -> None:
        pending, self._pending = self._pending, {}
        self._ledger.heartbeats.clear()
        # Not written yet: their callers hear "indeterminate" now, and
        # nothing of theirs goes out on the resumed stream.
        self._outbox.clear()
        self._unanswered.clear()
        self._last.clear()
        self._heard.set()
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    errors.Indeterminate(
                        "the session stream broke before an answer came; "
                        "the request may have taken effect"
                    )
                )
        pause = 0.02
        while not self._closing and time.monotonic() < self.safe_until:
            try:
                call, resumed = await self._open(pb.OpenSession(resume=self.id, batches=True))
            except SessionEnded as e:
                self._end(e)
                return
            except errors.BatonError:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            self._ledger.note_revoked(resumed.revoked)
            self._ledger.batches = resumed.batches
            self._call = call
            self.resumes += 1
            self._tasks.append(asyncio.ensure_future(self._read(call)))
            return
        self._end(SessionEnded("the session could not be resumed before its safe-until"))

    async def _beat(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while not self.ended.is_set():
                await asyncio.sleep(self.ttl_s / 3)
                if self._closing:
                    return
                if time.monotonic() >= self.safe_until:
                    self._end(SessionEnded("no heartbeat was acknowledged before the safe-until"))
                    return
                self._send(self._ledger.heartbeat(time.monotonic()))

    def _end(self, why: errors.BatonError) -> None:
        if self.ended.is_set():
            return
        self._why = why
        self.ended.set()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(why)
        self._call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def _withdraw(self, rid: int, answer: asyncio.Future[Any]) -> None:
        """The caller gave up on waiting acquire ``rid``: withdraw the wait,
        then read its answer, and give back a grant that came first (no
        one will hold it)."""
        cancel = pb.CancelWait(acquire_id=rid)
        with contextlib.suppress(Exception):
            self._send(pb.SessionRequest(id=next(self._ids), cancel=cancel))
            body = await asyncio.wait_for(answer, self._client.timeout_s)
            if body.WhichOneof("outcome") == "granted":
                for lease in body.granted.leases:
                    release = pb.ReleaseRequest(
                        resource=lease.resource, acquisition_id=lease.acquisition_id
                    )
                    self._send(pb.SessionRequest(id=next(self._ids), release=release))

    def _send(self, request: Any, answer: asyncio.Future[Any] | None = None) -> None:
        """Queues one request for the writer task, in order; a write that
        fails fails ``answer`` as indeterminate (the reader then resumes
        the session, or ends it)."""
        self._outbox.append((request, answer))
        self._queued.set()

    async def _write(self) -> None:
        """The session's writer: grpc.aio allows one write in flight per
        stream, and each costs more than the request in it, so the
        requests queued while one was written go out together, in one
        batch message when the server takes batches (at most
        ``BATCH_MAX`` to a message).

        With ``BATCH_HOLD_UNANSWERED_MIN`` or more requests written and
        unanswered, and none of the last batch answered yet, the next batch
        is held back until one is, for at most ``BATCH_HOLD_S``: the tasks
        the answers before it wake queue theirs meanwhile, and one larger
        write (and one answer message from the server) replaces several
        small ones. With fewer in flight the hold would only delay the next
        request (two tasks lost a third of their cycles to it). A waiting
        acquire is not waited for."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await self._queued.wait()
                # One turn of the loop first: the tasks already woken
                # (by the answers of one read) queue theirs too.
                await asyncio.sleep(0)
                self._queued.clear()
                while self._outbox:
                    if self._holds_back():
                        await self._hold_for_an_answer()
                    taken = self._outbox[:BATCH_MAX]
                    del self._outbox[:BATCH_MAX]
                    self._heard.clear()
                    self._last = {
                        request.id
                        for request, answer in taken
                        if answer is not None and _prompt(request)
                    }
                    self._unanswered |= self._last
                    failed = await self._write_out([request for request, _ in taken])
                    if failed is None:
                        continue
                    for _, answer in taken:
                        if answer is not None and not answer.done():
                            answer.set_exception(
                                errors.Indeterminate(
                                    f"the session stream broke while the request was written "
                                    f"({failed!r}); the request may have taken effect"
                                )
                            )

    def _holds_back(self) -> bool:
        return (
            bool(self._last)
            and len(self._unanswered) >= BATCH_HOLD_UNANSWERED_MIN
            and self._ledger.batches
        )

    async def _hold_for_an_answer(self) -> None:
        """Until a request of the last batch is answered, ``BATCH_HOLD_S``
        at most."""
        timer = asyncio.get_running_loop().call_later(BATCH_HOLD_S, self._heard.set)
        try:
            await self._heard.wait()
        finally:
            timer.cancel()

    async def _write_out(self, requests: list[Any]) -> Exception | None:
        """Writes ``requests`` on the current stream; what the write
        raised, if it did."""
        try:
            if len(requests) > 1 and self._ledger.batches:
                batch = pb.SessionBatch(requests=requests)
                await self._call.write(pb.SessionRequest(batch=batch))
            else:
                for request in requests:
                    await self._call.write(request)
        except Exception as e:
            return e
        return None

    @property
    def safe_until(self) -> float:
        return self._ledger.safe_until

    def why(self) -> str:
        """Why the session ended (once it did)."""
        return str(self._why)

    def revoked_token(self, resource: str) -> int | None:
        return self._ledger.revoked.get(resource)

    async def _request(self, op: dict[str, Any], timeout_s: float, waits: bool = False) -> Any:
        if self.ended.is_set():
            raise self._why
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[rid] = future
        # A timer, not wait_for: no extra task per request on the hot path.
        expiry = loop.call_later(timeout_s, _expire, future, timeout_s)
        self._send(pb.SessionRequest(id=rid, **op), future)
        try:
            # Shielded, so that a cancelled waiting acquire can still read
            # the answer to its withdrawal.
            return await (asyncio.shield(future) if waits else future)
        except asyncio.CancelledError:
            if waits:
                await self._withdraw(rid, future)
            raise
        finally:
            expiry.cancel()
            self._pending.pop(rid, None)
            self._unanswered.discard(rid)
            self._last.discard(rid)

    async def acquire(
        self,
        resource: str,
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> Lease:
        """Acquires ``resource`` tied to this session (``shared`` or a
        permit as in :meth:`baton.Client.acquire`). Cancelling the task
        that awaits a waiting acquire withdraws the wait on the server."""
        return (await self.acquire_all([resource], wait_s, shared=shared, permits=permits))[0]

    async def acquire_all(
        self,
        resources: Sequence[Claim],
        wait_s: float = 0,
        *,
        shared: bool = False,
        permits: int | None = None,
    ) -> list[Lease]:
        """Acquires every resource or none, tied to this session."""
        acquire, n = _wire.session_acquire(resources, wait_s, self._client.holder, shared, permits)
        # A lease answered to a repeat counts from the first send too.
        sent = time.monotonic()
        budget = sent + self._client.timeout_s + wait_s
        repeat = _wire.repeater(acquire, sent)
        while True:
            resumes = self.resumes
            try:
                body = await self._request(
                    {"acquire": acquire},
                    max(budget - time.monotonic(), 0.001),
                    waits=acquire.wait_ms > 0,
                )
                return granted(body, sent, n)
            except errors.Indeterminate:
                # The stream broke with the answer in flight: the same
                # request again once the session is resumed, marked as a
                # repeat (same request id), until the call's time is up.
                if not await self._resumed_since(resumes, budget):
                    raise
                repeat()

    async def _resumed_since(self, resumes: int, until: float) -> bool:
        """Whether the session was resumed after ``resumes`` resumptions,
        waiting for it until ``until``; False once it ended."""
        while not self.ended.is_set() and time.monotonic() < until:
            if self.resumes > resumes:
                return True
            await asyncio.sleep(0.01)
        return False

    async def release(self, lease: Lease) -> bool:
        body = await self._request(
            {"release": _wire.release_request(lease)}, self._client.timeout_s
        )
        return bool(body.released)

    async def close(self) -> bool:
        """Ends the session, releasing its leases; False if it had ended."""
        if self.ended.is_set():
            return False
        try:
            body = await self._request({"close": pb.CloseSession()}, self._client.timeout_s)
        except SessionEnded:
            return False
        finally:
            self._closing = True
            self._end(SessionEnded("the session was closed"))
        return bool(body.was_open)
