//! SQLite backend: the rule runs in Rust inside the caller's transaction.
//!
//! Use `BEGIN IMMEDIATE` transactions ([`SqliteFence::write`] does), so the
//! read of the resource row and the write that follows cannot interleave
//! with another writer's.

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::error::{check_prune_age, stored_token as token};
use crate::rule::{self, Decision, OperationRecord, Recreate, ResourceState};
use crate::{
    metrics, FenceError, FenceRequest, FencingToken, Fingerprint, Outcome, Policy, Publication,
    ResourceName, Sequence,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_resources (
    resource       TEXT PRIMARY KEY,
    policy         INTEGER NOT NULL,
    generation     INTEGER NOT NULL,
    seq            INTEGER NOT NULL DEFAULT 0,
    last_operation TEXT,
    cancelled_at   INTEGER,
    deleted        INTEGER NOT NULL DEFAULT 0,
    incarnation    INTEGER NOT NULL DEFAULT 1,
    published_key       TEXT,
    published_token     INTEGER,
    published_operation TEXT
);
CREATE TABLE IF NOT EXISTS baton_operations (
    resource          TEXT NOT NULL,
    operation         TEXT NOT NULL,
    token             INTEGER NOT NULL,
    fingerprint       BLOB NOT NULL,
    result            BLOB NOT NULL,
    recorded_at_unix_s INTEGER NOT NULL DEFAULT (unixepoch()),
    PRIMARY KEY (resource, operation)
);
";

/// The fence kit on SQLite: the rule runs in Rust inside `BEGIN IMMEDIATE`.
pub struct SqliteFence;

impl SqliteFence {
    /// Creates the fence tables if they do not exist.
    pub fn migrate(conn: &Connection) -> Result<(), FenceError> {
        conn.execute_batch(SCHEMA)?;
        // Shared writes (as PostgreSQL's migration 10): a database made by
        // an earlier release gains the column; its rows read as NULL, the
        // last write exclusive.
        let has_column: bool = conn.query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('baton_resources') WHERE name = 'exclusive_token'",
            [],
            |r| r.get(0),
        )?;
        if !has_column {
            conn.execute_batch("ALTER TABLE baton_resources ADD COLUMN exclusive_token INTEGER")?;
        }
        crate::outbox::sqlite::SqliteOutbox::migrate(conn)
    }

    /// The highest token this database has recorded for any resource, or
    /// `None`: see [`crate::postgres::PgFence::highest_token`].
    pub fn highest_token(conn: &Connection) -> Result<Option<FencingToken>, FenceError> {
        let highest: Option<i64> = conn.query_row(
            "SELECT max(
                (SELECT coalesce(max(max(generation, coalesce(cancelled_at, 0), coalesce(published_token, 0))), 0)
                   FROM baton_resources),
                (SELECT coalesce(max(token), 0) FROM baton_operations))",
            [],
            |r| r.get(0),
        )?;
        highest.filter(|t| *t > 0).map(token).transpose()
    }

    /// What `resource` has recorded, if it has a row.
    pub fn state(
        conn: &Connection,
        resource: &ResourceName,
    ) -> Result<Option<ResourceState>, FenceError> {
        let row = conn
            .query_row(
                "SELECT policy, generation, seq, last_operation, cancelled_at, deleted, incarnation,
                        exclusive_token
                 FROM baton_resources WHERE resource = ?1",
                params![resource.as_str()],
                |r| {
                    Ok((
                        r.get::<_, i16>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, Option<i64>>(4)?,
                        r.get::<_, bool>(5)?,
                        r.get::<_, i64>(6)?,
                        r.get::<_, Option<i64>>(7)?,
                    ))
                },
            )
            .optional()?;
        let Some((
            policy,
            generation,
            seq,
            last_operation,
            cancelled_at,
            deleted,
            incarnation,
            exclusive,
        )) = row
        else {
            return Ok(None);
        };
        Ok(Some(ResourceState {
            policy: Policy::from_code(policy)
                .ok_or_else(|| FenceError::Corrupt(format!("policy code {policy}")))?,
            generation: token(generation)?,
            seq: Sequence::new(seq as u64).map_err(|e| FenceError::Corrupt(e.to_string()))?,
            last_operation,
            cancelled_at: cancelled_at.map(token).transpose()?,
            deleted,
            incarnation,
            exclusive: crate::ExclusiveFloor::from_code(exclusive)?,
        }))
    }

    fn put_state(
        tx: &Transaction<'_>,
        resource: &ResourceName,
        s: &ResourceState,
    ) -> Result<(), FenceError> {
        tx.execute(
            "INSERT INTO baton_resources (resource, policy, generation, seq, last_operation, cancelled_at, deleted, incarnation, exclusive_token)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (resource) DO UPDATE SET policy = excluded.policy, generation = excluded.generation,
               seq = excluded.seq, last_operation = excluded.last_operation, cancelled_at = excluded.cancelled_at,
               deleted = excluded.deleted, incarnation = excluded.incarnation, exclusive_token = excluded.exclusive_token",
            params![
                resource.as_str(),
                s.policy.code(),
                s.generation.bigint(),
                s.seq.get(),
                s.last_operation,
                s.cancelled_at.map(FencingToken::bigint),
                s.deleted,
                s.incarnation,
                s.exclusive.code()
            ],
        )?;
        Ok(())
    }

    fn operation(
        tx: &Transaction<'_>,
        req: &FenceRequest,
    ) -> Result<Option<OperationRecord>, FenceError> {
        let row = tx
            .query_row(
                "SELECT token, fingerprint, result FROM baton_operations WHERE resource = ?1 AND operation = ?2",
                params![req.resource.as_str(), req.operation.as_str()],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, Vec<u8>>(2)?)),
            )
            .optional()?;
        row.map(|(t, fp, result)| {
            Ok(OperationRecord {
                token: token(t)?,
                fingerprint: Fingerprint::new(&fp)
                    .map_err(|e| FenceError::Corrupt(e.to_string()))?,
                result,
            })
        })
        .transpose()
    }

    /// Judges `req` inside `tx` and, if it applies, advances the resource and
    /// saves the operation record. The caller's effect belongs in the same
    /// transaction, after an [`Outcome::Applied`].
    pub fn fence(tx: &Transaction<'_>, req: &FenceRequest) -> Result<Outcome, FenceError> {
        Self::fence_then(tx, req, |_, _| Ok(()))
    }

    fn fence_then(
        tx: &Transaction<'_>,
        req: &FenceRequest,
        adjust: impl FnOnce(&mut ResourceState, &Outcome) -> Result<(), FenceError>,
    ) -> Result<Outcome, FenceError> {
        let judging = metrics::Judging::start(req);
        let span = judging.span().clone();
        let _in = span.enter();
        let state = Self::state(tx, &req.resource)?;
        let existing = Self::operation(tx, req)?;
        let outcome = match rule::decide(state.as_ref(), existing.as_ref(), req)? {
            Decision::Refuse(outcome) => outcome,
            Decision::Apply { outcome, mut next } => {
                adjust(&mut next, &outcome)?;
                Self::put_state(tx, &req.resource, &next)?;
                tx.execute(
                    "INSERT INTO baton_operations (resource, operation, token, fingerprint, result) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![req.resource.as_str(), req.operation.as_str(), req.token.bigint(), req.fingerprint.as_bytes(), req.result],
                )?;
                outcome
            }
        };
        metrics::record(req, &outcome, judging);
        Ok(outcome)
    }

    /// Opens an immediate transaction, judges `req`, runs `effect` only if it
    /// applied, and commits. If `effect` fails nothing is kept: no operation
    /// record without its effect.
    pub fn write<E>(
        conn: &mut Connection,
        req: &FenceRequest,
        effect: impl FnOnce(&Transaction<'_>) -> Result<(), E>,
    ) -> Result<Outcome, E>
    where
        E: From<FenceError>,
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(FenceError::from)?;
        let outcome = Self::fence(&tx, req)?;
        if outcome.is_applied() {
            effect(&tx)?;
        }
        tx.commit().map_err(FenceError::from)?;
        Ok(outcome)
    }

    /// A fenced update of the resource's publication pointer to `req.result`
    /// (an object key), with its operation record, in one transaction.
    pub fn publish(conn: &mut Connection, req: &FenceRequest) -> Result<Outcome, FenceError> {
        Self::publish_with(conn, req, |_| Ok(()))
    }

    /// [`SqliteFence::publish`] with the caller's `effect` in the same
    /// transaction, run only if the publish applied (an outbox intent:
    /// [`crate::outbox::sqlite::SqliteOutbox::enqueue`]).
    pub fn publish_with<E>(
        conn: &mut Connection,
        req: &FenceRequest,
        effect: impl FnOnce(&Transaction<'_>) -> Result<(), E>,
    ) -> Result<Outcome, E>
    where
        E: From<FenceError>,
    {
        req.exclusive_only("publish").map_err(FenceError::from)?;
        let object_key = String::from_utf8(req.result.clone()).map_err(|_| {
            FenceError::from(crate::InputError::ControlCharacter {
                field: "object key",
                at_byte: 0,
            })
        })?;
        Self::write(conn, req, |tx| {
            tx.execute(
                "UPDATE baton_resources SET published_key = ?2, published_token = ?3, published_operation = ?4
                 WHERE resource = ?1",
                params![req.resource.as_str(), object_key, req.token.bigint(), req.operation.as_str()],
            )
            .map_err(FenceError::from)?;
            effect(tx)
        })
    }

    /// The publication pointer of `resource`, if it has one.
    pub fn publication(
        conn: &Connection,
        resource: &ResourceName,
    ) -> Result<Option<Publication>, FenceError> {
        let row = conn
            .query_row(
                "SELECT published_key, published_token, published_operation FROM baton_resources
                 WHERE resource = ?1 AND published_key IS NOT NULL",
                params![resource.as_str()],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()?;
        row.map(|(object_key, t, operation)| {
            Ok(Publication {
                object_key,
                token: token(t)?,
                operation,
            })
        })
        .transpose()
    }

    /// A fenced deletion: judged like a write, then the row becomes a
    /// tombstone that keeps its generation floor.
    pub fn delete(conn: &mut Connection, req: &FenceRequest) -> Result<Outcome, FenceError> {
        req.exclusive_only("delete")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outcome = Self::fence_then(&tx, req, |next, _| {
            next.deleted = true;
            Ok(())
        })?;
        tx.commit()?;
        Ok(outcome)
    }

    /// Starts a new incarnation of a deleted resource, above its floor.
    pub fn recreate(
        conn: &mut Connection,
        resource: &ResourceName,
        token: FencingToken,
    ) -> Result<Recreate, FenceError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some(state) = Self::state(&tx, resource)? else {
            return Ok(Recreate::NotDeleted);
        };
        let (outcome, next) = rule::recreate(&state, token);
        if let Some(next) = next {
            Self::put_state(&tx, resource, &next)?;
        }
        tx.commit()?;
        Ok(outcome)
    }

    /// Durable cancellation: refuses every token at or below `at` from now on.
    pub fn cancel(
        conn: &mut Connection,
        resource: &ResourceName,
        policy: Policy,
        at: FencingToken,
    ) -> Result<ResourceState, FenceError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let next = Self::cancel_in(&tx, resource, policy, at)?;
        tx.commit()?;
        Ok(next)
    }

    /// [`SqliteFence::cancel`] in the caller's transaction (with the
    /// outbox's cancellation, [`crate::outbox::sqlite::SqliteOutbox::cancel`]).
    pub fn cancel_in(
        tx: &Transaction<'_>,
        resource: &ResourceName,
        policy: Policy,
        at: FencingToken,
    ) -> Result<ResourceState, FenceError> {
        let next = rule::cancel(Self::state(tx, resource)?.as_ref(), policy, at);
        Self::put_state(tx, resource, &next)?;
        tracing::info!(%resource, at = %at, "resource cancelled");
        Ok(next)
    }

    /// Deletes operation records older than `min_age_s` (at least an hour).
    /// A retry of a pruned operation is then judged afresh, which the
    /// generation floor keeps safe (stale or generation used), but it no
    /// longer gets its saved result back.
    pub fn prune_operations(conn: &Connection, min_age_s: u64) -> Result<usize, FenceError> {
        check_prune_age(min_age_s)?;
        Ok(conn.execute(
            "DELETE FROM baton_operations WHERE recorded_at_unix_s < unixepoch() - ?1",
            params![min_age_s as i64],
        )?)
    }
}
