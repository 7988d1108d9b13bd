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

const POSTGRES_LOG: &str = "
CREATE TABLE IF NOT EXISTS statements.publication_log (
    id         bigserial PRIMARY KEY,
    resource   text NOT NULL,
    token      bigint NOT NULL,
    operation  text NOT NULL,
    object_key text NOT NULL
);
CREATE OR REPLACE FUNCTION statements.log_publication() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published_operation IS NOT NULL THEN
        INSERT INTO statements.publication_log (resource, token, operation, object_key)
        VALUES (NEW.resource, NEW.published_token, NEW.published_operation, NEW.published_key);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER publication_log
AFTER INSERT OR UPDATE OF published_key, published_token, published_operation ON baton.resources
FOR EACH ROW EXECUTE FUNCTION statements.log_publication();
";

/// One accepted publication, from the publication log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedPublication {
    pub resource: String,
    pub token: i64,
    pub operation: String,
}

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

/// Where the state lives.
#[derive(Clone, Debug)]
pub struct Target {
    pub db: PathBuf,
    pub database_url: Option<String>,
}

/// Where a statement job stands; what customers and operators see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Generating,
    Published,
    NeedsAttention,
    Cancelled,
}

impl JobState {
    /// The label stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Generating => "generating",
            JobState::Published => "published",
            JobState::NeedsAttention => "needs_attention",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Reads a stored label.
    pub fn parse(label: &str) -> Result<Self> {
        [
            Self::Pending,
            Self::Generating,
            Self::Published,
            Self::NeedsAttention,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == label)
        .ok_or_else(|| format!("unknown job state {label:?} in the database"))
    }

    /// Cancelled and published are final: no worker moves a job out of them.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Published | JobState::Cancelled)
    }

    /// A worker may pick the job up (a generating job's worker may have died).
    pub fn is_open(self) -> bool {
        matches!(self, JobState::Pending | JobState::Generating)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub account: String,
    pub date: String,
    pub state: JobState,
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
            // One migrating worker at a time: concurrent CREATE ... IF NOT
            // EXISTS can collide in the catalog.
            let tx = client.transaction().await.map_err(err)?;
            tx.batch_execute("SELECT pg_advisory_xact_lock(7243017001)")
                .await
                .map_err(err)?;
            tx.batch_execute(POSTGRES_SCHEMA).await.map_err(err)?;
            tx.batch_execute(POSTGRES_LOG).await.map_err(err)?;
            tx.commit().await.map_err(err)?;
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
            conn.execute_batch(SQLITE_LOG).map_err(err)?;
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
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()
                .map_err(err)?
                .map(|(account, date, state, token, detail)| {
                    Ok(Job { account, date, state: JobState::parse(&state)?, token, detail })
                })
                .transpose(),
            Db::Postgres { client, .. } => Ok(client
                .query_opt("SELECT account, date, state, token, detail FROM statements.jobs WHERE account = $1 AND date = $2", &[&account, &date])
                .await
                .map_err(err)?
                .map(|r| {
                    let state: String = r.get(2);
                    Ok::<Job, String>(Job { account: r.get(0), date: r.get(1), state: JobState::parse(&state)?, token: r.get(3), detail: r.get(4) })
                })
                .transpose()?),
        }
    }

    /// Jobs a worker may pick up: pending, or generating by a worker that
    /// may have died; only accounts starting with `prefix` ("" for all).
    pub async fn open_jobs(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        match self {
            Db::Sqlite(c) => {
                all_rows(c, "SELECT account, date FROM jobs WHERE state IN ('pending', 'generating') AND substr(account, 1, length(?1)) = ?1 ORDER BY account, date", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
            }
            Db::Postgres { client, .. } => Ok(client
                .query("SELECT account, date FROM statements.jobs WHERE state IN ('pending', 'generating') AND left(account, length($1)) = $1 ORDER BY account, date", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// Jobs per state for accounts starting with `prefix`.
    pub async fn job_states(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        match self {
            Db::Sqlite(c) => {
                all_rows(c, "SELECT state, count(*) FROM jobs WHERE substr(account, 1, length(?1)) = ?1 GROUP BY state ORDER BY state", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
            }
            Db::Postgres { client, .. } => Ok(client
                .query("SELECT state, count(*) FROM statements.jobs WHERE left(account, length($1)) = $1 GROUP BY state ORDER BY state", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// Every accepted publication of resources starting with `prefix`, in
    /// commit order per resource.
    pub async fn publication_log(&self, prefix: &str) -> Result<Vec<LoggedPublication>> {
        let row = |resource, token, operation| LoggedPublication {
            resource,
            token,
            operation,
        };
        match self {
            Db::Sqlite(c) => {
                all_rows(c, "SELECT resource, token, operation FROM publication_log WHERE substr(resource, 1, length(?1)) = ?1 ORDER BY id", [prefix], |r| Ok(row(r.get(0)?, r.get(1)?, r.get(2)?)))
            }
            Db::Postgres { client, .. } => Ok(client
                .query("SELECT resource, token, operation FROM statements.publication_log WHERE left(resource, length($1)) = $1 ORDER BY id", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| row(r.get(0), r.get(1), r.get(2)))
                .collect()),
        }
    }

    /// The final publication pointer of every resource starting with `prefix`.
    pub async fn pointers(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        match self {
            Db::Sqlite(c) => {
                all_rows(c, "SELECT resource, published_token FROM baton_resources WHERE published_token IS NOT NULL AND substr(resource, 1, length(?1)) = ?1", [prefix], |r| Ok((r.get(0)?, r.get(1)?)))
            }
            Db::Postgres { client, .. } => Ok(client
                .query("SELECT resource, published_token FROM baton.resources WHERE published_token IS NOT NULL AND left(resource, length($1)) = $1", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// The negative control's write: move the pointer with no fence at all,
    /// last writer wins. Never used by a real worker.
    pub async fn publish_unfenced(
        &self,
        resource: &str,
        token: i64,
        operation: &str,
        object_key: &str,
    ) -> Result<()> {
        match self {
            Db::Sqlite(c) => {
                c.execute(
                    "INSERT INTO baton_resources (resource, policy, generation, published_key, published_token, published_operation)
                     VALUES (?1, 1, 1, ?4, ?2, ?3)
                     ON CONFLICT (resource) DO UPDATE SET published_key = excluded.published_key,
                         published_token = excluded.published_token, published_operation = excluded.published_operation",
                    params![resource, token, operation, object_key],
                )
                .map_err(err)?;
            }
            Db::Postgres { client, .. } => {
                client
                    .execute(
                        "INSERT INTO baton.resources (resource, policy, generation, published_key, published_token, published_operation)
                         VALUES ($1, 1, 1, $4, $2, $3)
                         ON CONFLICT (resource) DO UPDATE SET published_key = excluded.published_key,
                             published_token = excluded.published_token, published_operation = excluded.published_operation",
                        &[&resource, &token, &operation, &object_key],
                    )
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// Moves a job to `state` unless it was cancelled or already published:
    /// both are final, and a worker must never undo an operator's cancel.
    pub async fn set_state(
        &self,
        account: &str,
        date: &str,
        state: JobState,
        token: i64,
        detail: &str,
    ) -> Result<bool> {
        let state = state.as_str();
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
                all_rows(c, "SELECT worker, token, outcome, detail FROM worker_outcomes WHERE account = ?1 AND date = ?2 ORDER BY id", params![account, date], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
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
