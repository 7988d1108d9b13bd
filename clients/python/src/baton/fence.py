"""The fence kit from Python: thin helpers over psycopg 3 for the fence
kit's SQL functions (``baton.fence``, ``baton.publish``, ``baton.delete``,
``baton.cancel``) and the authoritative generation, in the caller's
connection and transaction. Install with ``pip install
'baton-client[fence]'``; create or upgrade the schema with
``psql -v ON_ERROR_STOP=1 -d app -f crates/fence/sql/install.sql`` (safe to
run again; ``baton_fence::postgres::migrate`` does the same from Rust).

The check and the effect must commit together: call :func:`fence` inside
the transaction that writes the effect, and commit only on ``APPLIED``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from baton.rules import check_resource


class Outcome(str, enum.Enum):
    """What the resource decided, with the Rust fence kit's names."""

    APPLIED = "applied"
    REPLAYED = "replayed"
    STALE = "stale"
    CONFLICT = "conflict"
    CANCELLED = "cancelled"
    DELETED = "deleted"
    MISSING = "missing"
    GENERATION_USED = "generation_used"
    OUT_OF_ORDER = "out_of_order"


@dataclass(frozen=True)
class Decision:
    """One row of ``baton.fence`` and its kin."""

    outcome: Outcome
    #: The token the decision is about (the presented one when applied).
    token: int | None
    #: The resource's recorded generation after the call.
    current_token: int | None
    current_seq: int | None
    detail: str | None
    #: The operation's saved result (returned again on replay).
    result: bytes

    @property
    def ok(self) -> bool:
        """Applied now, or applied before with the same payload."""
        return self.outcome in (Outcome.APPLIED, Outcome.REPLAYED)


def _decision(row: Any) -> Decision:
    if row is None:
        raise RuntimeError("the fence kit returned no row")
    outcome, token, current_token, current_seq, detail, result = row
    return Decision(
        outcome=Outcome(outcome),
        token=token,
        current_token=current_token,
        current_seq=current_seq,
        detail=detail,
        result=bytes(result or b""),
    )


def _token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token < 2**63:
        raise ValueError(f"token {token!r}: it must be an integer in 1..2^63-1")
    return token


def fence(
    conn: Any,
    resource: str,
    token: int,
    operation: str,
    fingerprint: bytes,
    *,
    result: bytes = b"",
    seq: int = 0,
    policy: str = "one_per_generation",
    must_exist: bool = False,
    shared: bool = False,
) -> Decision:
    """Checks ``token`` against ``resource`` and records ``operation``, in
    the connection's current transaction (``baton.fence``).

    ``shared=True`` is a write made under a shared lease (a reader's own
    output, ``baton.fence_shared``): refused only below the last exclusive
    write's token, never because of another reader's; ``seq`` does not
    apply to it."""
    if shared:
        row = conn.execute(
            "SELECT outcome, token, current_token, current_seq, detail, result FROM "
            "baton.fence_shared(resource => %s, token => %s, operation => %s, "
            "fingerprint => %s, result => %s, policy => %s, must_exist => %s)",
            (
                check_resource(resource),
                _token(token),
                operation,
                fingerprint,
                result,
                policy,
                must_exist,
            ),
        ).fetchone()
        return _decision(row)
    row = conn.execute(
        "SELECT outcome, token, current_token, current_seq, detail, result FROM baton.fence("
        "resource => %s, token => %s, operation => %s, fingerprint => %s, result => %s, "
        "seq => %s, policy => %s, must_exist => %s)",
        (
            check_resource(resource),
            _token(token),
            operation,
            fingerprint,
            result,
            seq,
            policy,
            must_exist,
        ),
    ).fetchone()
    return _decision(row)


def publish(
    conn: Any, resource: str, token: int, operation: str, fingerprint: bytes, object_key: str
) -> Decision:
    """Fences and moves the publication pointer to ``object_key`` in one
    statement (``baton.publish``)."""
    row = conn.execute(
        "SELECT outcome, token, current_token, current_seq, detail, result "
        "FROM baton.publish(%s, %s, %s, %s, %s)",
        (check_resource(resource), _token(token), operation, fingerprint, object_key),
    ).fetchone()
    return _decision(row)


def delete(conn: Any, resource: str, token: int, operation: str, fingerprint: bytes) -> Decision:
    """A fenced tombstone (``baton.delete``): later writes below the
    floor are refused, and the generation is never lowered."""
    row = conn.execute(
        "SELECT outcome, token, current_token, current_seq, detail, result "
        "FROM baton.delete(%s, %s, %s, %s)",
        (check_resource(resource), _token(token), operation, fingerprint),
    ).fetchone()
    return _decision(row)


def cancel(conn: Any, resource: str, at_token: int, policy: str = "one_per_generation") -> int:
    """Durable cancellation (``baton.cancel``): every write with a token at
    or below ``at_token`` is refused from now on. Returns the recorded
    cancellation token."""
    row = conn.execute(
        "SELECT baton.cancel(%s, %s, %s)", (check_resource(resource), _token(at_token), policy)
    ).fetchone()
    return int(row[0])


@dataclass(frozen=True)
class Generation:
    """The authoritative state of a resource."""

    generation: int
    published_key: str | None
    published_token: int | None
    deleted: bool


def generation(conn: Any, resource: str) -> Generation | None:
    """The resource's recorded generation and publication pointer, or
    None if the fence kit has never seen it."""
    row = conn.execute(
        "SELECT generation, published_key, published_token, deleted "
        "FROM baton.resources WHERE resource = %s",
        (check_resource(resource),),
    ).fetchone()
    if row is None:
        return None
    return Generation(
        generation=int(row[0]),
        published_key=row[1],
        published_token=row[2],
        deleted=bool(row[3]),
    )
