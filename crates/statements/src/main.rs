//! `statements`: the statement publication service of the seed, end to end,
//! on Baton's public APIs. See `statements demo`.

mod chaos;
mod demo;
mod events;
mod rng;
mod signal;
mod store;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_fence::objects::ObjectKit;
use baton_fence::{ResourceKey, Token};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "statements",
    about = "Daily account statements, published safely by competing workers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Paths {
    /// SQLite database with accounts, jobs and the fence tables.
    #[arg(long, default_value = "statements.sqlite")]
    db: PathBuf,
    /// Use PostgreSQL instead of SQLite, for example
    /// `host=127.0.0.1 user=postgres dbname=test` or `postgres://...`.
    #[arg(long)]
    database_url: Option<String>,
    /// Directory for the immutable statement objects.
    #[arg(long, default_value = "statement-objects")]
    objects: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Create (or bump the input version of) an account's data and queue its job.
    Seed {
        #[command(flatten)]
        paths: Paths,
        #[arg(long)]
        account: String,
        #[arg(long)]
        date: String,
        #[arg(long, default_value_t = 10_000)]
        balance_cents: i64,
    },
    /// Poll for open jobs and publish their statements.
    Worker {
        #[command(flatten)]
        paths: Paths,
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        server: String,
        #[arg(long, default_value = "worker")]
        name: String,
        /// Lease TTL in milliseconds.
        #[arg(long, default_value_t = 5_000)]
        ttl_ms: u64,
        /// One pass over the open jobs, then exit.
        #[arg(long)]
        once: bool,
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
        /// Stop with SIGSTOP after the last local ownership check, just before publishing.
        #[arg(long)]
        pause_before_publish: bool,
        /// Stop with SIGSTOP right after reading the input.
        #[arg(long)]
        pause_after_read: bool,
        /// Abort the process at this point (crash drills).
        #[arg(long)]
        crash_after: Option<worker::CrashPoint>,
        /// Only jobs of accounts whose name starts with this.
        #[arg(long, default_value = "")]
        accounts: String,
        /// Append every publish attempt (invoked, then ok, failed or unknown)
        /// to this file, for the fault suite's checker.
        #[arg(long)]
        history: Option<PathBuf>,
        /// NEGATIVE CONTROL ONLY: move the publication pointer with a blind
        /// write, no fence. Exists to prove the fault suite can see a stale write.
        #[arg(long, hide = true)]
        unfenced: bool,
        /// Chaos runs: stop with SIGSTOP before this percent of publishes.
        #[arg(long, hide = true, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
        pause_chance_pct: u32,
        #[arg(long, hide = true, default_value_t = 0)]
        chaos_seed: u64,
    },
    /// Run the service under a seeded storm of faults (pauses, kills of
    /// workers and of the Baton server, held, dropped and reset traffic),
    /// then check the histories against the resource's durable state.
    /// Exits 0 only when the verdict is clean.
    Chaos {
        /// Worker processes (1 to 64).
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// How long faults are injected (e.g. 60s, 10m); the run then settles.
        #[arg(long, default_value = "60s", value_parser = baton_client::flags::parse_duration)]
        duration: Duration,
        /// Seed of the fault schedule; random if not given (and printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Run against PostgreSQL (a TCP address) instead of SQLite.
        #[arg(long)]
        database_url: Option<String>,
        /// Print one JSON object as the report.
        #[arg(long)]
        json: bool,
        /// Switch fencing off at the resource. The run must then find stale
        /// overwrites and exit non-zero; otherwise the suite proves nothing.
        #[arg(long)]
        negative_control: bool,
        /// Lease TTL of the workers in milliseconds; pauses last 0.5 to 3 TTLs.
        #[arg(long, default_value_t = 1_000)]
        ttl_ms: u64,
        /// Percent of publish attempts on which a worker stops itself just
        /// before publishing (after its last ownership check).
        #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(0..=100))]
        pause_chance_pct: u32,
        /// Keep the run's files (server data, logs, histories) here.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
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
    },
    /// The authoritative state of one statement, side by side.
    Show {
        #[command(flatten)]
        paths: Paths,
        #[arg(long)]
        account: String,
        #[arg(long)]
        date: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job durably: job state, lease fence, and the resource's generation.
    Cancel {
        #[command(flatten)]
        paths: Paths,
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        server: String,
        #[arg(long)]
        account: String,
        #[arg(long)]
        date: String,
    },
    /// The paused-worker story with an embedded Baton server: Alice pauses,
    /// Bob takes over and publishes, Alice resumes and is rejected.
    Demo {
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

impl Paths {
    fn target(&self) -> store::Target {
        store::Target {
            db: self.db.clone(),
            database_url: self.database_url.clone(),
        }
    }
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` prints the context chain on one line: "seeding x: cannot connect ...".
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Seed {
            paths,
            account,
            date,
            balance_cents,
        } => {
            let db = store::open(&paths.target()).await?;
            let version = db.seed(&account, &date, balance_cents).await?;
            println!("seeded {account} {date}: input version {version}, job queued");
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker {
            paths,
            server,
            name,
            ttl_ms,
            once,
            poll_ms,
            pause_before_publish,
            pause_after_read,
            crash_after,
            accounts,
            history,
            unfenced,
            pause_chance_pct,
            chaos_seed,
        } => {
            worker::run(worker::WorkerConfig {
                target: paths.target(),
                objects: paths.objects,
                server,
                name,
                ttl: Duration::from_millis(ttl_ms),
                once,
                poll: Duration::from_millis(poll_ms),
                accounts,
                history,
                drills: worker::Drills {
                    pause_before_publish,
                    pause_after_read,
                    crash_after,
                    unfenced,
                    pause_chance_pct,
                    chaos_seed,
                },
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chaos {
            workers,
            duration,
            seed,
            database_url,
            json,
            negative_control,
            ttl_ms,
            pause_chance_pct,
            dir,
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
            });
            chaos::run(chaos::ChaosConfig {
                workers,
                duration,
                seed,
                database_url,
                json,
                negative_control,
                ttl: Duration::from_millis(ttl_ms),
                dir,
                pause_chance_pct,
            })
            .await
        }
        Command::Check {
            paths,
            history,
            accounts,
            json,
        } => {
            let db = store::open(&paths.target()).await?;
            let checked = chaos::check(&db, &history, &accounts).await?;
            let figures = checked.figures();
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&figures).expect("figures serialize")
                );
            } else if let serde_json::Value::Object(fields) =
                serde_json::to_value(&figures).expect("figures serialize")
            {
                for (k, v) in fields {
                    let v = v.as_str().map_or(v.to_string(), str::to_string);
                    println!("{k:<36} {v}");
                }
            }
            Ok(if checked.verdict.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::ServeBaton { data_dir, listen } => {
            let mut config = baton_server::ServerConfig::ephemeral(data_dir);
            config.listen = listen;
            let server = baton_server::start(config).await?;
            println!("listening on {}", server.grpc_addr);
            // Runs until killed: that is what it is for.
            std::future::pending::<()>().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Show {
            paths,
            account,
            date,
            json,
        } => {
            let text = show(&paths, &account, &date, json).await?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel {
            paths,
            server,
            account,
            date,
        } => {
            let at = cancel(&paths, &server, &account, &date).await?;
            println!("cancelled {account} {date}: every token at or below {at} is refused at the resource");
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            json,
            dir,
            database_url,
        } => demo::run(json, dir, database_url).await,
    }
}

/// Durable cancellation, in this order: the job becomes `cancelled` (workers
/// that pick it up skip it); Baton fences the lease (revoking it: the holder's
/// keeper sees "not owner" on its next renewal) and returns a token above
/// every token issued; the fence kit refuses every token at or below it.
async fn cancel(paths: &Paths, server: &str, account: &str, date: &str) -> anyhow::Result<i64> {
    let mut db = store::open(&paths.target()).await?;
    if !db.cancel_job(account, date).await? {
        return Err(anyhow::anyhow!("no job for {account} {date}"));
    }
    let resource = worker::resource(account, date);
    let mut client = baton_client::Client::connect(server).await?;
    let fenced = client.fence(&resource).await?;
    let at = Token::new(fenced.token.get())?;
    let key = ResourceKey::new(&resource)?;
    db.fence_cancel(&key, at).await?;
    Ok(at.get())
}

async fn show(paths: &Paths, account: &str, date: &str, json: bool) -> anyhow::Result<String> {
    let db = store::open(&paths.target()).await?;
    let kit = ObjectKit::local(&paths.objects)?;
    let job = db
        .job(account, date)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job for {account} {date}"))?;
    let input = db.input(account, date).await?;
    let key = ResourceKey::new(&worker::resource(account, date))?;
    let state = db.fence_state(&key).await?;
    let pointer = db.publication(&key).await?;
    let manifest = match &pointer {
        Some(p) => Some(kit.validate(&p.object_key, None, None).await?),
        None => None,
    };
    let outcomes = db.outcomes(account, date).await?;
    let generation = state.as_ref().map_or(0, |s| s.generation.get());
    let cancelled_at = state
        .as_ref()
        .and_then(|s| s.cancelled_at)
        .map_or(0, Token::get);
    let (pkey, ptoken, pop) = pointer.as_ref().map_or(("", 0, ""), |p| {
        (p.object_key.as_str(), p.token.get(), p.operation.as_str())
    });
    let (snapshot, checksum, valid) = match &manifest {
        Some(Ok(m)) => (
            m.input_snapshot.clone(),
            m.sha256_hex.clone(),
            "valid".to_string(),
        ),
        Some(Err(why)) => (String::new(), String::new(), why.to_string()),
        None => (String::new(), String::new(), "no publication".to_string()),
    };
    if json {
        let outcome_list: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|(w, t, o, d)| serde_json::json!({"worker": w, "token": t, "outcome": o, "detail": d}))
            .collect();
        let shown = serde_json::json!({
            "account": account,
            "date": date,
            "job_state": job.state,
            "job_token": job.token.unwrap_or(0),
            "input_version": input.as_ref().map_or(0, |i| i.version),
            "generation": generation,
            "cancelled_at": cancelled_at,
            "published_token": ptoken,
            "published_key": pkey,
            "published_operation": pop,
            "manifest_input": snapshot,
            "manifest_sha256": checksum,
            "object": valid,
            "outcomes": outcome_list,
        });
        return Ok(shown.to_string());
    }
    let mut out = format!(
        "statement {account} {date}\n  job:          {} (token {}, {})\n  input:        version {}\n  resource:     generation {generation}{}\n  publication:  {}\n  object:       {valid}{}\n  outcomes:\n",
        job.state,
        job.token.map_or("-".into(), |t| t.to_string()),
        job.detail.unwrap_or_default(),
        input.map_or("-".into(), |i| i.version.to_string()),
        if cancelled_at > 0 { format!(", cancelled at {cancelled_at}") } else { String::new() },
        if pkey.is_empty() { "none".to_string() } else { format!("{pkey} (token {ptoken}, operation {pop})") },
        if snapshot.is_empty() { String::new() } else { format!(" (input {snapshot}, sha256 {checksum})") },
    );
    for (w, t, o, d) in outcomes {
        out.push_str(&format!("    {w:<8} token {t:<16} {o:<12} {d}\n"));
    }
    Ok(out.trim_end().to_string())
}
