//! The `statements` command line: flag definitions, and their conversion
//! into each subcommand's configuration.

use std::path::PathBuf;
use std::time::Duration;

use baton_client::flags::parse_positive_duration;
use clap::{Parser, Subcommand};

use crate::{store, worker};

/// The exit codes of `statements`.
const EXIT_CODES: &str = "Exit codes:
  0  success (chaos, check, demo: the verdict is clean)
  1  failure, or a verdict that is not clean (inspect: a recovery mismatch)
  2  invalid usage or input
  3  no such job (inspect, show, cancel)";

/// A date that is not YYYY-MM-DD with a real month and day.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadDate(String);

/// A statement date: `YYYY-MM-DD`, a real day of a real month.
pub fn parse_date(s: &str) -> Result<String, BadDate> {
    let bad = || {
        BadDate(format!(
            "{s:?} is not a date: write YYYY-MM-DD with a real month and day, like 2026-09-13"
        ))
    };
    let parts: Vec<&str> = s.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return Err(bad());
    };
    if y.len() != 4
        || m.len() != 2
        || d.len() != 2
        || !s.bytes().all(|b| b.is_ascii_digit() || b == b'-')
    {
        return Err(bad());
    }
    let (y, m, d): (u32, u32, u32) = (
        y.parse().map_err(|_| bad())?,
        m.parse().map_err(|_| bad())?,
        d.parse().map_err(|_| bad())?,
    );
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if d == 0 || d > days {
        return Err(bad());
    }
    Ok(s.to_string())
}

#[derive(Parser)]
#[command(
    after_help = EXIT_CODES,
    name = "statements",
    version,
    about = "Daily account statements, published safely by competing workers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Args, Clone)]
pub struct Paths {
    /// SQLite database with accounts, jobs and the fence tables.
    #[arg(long, default_value = "statements.sqlite")]
    pub db: PathBuf,
    /// Use PostgreSQL instead of SQLite, for example
    /// `host=127.0.0.1 user=postgres dbname=test` or `postgres://...`.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Where the immutable statement objects live: a directory, or an
    /// S3-compatible bucket as `s3://BUCKET/PREFIX` (credentials, region
    /// and endpoint from the AWS variables or profile). The store must
    /// honour create-only writes: it is checked when opened.
    #[arg(long, default_value = "statement-objects")]
    pub objects: String,
}

