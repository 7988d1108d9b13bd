//! The outbox's tables on SQLite and their rows: the schema, a row as a
//! delivery, the row a step locks, and the history's events.

use super::*;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS baton_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    operation       TEXT NOT NULL UNIQUE,
    resource        TEXT NOT NULL,
    token           INTEGER NOT NULL,
    receiver_kind   TEXT NOT NULL CHECK (receiver_kind IN ('idempotent', 'unrepeatable')),
    recipient       TEXT NOT NULL,
    payload         BLOB NOT NULL,
    payload_digest  BLOB NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    claim_token     INTEGER NOT NULL DEFAULT 0,
    claimed_by      TEXT,
    next_attempt_ms INTEGER NOT NULL,
    send_started_ms INTEGER,
    evidence        TEXT,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    resolved_by     TEXT,
    resolved_ms     INTEGER,
    resolution      TEXT,
    resolution_reason TEXT
);
CREATE INDEX IF NOT EXISTS baton_outbox_resource ON baton_outbox (resource);
CREATE TABLE IF NOT EXISTS baton_outbox_events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    outbox_id INTEGER NOT NULL REFERENCES baton_outbox (id),
    at_ms     INTEGER NOT NULL,
    token     INTEGER,
    actor     TEXT,
    event     TEXT NOT NULL,
    detail    TEXT
);
";

/// The database's clock, in milliseconds since the epoch.
pub(super) const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

pub(super) fn at(column: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', {column} / 1000.0, 'unixepoch')")
}

pub(super) fn columns() -> String {
    format!(
        "id, operation, resource, token, receiver_kind, recipient, payload_digest, state, attempts,
         claim_token, claimed_by, evidence, {}, {}, {}, resolved_by, {}, resolution, resolution_reason",
        at("created_ms"),
        at("send_started_ms"),
        at("next_attempt_ms"),
        at("resolved_ms")
    )
}

pub(super) fn delivery(r: &rusqlite::Row<'_>) -> rusqlite::Result<Delivery> {
    let digest: Vec<u8> = r.get(6)?;
    Ok(Delivery {
        id: r.get(0)?,
        operation: r.get(1)?,
        resource: r.get(2)?,
        token: r.get(3)?,
        receiver_kind: r.get(4)?,
        recipient: r.get(5)?,
        payload_sha256: hex(&digest),
        state: r.get(7)?,
        attempts: r.get(8)?,
        claim_token: r.get(9)?,
        claimed_by: r.get(10)?,
        evidence: r.get(11)?,
        created_at: r.get(12)?,
        send_started_at: r.get(13)?,
        next_attempt_at: r.get(14)?,
        resolved_by: r.get(15)?,
        resolved_at: r.get(16)?,
        resolution: r.get(17)?,
        resolution_reason: r.get(18)?,
    })
}

/// The fields of a row the rules read.
pub(super) struct Current {
    pub(super) id: i64,
    pub(super) state: DeliveryState,
    pub(super) claim_token: i64,
    pub(super) attempts: i32,
    pub(super) claimed_by: Option<String>,
    pub(super) due: bool,
}

impl Current {
    pub(super) fn step(&self, outcome: StepOutcome) -> Step {
        Step {
            outcome,
            id: Some(self.id),
            state: Some(self.state),
            claim_token: Some(self.claim_token),
            attempts: Some(self.attempts),
            detail: None,
        }
    }
}

pub(super) fn missing(id: Option<i64>) -> Step {
    Step {
        outcome: StepOutcome::Missing,
        id,
        state: None,
        claim_token: None,
        attempts: None,
        detail: None,
    }
}

pub(super) fn load(
    tx: &Transaction<'_>,
    key: &str,
    value: &dyn rusqlite::ToSql,
) -> Result<Option<Current>, FenceError> {
    let sql = format!(
        "SELECT id, state, claim_token, attempts, claimed_by, next_attempt_ms <= {NOW_MS}
         FROM baton_outbox WHERE {key} = ?1"
    );
    let row = tx
        .query_row(&sql, [value], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i32>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, bool>(5)?,
            ))
        })
        .optional()?;
    row.map(|(id, state, claim_token, attempts, claimed_by, due)| {
        Ok(Current {
            id,
            state: DeliveryState::parse(&state)
                .ok_or_else(|| FenceError::Corrupt(format!("outbox state {state:?}")))?,
            claim_token,
            attempts,
            claimed_by,
            due,
        })
    })
    .transpose()
}

pub(super) fn event(
    tx: &Transaction<'_>,
    id: i64,
    token: Option<i64>,
    actor: Option<&str>,
    what: &str,
    detail: Option<&str>,
) -> Result<(), FenceError> {
    tx.execute(
        &format!(
            "INSERT INTO baton_outbox_events (outbox_id, at_ms, token, actor, event, detail)
             VALUES (?1, {NOW_MS}, ?2, ?3, ?4, ?5)"
        ),
        params![id, token, actor, what, detail],
    )?;
    Ok(())
}

pub(super) fn set_state(
    tx: &Transaction<'_>,
    id: i64,
    state: DeliveryState,
) -> Result<(), FenceError> {
    tx.execute(
        &format!("UPDATE baton_outbox SET state = ?2, updated_ms = {NOW_MS} WHERE id = ?1"),
        params![id, state.as_str()],
    )?;
    Ok(())
}
