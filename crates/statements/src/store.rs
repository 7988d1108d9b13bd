//! The service's durable state: account data (the input), jobs (what
//! customers and operators see), and each worker's recorded outcome. The
//! fence kit's tables live in the same database. SQLite by default
//! (`--db`), PostgreSQL with `--database-url` (schema `statements`, plus the
//! fence kit's schema `baton`).

use std::path::PathBuf;

use baton_fence::objects::{Invalid, ObjectKit};
use baton_fence::postgres::{PgFence, Prepared};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{FenceRequest, Outcome, Policy, Publication, ResourceKey, Token};
use rusqlite::{params, Connection, OptionalExtension};

pub type Result<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

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

const POSTGRES_SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS statements;
CREATE TABLE IF NOT EXISTS statements.accounts (
    account       text NOT NULL,
    date          text NOT NULL,
    version       bigint NOT NULL,
    balance_cents bigint NOT NULL,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS statements.jobs (
    account text NOT NULL,
    date    text NOT NULL,
    state   text NOT NULL CHECK (state IN ('pending', 'generating', 'published', 'needs_attention', 'cancelled')),
    token   bigint,
    detail  text,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS statements.worker_outcomes (
    id      bigserial PRIMARY KEY,
    worker  text NOT NULL,
    account text NOT NULL,
    date    text NOT NULL,
    token   bigint NOT NULL,
    outcome text NOT NULL,
    detail  text NOT NULL
);
";

/// Where the state lives.
#[derive(Clone, Debug)]
pub struct Target {
    pub db: PathBuf,
    pub database_url: Option<String>,
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

pub enum Db {
    Sqlite(Connection),
    Postgres {
        client: tokio_postgres::Client,
        prepared: Prepared,
    },
}

pub async fn open(target: &Target) -> Result<Db> {
    match &target.database_url {
        Some(url) => {
            let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))?;
            tokio::spawn(connection);
            PgFence::migrate(&mut client).await.map_err(err)?;
            client.batch_execute(POSTGRES_SCHEMA).await.map_err(err)?;
            let prepared = PgFence::prepare(&client).await.map_err(err)?;
            Ok(Db::Postgres { client, prepared })
        }
        None => {
            let conn = Connection::open(&target.db)
                .map_err(|e| format!("cannot open {}: {e}", target.db.display()))?;
            conn.busy_timeout(std::time::Duration::from_secs(30))
                .map_err(err)?;
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(err)?;
            conn.execute_batch(SQLITE_SCHEMA).map_err(err)?;
            SqliteFence::migrate(&conn).map_err(err)?;
            Ok(Db::Sqlite(conn))
        }
    }
}

impl Db {
    /// Creates or updates an account's data (bumping its version) and queues a job.
    pub async fn seed(&self, account: &str, date: &str, balance_cents: i64) -> Result<i64> {
        match self {
            Db::Sqlite(c) => {
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
            Db::Postgres { client, .. } => {
                client
                    .execute(
                        "INSERT INTO statements.accounts AS a (account, date, version, balance_cents) VALUES ($1, $2, 1, $3)
                         ON CONFLICT (account, date) DO UPDATE SET version = a.version + 1, balance_cents = excluded.balance_cents",
                        &[&account, &date, &balance_cents],
                    )
                    .await
                    .map_err(err)?;
                client
                    .execute(
                        "INSERT INTO statements.jobs (account, date, state) VALUES ($1, $2, 'pending') ON CONFLICT DO NOTHING",
                        &[&account, &date],
                    )
                    .await
                    .map_err(err)?;
            }
        }
        Ok(self.input(account, date).await?.map_or(0, |i| i.version))
    }

    pub async fn input(&self, account: &str, date: &str) -> Result<Option<Input>> {
        match self {
            Db::Sqlite(c) => c
                .query_row(
                    "SELECT version, balance_cents FROM accounts WHERE account = ?1 AND date = ?2",
                    params![account, date],
                    |r| Ok(Input { version: r.get(0)?, balance_cents: r.get(1)? }),
                )
                .optional()
                .map_err(err),
            Db::Postgres { client, .. } => Ok(client
                .query_opt("SELECT version, balance_cents FROM statements.accounts WHERE account = $1 AND date = $2", &[&account, &date])
                .await
                .map_err(err)?
                .map(|r| Input { version: r.get(0), balance_cents: r.get(1) })),
        }
    }

    pub async fn job(&self, account: &str, date: &str) -> Result<Option<Job>> {
        match self {
            Db::Sqlite(c) => c
                .query_row(
                    "SELECT account, date, state, token, detail FROM jobs WHERE account = ?1 AND date = ?2",
                    params![account, date],
                    |r| Ok(Job { account: r.get(0)?, date: r.get(1)?, state: r.get(2)?, token: r.get(3)?, detail: r.get(4)? }),
                )
                .optional()
                .map_err(err),
            Db::Postgres { client, .. } => Ok(client
                .query_opt("SELECT account, date, state, token, detail FROM statements.jobs WHERE account = $1 AND date = $2", &[&account, &date])
                .await
                .map_err(err)?
                .map(|r| Job { account: r.get(0), date: r.get(1), state: r.get(2), token: r.get(3), detail: r.get(4) })),
        }
    }

    /// Jobs a worker may pick up: pending, or generating by a worker that may have died.
    pub async fn open_jobs(&self) -> Result<Vec<(String, String)>> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c
                    .prepare("SELECT account, date FROM jobs WHERE state IN ('pending', 'generating') ORDER BY account, date")
                    .map_err(err)?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(err)?;
                rows.collect::<std::result::Result<_, _>>().map_err(err)
            }
            Db::Postgres { client, .. } => Ok(client
                .query("SELECT account, date FROM statements.jobs WHERE state IN ('pending', 'generating') ORDER BY account, date", &[])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// Moves a job to `state` unless it was cancelled or already published:
    /// both are final, and a worker must never undo an operator's cancel.
    pub async fn set_state(
        &self,
        account: &str,
        date: &str,
        state: &str,
        token: i64,
        detail: &str,
    ) -> Result<bool> {
        let n = match self {
            Db::Sqlite(c) => c
                .execute(
                    "UPDATE jobs SET state = ?3, token = ?4, detail = ?5
                     WHERE account = ?1 AND date = ?2 AND state NOT IN ('cancelled', 'published')",
                    params![account, date, state, token, detail],
                )
                .map_err(err)? as u64,
            Db::Postgres { client, .. } => client
                .execute(
                    "UPDATE statements.jobs SET state = $3, token = $4, detail = $5
                     WHERE account = $1 AND date = $2 AND state NOT IN ('cancelled', 'published')",
                    &[&account, &date, &state, &token, &detail],
                )
                .await
                .map_err(err)?,
        };
        Ok(n == 1)
    }

    pub async fn cancel_job(&self, account: &str, date: &str) -> Result<bool> {
        let n = match self {
            Db::Sqlite(c) => c
                .execute(
                    "UPDATE jobs SET state = 'cancelled', detail = 'cancelled by operator' WHERE account = ?1 AND date = ?2",
                    params![account, date],
                )
                .map_err(err)? as u64,
            Db::Postgres { client, .. } => client
                .execute(
                    "UPDATE statements.jobs SET state = 'cancelled', detail = 'cancelled by operator' WHERE account = $1 AND date = $2",
                    &[&account, &date],
                )
                .await
                .map_err(err)?,
        };
        Ok(n == 1)
    }

    pub async fn record_outcome(
        &self,
        worker: &str,
        account: &str,
        date: &str,
        token: i64,
        outcome: &str,
        detail: &str,
    ) -> Result<()> {
        match self {
            Db::Sqlite(c) => {
                c.execute(
                    "INSERT INTO worker_outcomes (worker, account, date, token, outcome, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![worker, account, date, token, outcome, detail],
                )
                .map_err(err)?;
            }
            Db::Postgres { client, .. } => {
                client
                    .execute(
                        "INSERT INTO statements.worker_outcomes (worker, account, date, token, outcome, detail) VALUES ($1, $2, $3, $4, $5, $6)",
                        &[&worker, &account, &date, &token, &outcome, &detail],
                    )
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// Every worker outcome for a statement, oldest first: (worker, token, outcome, detail).
    pub async fn outcomes(
        &self,
        account: &str,
        date: &str,
    ) -> Result<Vec<(String, i64, String, String)>> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c
                    .prepare("SELECT worker, token, outcome, detail FROM worker_outcomes WHERE account = ?1 AND date = ?2 ORDER BY id")
                    .map_err(err)?;
                let rows = stmt.query_map(params![account, date], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).map_err(err)?;
                rows.collect::<std::result::Result<_, _>>().map_err(err)
            }
            Db::Postgres { client, .. } => Ok(client
                .query(
                    "SELECT worker, token, outcome, detail FROM statements.worker_outcomes WHERE account = $1 AND date = $2 ORDER BY id",
                    &[&account, &date],
                )
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect()),
        }
    }

    pub async fn publication(&self, key: &ResourceKey) -> Result<Option<Publication>> {
        match self {
            Db::Sqlite(c) => SqliteFence::publication(c, key).map_err(err),
            Db::Postgres { client, .. } => PgFence::publication(client, key).await.map_err(err),
        }
    }

    pub async fn fence_state(
        &self,
        key: &ResourceKey,
    ) -> Result<Option<baton_fence::ResourceState>> {
        match self {
            Db::Sqlite(c) => SqliteFence::state(c, key).map_err(err),
            Db::Postgres { client, .. } => PgFence::state(client, key).await.map_err(err),
        }
    }

    /// Validates the candidate named by `req.result`, then moves the pointer through the fence kit.
    pub async fn publish(
        &mut self,
        kit: &ObjectKit,
        req: &FenceRequest,
    ) -> Result<std::result::Result<Outcome, Invalid>> {
        match self {
            Db::Sqlite(c) => kit.publish_sqlite(c, req).await.map_err(err),
            Db::Postgres { client, prepared } => kit
                .publish_postgres(client, prepared, req)
                .await
                .map_err(err),
        }
    }

    /// Durable cancellation at the resource: every token at or below `at` is refused.
    pub async fn fence_cancel(&mut self, key: &ResourceKey, at: Token) -> Result<()> {
        match self {
            Db::Sqlite(c) => SqliteFence::cancel(c, key, Policy::OnePerGeneration, at)
                .map(|_| ())
                .map_err(err),
            Db::Postgres { client, .. } => {
                PgFence::cancel(client, key, Policy::OnePerGeneration, at)
                    .await
                    .map(|_| ())
                    .map_err(err)
            }
        }
    }
}
