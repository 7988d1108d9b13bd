//! The outbox on SQLite: the rules of `sql/008_outbox.sql`, in Rust, each
//! call in its own `BEGIN IMMEDIATE` transaction except
//! [`SqliteOutbox::enqueue`] and [`SqliteOutbox::cancel`], which join the
//! caller's (the fenced write's, the cancellation's).

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use sha2::Digest;

use super::{
    hex, Delivery, DeliveryEvent, DeliveryState, Filter, Intent, Report, Resolution, Step,
    StepOutcome,
};
use crate::{FenceError, FencingToken, ResourceName};

mod queries;
mod rows;

use rows::*;

/// The outbox on SQLite.
pub struct SqliteOutbox;

impl SqliteOutbox {
    /// Creates the outbox tables if they do not exist.
    pub fn migrate(conn: &Connection) -> Result<(), FenceError> {
        conn.execute_batch(SCHEMA)?;
        Ok(())
    }

    /// [`super::postgres::PgOutbox::enqueue`]: in the caller's transaction,
    /// after its fence or publish applied.
    pub fn enqueue(
        tx: &Transaction<'_>,
        resource: &ResourceName,
        token: FencingToken,
        intent: &Intent,
    ) -> Result<Step, FenceError> {
        if let Some(refused) = Self::fence_refusal(tx, resource, token)? {
            return Ok(refused);
        }
        let digest = sha2::Sha256::digest(&intent.payload).to_vec();
        let existing: Option<(i64, Vec<u8>, String, String, String)> = tx
            .query_row(
                "SELECT id, payload_digest, recipient, receiver_kind, resource FROM baton_outbox WHERE operation = ?1",
                [&intent.operation],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        if let Some(existing) = existing {
            return Self::replay(tx, existing, resource, intent, &digest);
        }
        tx.execute(
            &format!(
                "INSERT INTO baton_outbox (operation, resource, token, receiver_kind, recipient, payload, payload_digest,
                     next_attempt_ms, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW_MS}, {NOW_MS}, {NOW_MS})"
            ),
            params![
                intent.operation,
                resource.as_str(),
                token.bigint(),
                intent.kind.as_str(),
                intent.recipient,
                intent.payload,
                digest
            ],
        )?;
        let id = tx.last_insert_rowid();
        let what = format!("{} {}", intent.kind, intent.recipient);
        event(tx, id, Some(token.bigint()), None, "enqueued", Some(&what))?;
        Ok(Step {
            outcome: StepOutcome::Enqueued,
            id: Some(id),
            state: Some(DeliveryState::Pending),
            claim_token: Some(0),
            attempts: Some(0),
            detail: None,
        })
    }

    /// Why a fenced write may not enqueue under `token`, if it may not:
    /// no fenced write yet, cancelled at or above it, or a stale token.
    fn fence_refusal(
        tx: &Transaction<'_>,
        resource: &ResourceName,
        token: FencingToken,
    ) -> Result<Option<Step>, FenceError> {
        let fenced: Option<(i64, Option<i64>, bool)> = tx
            .query_row(
                "SELECT generation, cancelled_at, deleted FROM baton_resources WHERE resource = ?1",
                [resource.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let refused = |outcome, detail: String| {
            Step {
                detail: Some(detail),
                ..missing(None)
            }
            .with(outcome)
        };
        let Some((generation, cancelled_at, deleted)) = fenced else {
            return Ok(Some(refused(
                StepOutcome::Missing,
                format!("resource {resource} has no fenced write; enqueue after a fence or publish applied"),
            )));
        };
        if cancelled_at.is_some_and(|c| c >= token.bigint()) {
            return Ok(Some(refused(
                StepOutcome::Cancelled,
                format!(
                    "resource cancelled at token {}",
                    cancelled_at.unwrap_or_default()
                ),
            )));
        }
        if deleted || generation != token.bigint() {
            return Ok(Some(refused(
                StepOutcome::Stale,
                format!("token {token} is not the resource's generation {generation}"),
            )));
        }
        Ok(None)
    }

    /// An operation id seen before: `exists` if the intent is the same,
    /// `conflict` if it is not.
    fn replay(
        tx: &Transaction<'_>,
        existing: (i64, Vec<u8>, String, String, String),
        resource: &ResourceName,
        intent: &Intent,
        digest: &[u8],
    ) -> Result<Step, FenceError> {
        let (id, d, recipient, kind, res) = existing;
        let current =
            load(tx, "id", &id)?.ok_or_else(|| FenceError::Corrupt("row vanished".into()))?;
        let same = d == digest
            && recipient == intent.recipient
            && kind == intent.kind.as_str()
            && res == resource.as_str();
        let mut step = current.step(if same {
            StepOutcome::Exists
        } else {
            StepOutcome::Conflict
        });
        if !same {
            step.detail = Some(
                "the operation id was enqueued with a different resource, receiver, recipient or payload".into(),
            );
        }
        Ok(step)
    }

    fn immediate<T>(
        conn: &mut Connection,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, FenceError>,
    ) -> Result<T, FenceError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// [`super::postgres::PgOutbox::claim`].
    pub fn claim(
        conn: &mut Connection,
        id: i64,
        token: FencingToken,
        claimed_by: &str,
    ) -> Result<Step, FenceError> {
        crate::types::text("claimed_by", claimed_by, 256)?;
        Self::immediate(conn, |tx| {
            let Some(c) = load(tx, "id", &id)? else {
                return Ok(missing(Some(id)));
            };
            if token.bigint() <= c.claim_token {
                return Ok(c.step(StepOutcome::Stale));
            }
            if c.state.is_final() {
                return Ok(c.step(StepOutcome::Final));
            }
            if !c.due {
                return Ok(c.step(StepOutcome::NotDue));
            }
            let state = if c.state == DeliveryState::Pending {
                DeliveryState::Claimed
            } else {
                c.state
            };
            tx.execute(
                &format!(
                    "UPDATE baton_outbox SET claim_token = ?2, claimed_by = ?3, state = ?4, updated_ms = {NOW_MS} WHERE id = ?1"
                ),
                params![id, token.bigint(), claimed_by, state.as_str()],
            )?;
            let was = format!("was {}", c.state);
            event(
                tx,
                id,
                Some(token.bigint()),
                Some(claimed_by),
                "claimed",
                Some(&was),
            )?;
            Ok(Step {
                outcome: StepOutcome::Claimed,
                id: Some(id),
                state: Some(state),
                claim_token: Some(token.bigint()),
                attempts: Some(c.attempts),
                detail: Some(c.state.as_str().to_string()),
            })
        })
    }

    /// [`super::postgres::PgOutbox::begin_send`].
    pub fn begin_send(
        conn: &mut Connection,
        id: i64,
        token: FencingToken,
    ) -> Result<Step, FenceError> {
        Self::immediate(conn, |tx| {
            let Some(c) = load(tx, "id", &id)? else {
                return Ok(missing(Some(id)));
            };
            if c.claim_token != token.bigint() {
                return Ok(c.step(StepOutcome::Stale));
            }
            if c.state == DeliveryState::Cancelled {
                event(
                    tx,
                    id,
                    Some(token.bigint()),
                    c.claimed_by.as_deref(),
                    "not_sent",
                    Some("cancelled before the send began"),
                )?;
                return Ok(c.step(StepOutcome::Cancelled));
            }
            if c.state.is_final() {
                return Ok(c.step(StepOutcome::Final));
            }
            tx.execute(
                &format!(
                    "UPDATE baton_outbox SET state = 'sending', attempts = attempts + 1, send_started_ms = {NOW_MS},
                         updated_ms = {NOW_MS} WHERE id = ?1"
                ),
                [id],
            )?;
            let n = format!("attempt {}", c.attempts + 1);
            event(
                tx,
                id,
                Some(token.bigint()),
                c.claimed_by.as_deref(),
                "sending",
                Some(&n),
            )?;
            Ok(Step {
                state: Some(DeliveryState::Sending),
                attempts: Some(c.attempts + 1),
                ..c.step(StepOutcome::Sending)
            })
        })
    }

    /// [`super::postgres::PgOutbox::record`].
    pub fn record(
        conn: &mut Connection,
        id: i64,
        token: FencingToken,
        report: Report,
        evidence: &str,
    ) -> Result<Step, FenceError> {
        let step = Self::record_in(conn, id, token, report, evidence)?;
        crate::metrics::outbox_recorded(report, &step);
        Ok(step)
    }

    fn record_in(
        conn: &mut Connection,
        id: i64,
        token: FencingToken,
        report: Report,
        evidence: &str,
    ) -> Result<Step, FenceError> {
        Self::immediate(conn, |tx| {
            let Some(c) = load(tx, "id", &id)? else {
                return Ok(missing(Some(id)));
            };
            if c.claim_token != token.bigint() {
                let why = format!(
                    "{} from token {} refused: the row is claimed by token {}",
                    report.label(),
                    token,
                    c.claim_token
                );
                event(
                    tx,
                    id,
                    Some(token.bigint()),
                    None,
                    "refused_stale_outcome",
                    Some(&why),
                )?;
                return Ok(c.step(StepOutcome::Stale));
            }
            if c.state.is_final() {
                let why = format!("{} after the row became {}", report.label(), c.state);
                event(
                    tx,
                    id,
                    Some(token.bigint()),
                    c.claimed_by.as_deref(),
                    "ignored_outcome",
                    Some(&why),
                )?;
                return Ok(c.step(StepOutcome::Final));
            }
            let state = report.state();
            tx.execute(
                &format!(
                    "UPDATE baton_outbox SET state = ?2, evidence = ?3, updated_ms = {NOW_MS},
                         next_attempt_ms = {NOW_MS} + ?4 WHERE id = ?1"
                ),
                params![id, state.as_str(), evidence, report.after_ms() as i64],
            )?;
            event(
                tx,
                id,
                Some(token.bigint()),
                c.claimed_by.as_deref(),
                report.label(),
                Some(evidence),
            )?;
            Ok(Step {
                state: Some(state),
                ..c.step(StepOutcome::Recorded)
            })
        })
    }

    /// [`super::postgres::PgOutbox::confirm`].
    pub fn confirm(
        conn: &mut Connection,
        operation: &str,
        delivered: bool,
        evidence: &str,
    ) -> Result<Step, FenceError> {
        Self::immediate(conn, |tx| {
            let Some(c) = load(tx, "operation", &operation)? else {
                return Ok(missing(None));
            };
            let state = if delivered {
                DeliveryState::Delivered
            } else {
                DeliveryState::Failed
            };
            if c.state.is_final() || (c.state == DeliveryState::Pending && c.attempts == 0) {
                let why = format!("{state} while {}: {evidence}", c.state);
                event(tx, c.id, None, None, "ignored_callback", Some(&why))?;
                return Ok(c.step(StepOutcome::Ignored));
            }
            tx.execute(
                &format!("UPDATE baton_outbox SET state = ?2, evidence = ?3, updated_ms = {NOW_MS} WHERE id = ?1"),
                params![c.id, state.as_str(), evidence],
            )?;
            let what = format!("{state}: {evidence}");
            event(tx, c.id, None, None, "confirmed", Some(&what))?;
            Ok(Step {
                state: Some(state),
                ..c.step(StepOutcome::Confirmed)
            })
        })
    }

    /// [`super::postgres::PgOutbox::cancel`], in the caller's transaction.
    pub fn cancel(
        tx: &Transaction<'_>,
        resource: &ResourceName,
        actor: &str,
    ) -> Result<u64, FenceError> {
        let rows: Vec<(i64, String)> = tx
            .prepare("SELECT id, state FROM baton_outbox WHERE resource = ?1 ORDER BY id")?
            .query_map([resource.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut n = 0;
        for (id, state) in rows {
            match state.as_str() {
                "pending" | "claimed" => {
                    set_state(tx, id, DeliveryState::Cancelled)?;
                    tx.execute(
                        "UPDATE baton_outbox SET evidence = ?2 WHERE id = ?1",
                        params![id, format!("cancelled by {actor}")],
                    )?;
                    event(
                        tx,
                        id,
                        None,
                        Some(actor),
                        "cancelled",
                        Some("before the send"),
                    )?;
                    n += 1;
                }
                "sending" | "accepted" => event(
                    tx,
                    id,
                    None,
                    Some(actor),
                    "cancel_too_late",
                    Some("the send had begun"),
                )?,
                _ => {}
            }
        }
        Ok(n)
    }

    /// [`super::postgres::PgOutbox::resolve`].
    pub fn resolve(
        conn: &mut Connection,
        id: i64,
        resolution: Resolution,
        actor: &str,
        reason: &str,
    ) -> Result<Step, FenceError> {
        if actor.trim().is_empty() || reason.trim().is_empty() {
            return Err(crate::InputError::Empty {
                field: "a resolution's actor or reason (a resolution names who made it and why)",
            }
            .into());
        }
        Self::immediate(conn, |tx| {
            let Some(c) = load(tx, "id", &id)? else {
                return Ok(missing(Some(id)));
            };
            if !matches!(
                c.state,
                DeliveryState::NeedsAttention | DeliveryState::Failed
            ) {
                let mut step = c.step(StepOutcome::NotResolvable);
                step.detail = Some(format!(
                    "only needs_attention and failed deliveries are resolved; this one is {}",
                    c.state
                ));
                return Ok(step);
            }
            let state = resolution.state();
            tx.execute(
                &format!(
                    "UPDATE baton_outbox SET state = ?2, resolved_by = ?3, resolved_ms = {NOW_MS}, resolution = ?4,
                         resolution_reason = ?5, next_attempt_ms = {NOW_MS}, updated_ms = {NOW_MS} WHERE id = ?1"
                ),
                params![id, state.as_str(), actor, resolution.label(), reason],
            )?;
            let what = format!("resolved_{}", resolution.label());
            event(tx, id, None, Some(actor), &what, Some(reason))?;
            Ok(Step {
                state: Some(state),
                ..c.step(StepOutcome::Resolved)
            })
        })
    }
}

impl Step {
    fn with(mut self, outcome: StepOutcome) -> Self {
        self.outcome = outcome;
        self
    }
}
