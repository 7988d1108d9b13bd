//! The SQLite dialect of the store.

use anyhow::Context;
use std::path::Path;

use baton_fence::objects::{ObjectKit, Rejection};
use baton_fence::outbox::sqlite::SqliteOutbox;
use baton_fence::outbox::Intent;
use baton_fence::sqlite::SqliteFence;
use baton_fence::{FenceRequest, FencingToken, Outcome, Policy, Publication, ResourceName};
use rusqlite::{params, Connection, OptionalExtension};

#[cfg(feature = "chaos")]
use super::LoggedPublication;
use super::{check_enqueued, err, Input, Job, JobState, Outbox, Result, Store};

const SQLITE_SCHEMA: &str = "
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

/// The publication log: every move of a publication pointer, appended by a
/// trigger in the same transaction as the move, so its order is the commit
/// order per resource. It is the fault suite's record of what the resource
/// accepted; nothing in the service reads it.
const SQLITE_LOG: &str = "
CREATE TABLE IF NOT EXISTS publication_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    resource   TEXT NOT NULL,
    token      INTEGER NOT NULL,
    operation  TEXT NOT NULL,
    object_key TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS publication_log_insert AFTER INSERT ON baton_resources
WHEN NEW.published_operation IS NOT NULL
BEGIN
    INSERT INTO publication_log (resource, token, operation, object_key)
    VALUES (NEW.resource, NEW.published_token, NEW.published_operation, NEW.published_key);
END;
CREATE TRIGGER IF NOT EXISTS publication_log_update
AFTER UPDATE OF published_key, published_token, published_operation ON baton_resources
WHEN NEW.published_operation IS NOT NULL
BEGIN
    INSERT INTO publication_log (resource, token, operation, object_key)
    VALUES (NEW.resource, NEW.published_token, NEW.published_operation, NEW.published_key);
END;
";

/// Every row of a SQLite query, mapped.
fn all_rows<T>(
    c: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = c.prepare(sql).map_err(err)?;
    let rows = stmt.query_map(params, map).map_err(err)?;
    rows.collect::<std::result::Result<_, _>>().map_err(err)
}

/// A SQLite database file (WAL mode, 30 s busy timeout).
pub struct SqliteDb(Connection);

impl SqliteDb {
    pub fn open(path: &Path) -> Result<Self> {
        let conn =
            Connection::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.execute_batch(SQLITE_SCHEMA).map_err(err)?;
        SqliteFence::migrate(&conn).map_err(err)?;
        conn.execute_batch(SQLITE_LOG).map_err(err)?;
        Ok(Self(conn))
    }

    /// A database that exists, for reading: not created, not migrated.
    pub fn open_existing(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(crate::NoSuchJob(format!(
                "no statements database at {}: nothing to read (`statements seed` and the worker create it; --db names another)",
                path.display()
            ))
            .into());
        }
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .with_context(|| format!("cannot open {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(err)?;
        Ok(Self(conn))
    }
}

#[async_trait::async_trait(?Send)]
impl Store for SqliteDb {
    async fn seed(&self, account: &str, date: &str, balance_cents: i64) -> Result<i64> {
        let c = &self.0;
        {
            c.execute(
                    "INSERT INTO accounts (account, date, version, balance_cents) VALUES (?1, ?2, 1, ?3)
                     ON CONFLICT (account, date) DO UPDATE SET version = version + 1, balance_cents = excluded.balance_cents",
                    params![account, date, balance_cents],
                )
                .map_err(err)?;
            c.execute(
                    "INSERT INTO jobs (account, date, state) VALUES (?1, ?2, 'pending') ON CONFLICT (account, date) DO NOTHING",
                    params![account, date],
                )
                .map_err(err)?;
        }
        Ok(self.input(account, date).await?.map_or(0, |i| i.version))
    }

