//! The service's durable state in SQLite: account data (the input), jobs
//! (what customers and operators see), and each worker's recorded outcome.
//! The fence kit's tables live in the same database.

use std::path::Path;

use baton_fence::sqlite::SqliteFence;
use rusqlite::{params, Connection, OptionalExtension};

pub type Result<T> = std::result::Result<T, String>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS accounts (
    account       TEXT NOT NULL,
    date          TEXT NOT NULL,
    version       INTEGER NOT NULL,
    balance_cents INTEGER NOT NULL,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS jobs (
    account TEXT NOT NULL,
    date    TEXT NOT NULL,
    state   TEXT NOT NULL CHECK (state IN ('pending', 'generating', 'published', 'needs_attention', 'cancelled')),
    token   INTEGER,
    detail  TEXT,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS worker_outcomes (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    worker  TEXT NOT NULL,
    account TEXT NOT NULL,
    date    TEXT NOT NULL,
    token   INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    detail  TEXT NOT NULL
);
";

pub fn open(path: &Path) -> Result<Connection> {
    let conn =
        Connection::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| e.to_string())?;
    conn.execute_batch(SCHEMA).map_err(|e| e.to_string())?;
    SqliteFence::migrate(&conn).map_err(|e| e.to_string())?;
    Ok(conn)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub account: String,
    pub date: String,
    pub state: String,
    pub token: Option<i64>,
    pub detail: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub version: i64,
    pub balance_cents: i64,
}

/// Creates or updates an account's data (bumping its version) and queues a job.
pub fn seed(conn: &Connection, account: &str, date: &str, balance_cents: i64) -> Result<i64> {
    conn.execute(
        "INSERT INTO accounts (account, date, version, balance_cents) VALUES (?1, ?2, 1, ?3)
         ON CONFLICT (account, date) DO UPDATE SET version = version + 1, balance_cents = excluded.balance_cents",
        params![account, date, balance_cents],
    )
    .map_err(|e| e.to_string())?;
    conn.execute(
        "INSERT INTO jobs (account, date, state) VALUES (?1, ?2, 'pending') ON CONFLICT (account, date) DO NOTHING",
        params![account, date],
    )
    .map_err(|e| e.to_string())?;
    Ok(input(conn, account, date)?.map_or(0, |i| i.version))
}

pub fn input(conn: &Connection, account: &str, date: &str) -> Result<Option<Input>> {
    conn.query_row(
        "SELECT version, balance_cents FROM accounts WHERE account = ?1 AND date = ?2",
        params![account, date],
        |r| {
            Ok(Input {
                version: r.get(0)?,
                balance_cents: r.get(1)?,
            })
        },
    )
    .optional()
    .map_err(|e| e.to_string())
}

pub fn job(conn: &Connection, account: &str, date: &str) -> Result<Option<Job>> {
    conn.query_row(
        "SELECT account, date, state, token, detail FROM jobs WHERE account = ?1 AND date = ?2",
        params![account, date],
        |r| {
            Ok(Job {
                account: r.get(0)?,
                date: r.get(1)?,
                state: r.get(2)?,
                token: r.get(3)?,
                detail: r.get(4)?,
            })
        },
    )
    .optional()
    .map_err(|e| e.to_string())
}

/// Jobs a worker may pick up: pending, or generating by a worker that may have died.
pub fn open_jobs(conn: &Connection) -> Result<Vec<(String, String)>> {
    let mut stmt = conn
        .prepare("SELECT account, date FROM jobs WHERE state IN ('pending', 'generating') ORDER BY account, date")
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(|e| e.to_string())?;
    rows.collect::<std::result::Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// Moves a job to `state` unless it was cancelled or already published:
/// both are final, and a worker must never undo an operator's cancel.
pub fn set_state(
    conn: &Connection,
    account: &str,
    date: &str,
    state: &str,
    token: i64,
    detail: &str,
) -> Result<bool> {
    let n = conn
        .execute(
            "UPDATE jobs SET state = ?3, token = ?4, detail = ?5
             WHERE account = ?1 AND date = ?2 AND state NOT IN ('cancelled', 'published')",
            params![account, date, state, token, detail],
        )
        .map_err(|e| e.to_string())?;
    Ok(n == 1)
}

pub fn cancel_job(conn: &Connection, account: &str, date: &str) -> Result<bool> {
    let n = conn
        .execute(
            "UPDATE jobs SET state = 'cancelled', detail = 'cancelled by operator' WHERE account = ?1 AND date = ?2",
            params![account, date],
        )
        .map_err(|e| e.to_string())?;
    Ok(n == 1)
}

pub fn record_outcome(
    conn: &Connection,
    worker: &str,
    account: &str,
    date: &str,
    token: i64,
    outcome: &str,
    detail: &str,
) -> Result<()> {
    conn.execute(
        "INSERT INTO worker_outcomes (worker, account, date, token, outcome, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![worker, account, date, token, outcome, detail],
    )
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Every worker outcome for a statement, oldest first: (worker, token, outcome, detail).
pub fn outcomes(
    conn: &Connection,
    account: &str,
    date: &str,
) -> Result<Vec<(String, i64, String, String)>> {
    let mut stmt = conn
        .prepare("SELECT worker, token, outcome, detail FROM worker_outcomes WHERE account = ?1 AND date = ?2 ORDER BY id")
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map(params![account, date], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .map_err(|e| e.to_string())?;
    rows.collect::<std::result::Result<_, _>>()
        .map_err(|e| e.to_string())
}