#[derive(Subcommand)]
pub enum Command {
    /// Create (or bump the input version of) an account's data and queue its job.
    Seed {
        #[command(flatten)]
        paths: Paths,
        /// The account, for example account-42.
        #[arg(long)]
        account: String,
        /// The statement date, YYYY-MM-DD.
        #[arg(long, value_parser = parse_date)]
        date: String,
        /// The account's closing balance, in cents.
        #[arg(long, default_value_t = 10_000)]
        balance_cents: i64,
    },
    /// Poll for open jobs and publish their statements.
    Worker(WorkerArgs),
    /// Run the service under a seeded storm of faults (pauses, kills of
    /// workers and of the Baton server, held, dropped and reset traffic),
    /// then check the histories against the resource's durable state.
    /// Exits 0 only when the verdict is clean.
    #[cfg(feature = "chaos")]
    Chaos(ChaosArgs),
    #[cfg(feature = "chaos")]
    /// Check publish histories (written by workers with `--history`) against
    /// the publication log and pointers in the database. Exits 0 only when
    /// clean: no stale overwrite, no doubled operation, no lost publication,
    /// no pointer that moved backwards.
    Check {
        #[command(flatten)]
        paths: Paths,
        /// Directory of history files (one per worker).
        #[arg(long)]
        history: PathBuf,
        /// Only statements of accounts starting with this.
        #[arg(long, default_value = "")]
        accounts: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A Baton server in its own process, for chaos runs (killable with SIGKILL).
    #[command(hide = true)]
    ServeBaton {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        otlp_endpoint: Option<String>,
    },
    /// The incident procedure: the job record, the publication pointer
    /// and its manifest, every operation outcome with its token and the
    /// lease server's state for the resource, side by side, then a one-line
    /// verdict (which generation is authoritative and why, or a recovery
    /// mismatch). Exits 1 on a recovery mismatch.
    Inspect {
        #[command(flatten)]
        paths: Paths,
        /// The lease server to ask about the resource.
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        server: String,
        /// The account, for example account-42.
        account: String,
        /// The statement date, YYYY-MM-DD.
        #[arg(value_parser = parse_date)]
        date: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve `inspect` as a page (and as JSON at /api/inspect) on ADDR.
    Console {
        #[command(flatten)]
        paths: Paths,
        /// The lease server to ask about each resource.
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        server: String,
        /// Where to serve the page, like 127.0.0.1:9102.
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
    },
    /// The durable records of one statement, side by side (`inspect`
    /// without the lease server and the verdict).
    Show {
        #[command(flatten)]
        paths: Paths,
        /// The account, for example account-42.
        #[arg(long)]
        account: String,
        /// The statement date, YYYY-MM-DD.
        #[arg(long, value_parser = parse_date)]
        date: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job durably: job state, lease fence, and the resource's generation.
    Cancel {
        #[command(flatten)]
        paths: Paths,
        /// The Baton server whose lease the cancel fences.
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        server: String,
        /// The account, for example account-42.
        #[arg(long)]
        account: String,
        /// The statement date, YYYY-MM-DD.
        #[arg(long, value_parser = parse_date)]
        date: String,
    },
    /// Send the outbox's deliveries (webhook and email); several may run
    /// at once, each delivery under a Baton lease of its own.
    Dispatch(DispatchArgs),
    /// The outbox's deliveries: list them, or resolve one that needs attention.
    Deliveries {
        #[command(subcommand)]
        command: DeliveriesCommand,
    },
    /// A stand-in third-party webhook for tests and chaos runs (idempotency
    /// keys and status queries, backed by PostgreSQL).
    #[cfg(feature = "chaos")]
    #[command(hide = true)]
    WebhookReceiver(baton_testkit::webhook::ReceiverArgs),
    /// The paused-worker story with an embedded Baton server: Alice pauses,
    /// Bob takes over and publishes, Alice resumes and is rejected.
    Demo {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Keep the service's state in PostgreSQL instead of SQLite.
        #[arg(long)]
        database_url: Option<String>,
        /// Keep the demo's files in this directory instead of a temporary one.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

mod outbox;
pub use outbox::{DeliveriesCommand, DispatchArgs};

impl Paths {
    pub fn target(&self) -> store::Location {
        store::Location {
            db: self.db.clone(),
            database_url: self.database_url.clone(),
        }
    }
}

/// `statements worker`.
#[derive(clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[arg(long, default_value = "http://127.0.0.1:7700")]
    pub server: String,
    /// The worker's name, in its events and recorded outcomes.
    #[arg(long, default_value = "worker")]
    pub name: String,
    /// Lease duration, like 5s.
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub ttl: Duration,
    /// One pass over the open jobs, then exit.
    #[arg(long)]
    pub once: bool,
    /// Time between polls for open jobs.
    #[arg(long, default_value = "200ms", value_parser = parse_positive_duration)]
    pub poll: Duration,
    /// Stop with SIGSTOP after the last local ownership check, just before publishing.
    #[arg(long)]
    pub pause_before_publish: bool,
    /// Stop with SIGSTOP right after reading the input.
    #[arg(long)]
    pub pause_after_read: bool,
    /// Abort the process at this point (crash drills).
    #[arg(long)]
    pub crash_after: Option<worker::CrashPoint>,
    /// Only jobs of accounts whose name starts with this.
    #[arg(long, default_value = "")]
    pub accounts: String,
    /// Serve the worker's metrics (fenced-write outcomes, renewal
    /// failures, ownership losses, acquire times) for Prometheus at
    /// http://ADDR/metrics, like 127.0.0.1:9101.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Export OpenTelemetry traces (one per job: the acquire, the server's
    /// grant, renewals and the fenced write) to this OTLP/HTTP collector,
    /// like http://127.0.0.1:4318.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// On each publication, record a delivery for this HTTP webhook (it
    /// must honour `Idempotency-Key` and answer `GET URL/status/KEY`); sent
    /// by `statements dispatch`.
    #[arg(long, value_name = "URL")]
    pub notify_webhook: Option<String>,
    /// On each publication, record an email to this address; sent by
    /// `statements dispatch` over SMTP.
    #[arg(long, value_name = "ADDRESS")]
    pub notify_email: Option<String>,
    #[cfg(feature = "chaos")]
    #[command(flatten)]
    pub chaos: ChaosWorkerArgs,
}

/// The worker's flags for the fault suite (feature `chaos`), absent from
/// the shipped binary.
#[cfg(feature = "chaos")]
#[derive(clap::Args)]
pub struct ChaosWorkerArgs {
    /// Append every publish attempt (invoked, then ok, failed or unknown)
    /// to this file, for the fault suite's checker.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// NEGATIVE CONTROL ONLY: move the publication pointer with a blind
    /// write, no fence. Exists to prove the fault suite can see a stale write.
    #[arg(long, hide = true)]
    pub unfenced: bool,
    /// Chaos runs: stop with SIGSTOP before this percent of publishes.
    #[arg(long, hide = true, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub pause_chance_pct: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    pub chaos_seed: u64,
}

/// `statements chaos`.
#[cfg(feature = "chaos")]
#[derive(clap::Args)]
pub struct ChaosArgs {
    /// Worker processes (1 to 64).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// How long faults are injected (e.g. 60s, 10m); the run then settles.
    /// (Zero passes the parser so that the run's own rule, at least 1s, is
    /// the one named.)
    #[arg(long, default_value = "60s", value_parser = baton_client::flags::parse_duration)]
    pub duration: Duration,
    /// Seed of the fault schedule; random if not given (and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run against PostgreSQL (a TCP address) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Print one JSON object as the report.
    #[arg(long)]
    pub json: bool,
    /// Switch fencing off at the resource. The run must then find stale
    /// overwrites and exit non-zero; otherwise the suite proves nothing.
    #[arg(long)]
    pub negative_control: bool,
    /// Lease duration of the workers (200ms to 60s); pauses last 0.5 to 3 TTLs.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub ttl: Duration,
    /// Percent of publish attempts on which a worker stops itself just
    /// before publishing (after its last ownership check).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub pause_chance_pct: u32,
    /// Keep the run's files (server data, logs, histories) here.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Outbox dispatchers beside the workers (0 to 16), killed and paused
    /// like them, with a webhook receiver and an SMTP server (aiosmtpd:
    /// `BATON_CHAOS_PYTHON` names a Python that has it, else `python3`).
    /// With PostgreSQL only; 0 runs none.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=16))]
    pub dispatchers: u16,
    /// The workers' objects in an S3-compatible bucket, `s3://BUCKET/PREFIX`
    /// (use a fresh prefix per run); a directory of the run otherwise.
    #[arg(long)]
    pub objects: Option<String>,
}

impl WorkerArgs {
    /// The chaos drills: none in the shipped binary.
    fn chaos_drills(&self) -> (bool, u32, u64) {
        #[cfg(feature = "chaos")]
        {
            let c = &self.chaos;
            (c.unfenced, c.pause_chance_pct, c.chaos_seed)
        }
        #[cfg(not(feature = "chaos"))]
        {
            (false, 0, 0)
        }
    }
}

impl From<WorkerArgs> for crate::worker::WorkerConfig {
    fn from(a: WorkerArgs) -> Self {
        let (unfenced, pause_chance_pct, chaos_seed) = a.chaos_drills();
        Self {
            target: a.paths.target(),
            objects: a.paths.objects,
            server: a.server,
            name: a.name,
            ttl: a.ttl,
            once: a.once,
            poll: a.poll,
            accounts: a.accounts,
            #[cfg(feature = "chaos")]
            history: a.chaos.history.clone(),
            notify: crate::worker::Notify {
                webhook: a.notify_webhook,
                email: a.notify_email,
            },
            drills: crate::worker::Drills {
                pause_before_publish: a.pause_before_publish,
                pause_after_read: a.pause_after_read,
                crash_after: a.crash_after,
                unfenced,
                pause_chance_pct,
                chaos_seed,
            },
        }
    }
}

#[cfg(feature = "chaos")]
impl From<ChaosArgs> for baton_chaos::ChaosConfig {
    /// A run without `--seed` takes one from the clock (and prints it).
    fn from(a: ChaosArgs) -> Self {
        let seed = a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
        });
        Self {
            workers: a.workers,
            duration: a.duration,
            seed,
            database_url: a.database_url,
            json: a.json,
            negative_control: a.negative_control,
            ttl: a.ttl,
            dir: a.dir,
            pause_chance_pct: a.pause_chance_pct,
            dispatchers: usize::from(a.dispatchers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_date;

    #[test]
    fn dates_are_real_days() {
        for good in ["2026-09-13", "2024-02-29", "2026-12-31"] {
            assert!(parse_date(good).is_ok(), "{good}");
        }
        for bad in [
            "2026-13-45",
            "2026-02-29",
            "2026-9-13",
            "26-09-13",
            "2026-09-13x",
            "",
            "2026-00-10",
            "2026-04-31",
        ] {
            assert!(
                parse_date(bad).unwrap_err().0.contains("YYYY-MM-DD"),
                "{bad}"
            );
        }
    }
}
