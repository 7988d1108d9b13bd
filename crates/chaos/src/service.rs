//! The seam between the chaos run and the service it storms: what the run
//! needs from the service's database and how it starts the service's
//! processes. `statements` implements it; another application can too.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_faults::checker::Accepted;

/// One worker incarnation's settings, for [`Service::worker_command`].
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// The run's directory (database file, objects).
    pub dir: PathBuf,
    /// Where the worker appends its publish history.
    pub history: PathBuf,
    /// The worker's Baton address (its proxy).
    pub server_url: String,
    /// A name unique to this incarnation.
    pub name: String,
    /// Lease duration.
    pub ttl: Duration,
    /// Only jobs of accounts starting with this.
    pub accounts: String,
    /// Percent of publishes before which the worker stops itself.
    pub pause_chance_pct: u32,
    /// Seed of those pauses.
    pub chaos_seed: u64,
    /// The database through the worker's proxy, if PostgreSQL.
    pub database_url: Option<String>,
    /// Negative control: publish with a blind write.
    pub unfenced: bool,
    /// More arguments, from the service's [`Effects::worker_args`].
    pub extra_args: Vec<String>,
}

/// What [`Service::effects`] is given.
#[derive(Clone, Debug)]
pub struct EffectsSpec {
    /// The run's directory.
    pub dir: PathBuf,
    /// The service's database (not proxied), if PostgreSQL.
    pub database_url: Option<String>,
    pub seed: u64,
    /// The run's accounts (the prefix of every job it seeds).
    pub accounts: String,
    /// The negative control: dispatchers that send no idempotency key and
    /// retry unknown outcomes whatever the receiver.
    pub blind: bool,
}

/// What a run's external effects came to, once the dispatchers drained.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DeliveryFigures {
    /// Delivery intents recorded.
    pub deliveries: u64,
    pub delivered: u64,
    pub needs_attention: u64,
    pub failed: u64,
    /// Still pending, claimed, sending or accepted when the drain ended.
    pub unsettled: u64,
    /// Operations a receiver applied (or received) more than once.
    pub duplicate_deliveries: u64,
    /// Intents an accepted publication should have caused with neither a
    /// delivery nor a needs_attention row after the drain.
    pub lost_deliveries: u64,
    /// Faults the receivers inflicted (answers dropped, connections reset).
    pub receiver_faults: BTreeMap<String, u64>,
}

/// A service's external effects under the storm: receivers it runs, the
/// dispatchers the run starts (and kills and pauses), and the counts.
#[async_trait::async_trait(?Send)]
pub trait Effects {
    /// Arguments for every worker: where its publications notify.
    fn worker_args(&self) -> Vec<String>;
    /// The command that starts one dispatcher.
    fn dispatcher_command(
        &self,
        name: &str,
        server_url: &str,
        ttl: Duration,
    ) -> tokio::process::Command;
    /// Deliveries not settled yet.
    async fn unsettled(&self) -> anyhow::Result<u64>;
    /// The counts, after the drain.
    async fn figures(&self) -> anyhow::Result<DeliveryFigures>;
}

/// A service's effects being started: `None` when it has none (or not on
/// this backend).
pub type EffectsOpening<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<Option<Box<dyn Effects>>>> + 'a>,
>;

/// The service's database as the run sees it.
#[async_trait::async_trait(?Send)]
pub trait ServiceDb {
    /// Queues one job (and its input) for `account` on `date`.
    async fn seed_job(&self, account: &str, date: &str, balance_cents: i64) -> anyhow::Result<()>;
    /// Jobs of accounts starting with `prefix` that a worker may still pick up.
    async fn open_jobs(&self, prefix: &str) -> anyhow::Result<usize>;
    /// Jobs per state label for accounts starting with `prefix`.
    async fn job_states(&self, prefix: &str) -> anyhow::Result<Vec<(String, i64)>>;
    /// Every accepted publication of resources starting with `prefix`, in commit order.
    async fn publication_log(&self, prefix: &str) -> anyhow::Result<Vec<Accepted>>;
    /// The final publication pointer of every resource starting with `prefix`.
    async fn pointers(&self, prefix: &str) -> anyhow::Result<Vec<(String, i64)>>;
}

/// A database being opened (not `Send`: a SQLite connection is not `Sync`).
pub type Opening<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Box<dyn ServiceDb>>> + 'a>>;

/// The service under test. `Send + Sync`: the seeding thread opens its own
/// database through it.
pub trait Service: Send + Sync + 'static {
    /// Opens (creating if needed) the service's database for a run in `dir`.
    fn open<'a>(&'a self, dir: &'a Path, database_url: Option<&'a str>) -> Opening<'a>;
    /// The command that starts one worker.
    fn worker_command(&self, spec: &WorkerSpec) -> tokio::process::Command;
    /// The command that starts a Baton server that prints `listening` once it serves.
    fn server_command(&self, data_dir: &Path, listen: SocketAddr) -> tokio::process::Command;
    /// Whether a job state label means a worker may still pick the job up.
    fn is_open_state(&self, label: &str) -> bool;
    /// Starts the service's receivers for a run, if it has external
    /// effects. None by default.
    fn effects<'a>(&'a self, spec: &'a EffectsSpec) -> EffectsOpening<'a> {
        let _ = spec;
        Box::pin(async { Ok(None) })
    }
}
