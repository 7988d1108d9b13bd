//! The service's durable state: account data (the input), jobs (what
//! customers and operators see), and each worker's recorded outcome. The
//! fence kit's tables live in the same database. SQLite by default
//! (`--db`), PostgreSQL with `--database-url` (schema `statements`, plus the
//! fence kit's schema `baton`).

//!
//! One trait, [`Store`], with a dialect per file: `sqlite.rs` and
//! `postgres.rs`. Both create the same tables and the same publication log.

mod outbox;
mod postgres;
mod sqlite;

pub use outbox::Outbox;

use std::path::PathBuf;

use baton_fence::objects::{ObjectKit, Rejection};
use baton_fence::outbox::{Intent, Step, StepOutcome};
use baton_fence::{FenceRequest, FencingToken, Outcome, Publication, ResourceName};

pub type Result<T> = anyhow::Result<T>;

/// A library error as this binary's error (its message is kept whole; a
/// PostgreSQL error says the server's message and SQLSTATE, not "db error").
pub(crate) fn err(e: impl std::error::Error + 'static) -> anyhow::Error {
    match (&e as &dyn std::error::Error).downcast_ref::<tokio_postgres::Error>() {
        Some(pg) => anyhow::anyhow!("postgres: {}", baton_fence::postgres::describe_error(pg)),
        None => anyhow::anyhow!("{e}"),
    }
}

#[cfg(feature = "chaos")]
/// One accepted publication, from the publication log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedPublication {
    pub resource: String,
    pub token: i64,
    pub operation: String,
}

/// Where the state lives.
#[derive(Clone, Debug)]
pub struct Location {
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
        .ok_or_else(|| anyhow::anyhow!("unknown job state {label:?} in the database"))
    }

    /// Cancelled and published are final: no worker moves a job out of them.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Published | JobState::Cancelled)
    }

    #[cfg(feature = "chaos")]
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

/// The service's state, in whichever database the target names.
pub type Db = Box<dyn Store>;

/// Opens (and creates or migrates) the store the target names.
pub async fn open(target: &Location) -> Result<Db> {
    match &target.database_url {
        Some(url) => Ok(Box::new(postgres::PgDb::open(url).await?)),
        None => Ok(Box::new(sqlite::SqliteDb::open(&target.db)?)),
    }
}

/// Opens the store the target names for reading only: nothing is created
/// or migrated, and a database that is not there is an error naming it.
pub async fn open_existing(target: &Location) -> Result<Db> {
    match &target.database_url {
        Some(url) => Ok(Box::new(postgres::PgDb::open_existing(url).await?)),
        None => Ok(Box::new(sqlite::SqliteDb::open_existing(&target.db)?)),
    }
}

/// Everything the service keeps. Futures are not `Send`: a SQLite
/// connection is not `Sync`, and each worker uses its store from one task.
#[async_trait::async_trait(?Send)]
pub trait Store {
    async fn seed(&self, account: &str, date: &str, balance_cents: i64) -> Result<i64>;

    async fn input(&self, account: &str, date: &str) -> Result<Option<Input>>;

    async fn job(&self, account: &str, date: &str) -> Result<Option<Job>>;

    async fn open_jobs(&self, prefix: &str) -> Result<Vec<(String, String)>>;

    #[cfg(feature = "chaos")]
    async fn job_states(&self, prefix: &str) -> Result<Vec<(String, i64)>>;

    #[cfg(feature = "chaos")]
    async fn publication_log(&self, prefix: &str) -> Result<Vec<LoggedPublication>>;

    #[cfg(feature = "chaos")]
    async fn pointers(&self, prefix: &str) -> Result<Vec<(String, i64)>>;

    /// The negative control's blind pointer write, and its intents written
    /// as blindly (no fence, no event).
    async fn publish_unfenced(
        &self,
        resource: &str,
        token: FencingToken,
        operation: &str,
        object_key: &str,
        intents: &[Intent],
    ) -> Result<()>;

    async fn set_state(
        &self,
        account: &str,
        date: &str,
        state: JobState,
        token: FencingToken,
        detail: &str,
    ) -> Result<bool>;

    /// Cancels the job and, in the same transaction, its deliveries that
    /// were not sent.
    async fn cancel_job(
        &mut self,
        account: &str,
        date: &str,
        resource: &ResourceName,
    ) -> Result<bool>;

    async fn record_outcome(
        &self,
        worker: &str,
        account: &str,
        date: &str,
        token: FencingToken,
        outcome: &str,
        detail: &str,
    ) -> Result<()>;

    async fn outcomes(
        &self,
        account: &str,
        date: &str,
    ) -> Result<Vec<(String, i64, String, String)>>;

    async fn publication(&self, key: &ResourceName) -> Result<Option<Publication>>;

    async fn fence_state(&self, key: &ResourceName) -> Result<Option<baton_fence::ResourceState>>;

    /// The fenced publish and, in its transaction if it applied, the
    /// delivery intents it causes.
    async fn publish(
        &mut self,
        kit: &ObjectKit,
        req: &FenceRequest,
        intents: &[Intent],
    ) -> Result<std::result::Result<Outcome, Rejection>>;

    /// The fence kit's cancellation and, in its transaction, the outbox's
    /// (a publish that slipped in before it may have enqueued).
    async fn fence_cancel(&mut self, key: &ResourceName, at: FencingToken) -> Result<()>;

    /// The outbox, on this store's connection.
    fn outbox(&mut self) -> Outbox<'_>;
}

/// An enqueue after an applied publish is the same row or a new one;
/// anything else is a bug worth stopping the transaction for.
pub(crate) fn check_enqueued(step: &Step) -> std::result::Result<(), baton_fence::FenceError> {
    match step.outcome {
        StepOutcome::Enqueued | StepOutcome::Exists => Ok(()),
        other => Err(baton_fence::FenceError::Corrupt(format!(
            "the outbox refused an intent after its publish applied: {} ({})",
            other.label(),
            step.detail.as_deref().unwrap_or("")
        ))),
    }
}