    async fn input(&self, account: &str, date: &str) -> Result<Option<Input>> {
        let c = &self.0;
        c.query_row(
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
        .map_err(err)
    }

    async fn job(&self, account: &str, date: &str) -> Result<Option<Job>> {
        let c = &self.0;
        c.query_row(
            "SELECT account, date, state, token, detail FROM jobs WHERE account = ?1 AND date = ?2",
            params![account, date],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get(3)?,
                    r.get(4)?,
                ))
            },
        )
        .optional()
        .map_err(err)?
        .map(|(account, date, state, token, detail)| {
            Ok(Job {
                account,
                date,
                state: JobState::parse(&state)?,
                token,
                detail,
            })
        })
        .transpose()
    }

    async fn open_jobs(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let c = &self.0;
        {
            all_rows(c, "SELECT account, date FROM jobs WHERE state IN ('pending', 'generating') AND substr(account, 1, length(?1)) = ?1 ORDER BY account, date", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
        }
    }

    #[cfg(feature = "chaos")]
    async fn job_states(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let c = &self.0;
        {
            all_rows(c, "SELECT state, count(*) FROM jobs WHERE substr(account, 1, length(?1)) = ?1 GROUP BY state ORDER BY state", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
        }
    }

    #[cfg(feature = "chaos")]
    async fn publication_log(&self, prefix: &str) -> Result<Vec<LoggedPublication>> {
        let c = &self.0;
        let row = |resource, token, operation| LoggedPublication {
            resource,
            token,
            operation,
        };
        {
            all_rows(c, "SELECT resource, token, operation FROM publication_log WHERE substr(resource, 1, length(?1)) = ?1 ORDER BY id", [prefix], |r| Ok(row(r.get(0)?, r.get(1)?, r.get(2)?)))
        }
    }

    #[cfg(feature = "chaos")]
    async fn pointers(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let c = &self.0;
        {
            all_rows(c, "SELECT resource, published_token FROM baton_resources WHERE published_token IS NOT NULL AND substr(resource, 1, length(?1)) = ?1", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
        }
    }

    async fn publish_unfenced(
        &self,
        resource: &str,
        token: FencingToken,
        operation: &str,
        object_key: &str,
        intents: &[Intent],
    ) -> Result<()> {
        let token = token.bigint();
        let c = &self.0;
        for i in intents {
            use sha2::Digest;
            c.execute(
                "INSERT INTO baton_outbox (operation, resource, token, receiver_kind, recipient, payload, payload_digest,
                     next_attempt_ms, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, 0, 0) ON CONFLICT (operation) DO NOTHING",
                params![i.operation, resource, token, i.kind.as_str(), i.recipient, i.payload, sha2::Sha256::digest(&i.payload).to_vec()],
            )
            .map_err(err)?;
        }
        {
            c.execute(
                    "INSERT INTO baton_resources (resource, policy, generation, published_key, published_token, published_operation)
                     VALUES (?1, 1, 1, ?4, ?2, ?3)
                     ON CONFLICT (resource) DO UPDATE SET published_key = excluded.published_key,
                         published_token = excluded.published_token, published_operation = excluded.published_operation",
                    params![resource, token, operation, object_key],
                )
                .map_err(err)?;
        }
        Ok(())
    }

    async fn set_state(
        &self,
        account: &str,
        date: &str,
        state: JobState,
        token: FencingToken,
        detail: &str,
    ) -> Result<bool> {
        let token = token.bigint();
        let c = &self.0;
        let state = state.as_str();
        let n = c
            .execute(
                "UPDATE jobs SET state = ?3, token = ?4, detail = ?5
                     WHERE account = ?1 AND date = ?2 AND state NOT IN ('cancelled', 'published')",
                params![account, date, state, token, detail],
            )
            .map_err(err)? as u64;
        Ok(n == 1)
    }

    async fn cancel_job(
        &mut self,
        account: &str,
        date: &str,
        resource: &ResourceName,
    ) -> Result<bool> {
        let tx = self.0.transaction().map_err(err)?;
        let n = tx
            .execute(
                "UPDATE jobs SET state = 'cancelled', detail = 'cancelled by operator' WHERE account = ?1 AND date = ?2",
                params![account, date],
            )
            .map_err(err)?;
        SqliteOutbox::cancel(&tx, resource, "statements cancel").map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n == 1)
    }

    async fn record_outcome(
        &self,
        worker: &str,
        account: &str,
        date: &str,
        token: FencingToken,
        outcome: &str,
        detail: &str,
    ) -> Result<()> {
        let token = token.bigint();
        let c = &self.0;
        {
            c.execute(
                    "INSERT INTO worker_outcomes (worker, account, date, token, outcome, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![worker, account, date, token, outcome, detail],
                )
                .map_err(err)?;
        }
        Ok(())
    }

    async fn outcomes(
        &self,
        account: &str,
        date: &str,
    ) -> Result<Vec<(String, i64, String, String)>> {
        let c = &self.0;
        {
            all_rows(c, "SELECT worker, token, outcome, detail FROM worker_outcomes WHERE account = ?1 AND date = ?2 ORDER BY id", params![account, date], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        }
    }

    async fn publication(&self, key: &ResourceName) -> Result<Option<Publication>> {
        let c = &self.0;
        SqliteFence::publication(c, key).map_err(err)
    }

    async fn fence_state(&self, key: &ResourceName) -> Result<Option<baton_fence::ResourceState>> {
        let c = &self.0;
        SqliteFence::state(c, key).map_err(err)
    }

    async fn publish(
        &mut self,
        kit: &ObjectKit,
        req: &FenceRequest,
        intents: &[Intent],
    ) -> Result<std::result::Result<Outcome, Rejection>> {
        let c = &mut self.0;
        kit.publish_sqlite_with(c, req, |tx| {
            for intent in intents {
                check_enqueued(&SqliteOutbox::enqueue(
                    tx,
                    &req.resource,
                    req.token,
                    intent,
                )?)?;
            }
            Ok(())
        })
        .await
        .map_err(err)
    }

    async fn fence_cancel(&mut self, key: &ResourceName, at: FencingToken) -> Result<()> {
        let tx = self
            .0
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        SqliteFence::cancel_in(&tx, key, Policy::OnePerGeneration, at).map_err(err)?;
        // A publish that slipped in before the fence may have enqueued.
        SqliteOutbox::cancel(&tx, key, "statements cancel").map_err(err)?;
        tx.commit().map_err(err)
    }

    fn outbox(&mut self) -> Outbox<'_> {
        Outbox::Sqlite(&mut self.0)
    }
}
