//! The `baton` command. Flags are parsed by clap, then validated into the
//! server or client configuration; each subcommand lives in its own function.

mod json;
mod parse;
mod restore;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_client::{AcquiredAll, Client, ClientError, Release, Renewal};
use baton_core::{AcquisitionId, Limits};
use clap::{Args, Parser, Subcommand};
use json::Json;
use parse::parse_duration;

/// glibc's allocator slows down as the heap fills with millions of small
/// lease entries (its free lists grow: `_int_malloc` was the top symbol at
/// 10M live leases); mimalloc's per-size pages keep a request's allocations
/// cheap whatever the table's size.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EXIT_CODES: &str = "Exit codes:
  0  success (also: release of a lease that was not held, which changes nothing)
  1  any other failure (server unreachable, outcome unknown, storage error)
  2  invalid usage or input (bad name, TTL or wait out of bounds, bad flag)
  3  not acquired (held by someone else, or the wait ran out)
  4  not owner (renew of a lease that expired, was released, fenced or replaced)";

#[derive(Parser)]
#[command(name = "baton", version, about = "Leases with fencing tokens that make stale workers harmless", after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct ClientOpts {
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:7700", global = true)]
    server: String,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the lease server on the embedded store.
    Serve(ServeArgs),
    /// Acquire one resource, or several all or nothing.
    Acquire {
        /// Resource names; with several, every lease is granted or none.
        #[arg(required = true)]
        names: Vec<String>,
        /// Lease duration, like 500ms, 30s or 5m.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        ttl: Duration,
        /// Wait in line up to this long (0: try once).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        wait: Duration,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Extend a lease by its TTL, proving ownership with its acquisition id.
    Renew {
        name: String,
        /// The acquisition id (32 hex digits) printed by acquire.
        #[arg(long)]
        acquisition: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Release a lease. Releasing twice, or with an old id, changes nothing.
    Release {
        name: String,
        #[arg(long)]
        acquisition: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Holder token, remaining TTL and waiters of a resource.
    Status {
        name: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Resources with a lease or waiters, by name prefix.
    List {
        #[arg(long, default_value = "")]
        prefix: String,
        /// Continue after this name.
        #[arg(long)]
        start_after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Revoke a resource's lease and advance its token (operator cancel).
    Fence {
        name: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Backup and restore.
    #[command(subcommand)]
    Admin(Admin),
    /// Load generator: acquire → release cycles against a running server.
    Bench {
        /// Client counts to run, comma-separated.
        #[arg(long, default_value = "1,16,64")]
        clients: String,
        /// Time per measurement.
        #[arg(long, default_value = "3s", value_parser = parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        ttl: Duration,
        /// distinct (each client its own resource), shared (all on one), or both.
        #[arg(long, default_value = "both", value_parser = ["distinct", "shared", "both"])]
        modes: String,
        /// Instead of cycling, fill the server with this many live leases
        /// (TTL --ttl) and report the rate; then read the server's memory.
        #[arg(long)]
        fill_leases: Option<usize>,
        /// Scaling run: for each count (ascending, like 0,100k,1M,10M), top
        /// the server up to that many live leases (TTL --ttl), then cycle on
        /// distinct resources with the first --clients count.
        #[arg(long)]
        live_leases: Option<String>,
        /// The server's process id, to report its resident memory per row.
        #[arg(long)]
        server_pid: Option<u32>,
        /// With --live-leases: an empty server measured in alternating rounds.
        #[arg(long)]
        baseline_server: Option<String>,
        /// With --live-leases: rounds per level (medians are reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[command(flatten)]
        client: ClientOpts,
    },
}

#[derive(Subcommand)]
enum Admin {
    /// Write a consistent snapshot of a running server to a file.
    Backup {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Replace a (stopped) server's data directory with a backup, in a new token epoch.
    ///
    /// The new epoch is above the backup's, above the replaced directory's
    /// (read from its store or its identity file), above every token the
    /// resources named by --floor-from recorded, at least --min-epoch, and at
    /// least a wall-clock floor. Every lease is dropped: holders acquire again.
    #[command(group(clap::ArgGroup::new("source").required(true).args(["from", "empty"])))]
    Restore {
        /// The backup file written by `baton admin backup`.
        #[arg(long)]
        from: Option<PathBuf>,
        /// No backup: start an empty store (for a store file that was lost or damaged).
        #[arg(long)]
        empty: bool,
        #[arg(long, default_value = "baton-data")]
        data_dir: PathBuf,
        /// Lowest acceptable new epoch.
        #[arg(long)]
        min_epoch: Option<u32>,
        /// A fence-kit database (postgres://… or sqlite:PATH) whose highest
        /// recorded token the new epoch must be above; repeat for several.
        #[arg(long)]
        floor_from: Vec<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// gRPC address.
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// HTTP address for /healthz and /metrics.
    #[arg(long, default_value = "127.0.0.1:7701")]
    http_listen: SocketAddr,
    /// Where the embedded store keeps its file.
    #[arg(long, default_value = "baton-data")]
    data_dir: PathBuf,
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    default_ttl: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ttl_min: Duration,
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    ttl_max: Duration,
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    wait_max: Duration,
    #[arg(long, default_value_t = 1_024)]
    max_waiters_per_resource: usize,
    #[arg(long, default_value_t = 100_000)]
    max_waiters: usize,
    #[arg(long, default_value_t = 1_024)]
    max_connections: usize,
    /// A new connection must send its first request within this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    idle_timeout: Duration,
    #[arg(long, default_value_t = 64)]
    max_resources_per_request: usize,
}

/// The documented exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exit {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    NotAcquired = 3,
    NotOwner = 4,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

fn fail(json: bool, code: Exit, message: &str) -> Exit {
    if json {
        println!(
            "{}",
            Json::obj()
                .str("error", message)
                .num("exit_code", code as u64)
        );
    }
    eprintln!("error: {message}");
    code
}

fn client_failure(json: bool, e: &ClientError) -> Exit {
    let code = match e {
        ClientError::Invalid(_) => Exit::Usage,
        _ => Exit::Failure,
    };
    fail(json, code, &e.to_string())
}

fn parse_id(json: bool, hex: &str) -> Result<AcquisitionId, Exit> {
    AcquisitionId::from_hex(hex).ok_or_else(|| {
        fail(
            json,
            Exit::Usage,
            &format!("acquisition id {hex:?} must be exactly 32 hex digits"),
        )
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(cli.command)).into()
}

async fn connect(opts: &ClientOpts) -> Result<Client, Exit> {
    Client::connect(&opts.server)
        .await
        .map_err(|e| client_failure(opts.json, &e))
}

async fn run(command: Command) -> Exit {
    let result = match command {
        Command::Serve(args) => serve(args).await,
        Command::Acquire {
            names,
            ttl,
            wait,
            client,
        } => acquire(&client, &names, ttl, wait).await,
        Command::Renew {
            name,
            acquisition,
            client,
        } => renew(&client, &name, &acquisition).await,
        Command::Release {
            name,
            acquisition,
            client,
        } => release(&client, &name, &acquisition).await,
        Command::Status { name, client } => status(&client, &name).await,
        Command::List {
            prefix,
            start_after,
            limit,
            client,
        } => list(&client, &prefix, start_after.as_deref(), limit).await,
        Command::Fence { name, client } => fence(&client, &name).await,
        Command::Admin(Admin::Backup { out, client }) => backup(&client, &out).await,
        Command::Admin(Admin::Restore {
            from,
            empty: _,
            data_dir,
            min_epoch,
            floor_from,
            json,
        }) => restore(from.as_deref(), &data_dir, min_epoch, &floor_from, json).await,
        Command::Bench {
            fill_leases: Some(n),
            ttl,
            client,
            ..
        } => fill(&client, n, ttl).await,
        Command::Bench {
            live_leases: Some(levels),
            clients,
            duration,
            ttl,
            server_pid,
            baseline_server,
            rounds,
            client,
            ..
        } => {
            let run = ScaleArgs {
                levels,
                clients,
                duration,
                ttl,
                server_pid,
                baseline_server,
                rounds,
            };
            scale(&client, run).await
        }
        Command::Bench {
            clients,
            duration,
            ttl,
            modes,
            client,
            ..
        } => bench(&client, &clients, duration, ttl, &modes).await,
    };
    result.unwrap_or_else(|code| code)
}

async fn serve(args: ServeArgs) -> Result<Exit, Exit> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    let ms = |d: Duration| d.as_millis() as u64;
    let config = baton_server::ServerConfig {
        listen: args.listen,
        http_listen: Some(args.http_listen),
        data_dir: args.data_dir,
        limits: Limits {
            ttl_ms_min: ms(args.ttl_min),
            ttl_ms_max: ms(args.ttl_max),
            wait_ms_max: ms(args.wait_max),
            n_resources_per_request_max: args.max_resources_per_request,
            n_waiters_per_resource_max: args.max_waiters_per_resource,
            n_waiters_max: args.max_waiters,
        },
        default_ttl_ms: ms(args.default_ttl),
        connections_max: args.max_connections,
        handshake_timeout_ms: ms(args.handshake_timeout),
        idle_timeout_ms: ms(args.idle_timeout),
    };
    let mut server = match baton_server::start(config).await {
        Ok(s) => s,
        Err(e @ baton_server::ServerError::Config(_)) => {
            return Err(fail(false, Exit::Usage, &e.to_string()))
        }
        Err(e) => return Err(fail(false, Exit::Failure, &e.to_string())),
    };
    let http = server.http_addr.map(|a| a.to_string()).unwrap_or_default();
    println!("baton listening grpc={} http={http}", server.grpc_addr);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| {
            fail(
                false,
                Exit::Failure,
                &format!("cannot install SIGTERM handler: {e}"),
            )
        })?;
    let stopped = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        r = server.wait() => Some(r),
    };
    let result = match stopped {
        Some(r) => r,
        None => server.shutdown().await,
    };
    match result {
        Ok(()) => Ok(Exit::Ok),
        Err(e) => Err(fail(false, Exit::Failure, &e.to_string())),
    }
}

fn lease_json(lease: &baton_client::Lease) -> Json {
    Json::obj()
        .str("resource", &lease.resource)
        .str("acquisition_id", &lease.acquisition_id.to_hex())
        .num("token", lease.token.get())
        .num("ttl_ms", lease.ttl.as_millis() as u64)
}

async fn acquire(
    opts: &ClientOpts,
    names: &[String],
    ttl: Duration,
    wait: Duration,
) -> Result<Exit, Exit> {
    let mut client = connect(opts).await?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let outcome = client
        .acquire_all(&refs, ttl, wait)
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    match outcome {
        AcquiredAll::Granted { leases, after_wait } => {
            if opts.json {
                if let [one] = leases.as_slice() {
                    println!("{}", lease_json(one).bool("after_wait", after_wait));
                } else {
                    let list = leases.iter().map(lease_json).collect();
                    println!(
                        "{}",
                        Json::obj()
                            .arr("leases", list)
                            .bool("after_wait", after_wait)
                    );
                }
            } else {
                for l in &leases {
                    println!(
                        "acquired {} token={} acquisition_id={} ttl={}ms",
                        l.resource,
                        l.token,
                        l.acquisition_id.to_hex(),
                        l.ttl.as_millis()
                    );
                }
            }
            Ok(Exit::Ok)
        }
        AcquiredAll::NotAcquired(n) => {
            let reason = if n.timed_out { "timed_out" } else { "held" };
            if opts.json {
                let mut j = Json::obj().bool("acquired", false).str("reason", reason);
                if let Some(r) = &n.resource {
                    j = j.str("resource", r);
                }
                if let Some(t) = n.holder_token {
                    j = j.num("holder_token", t.get());
                }
                println!("{j}");
            } else if n.timed_out {
                println!("not acquired: the wait of {}ms ran out", wait.as_millis());
            } else {
                let holder = n.holder_token.map_or("waiters ahead".to_string(), |t| {
                    format!("held by token {t}")
                });
                println!(
                    "not acquired: {} is {holder}",
                    n.resource.unwrap_or_default()
                );
            }
            Ok(Exit::NotAcquired)
        }
    }
}

async fn renew(opts: &ClientOpts, name: &str, hex: &str) -> Result<Exit, Exit> {
    let id = parse_id(opts.json, hex)?;
    let mut client = connect(opts).await?;
    match client
        .renew(name, &id)
        .await
        .map_err(|e| client_failure(opts.json, &e))?
    {
        Renewal::Renewed { token, remaining } => {
            if opts.json {
                println!(
                    "{}",
                    Json::obj()
                        .bool("renewed", true)
                        .num("token", token.get())
                        .num("remaining_ms", remaining.as_millis() as u64)
                );
            } else {
                println!(
                    "renewed {name} token={token} remaining={}ms",
                    remaining.as_millis()
                );
            }
            Ok(Exit::Ok)
        }
        Renewal::NotOwner => {
            if opts.json {
                println!(
                    "{}",
                    Json::obj()
                        .bool("renewed", false)
                        .str("reason", "not_owner")
                );
            } else {
                println!(
                    "not owner: the lease on {name} expired, was released, fenced or replaced"
                );
            }
            Ok(Exit::NotOwner)
        }
    }
}

async fn release(opts: &ClientOpts, name: &str, hex: &str) -> Result<Exit, Exit> {
    let id = parse_id(opts.json, hex)?;
    let mut client = connect(opts).await?;
    let out = client
        .release(name, &id)
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    match out {
        Release::Released { token } if opts.json => {
            println!("{}", Json::obj().bool("released", true).num("token", token.get()))
        }
        Release::Released { token } => println!("released {name} token={token}"),
        Release::NotHeld if opts.json => println!("{}", Json::obj().bool("released", false).str("reason", "not_held")),
        Release::NotHeld => println!("not held: {name} was already released, expired, fenced or held by another acquisition; nothing changed"),
    }
    Ok(Exit::Ok)
}

fn status_json(s: &baton_client::Status) -> Json {
    let j = Json::obj()
        .str("resource", &s.resource)
        .bool("held", s.holder_token.is_some());
    let j = match s.holder_token {
        Some(t) => j.num("holder_token", t.get()),
        None => j.null("holder_token"),
    };
    j.num("remaining_ms", s.remaining.as_millis() as u64)
        .num("ttl_ms", s.ttl.as_millis() as u64)
        .num("n_waiters", s.n_waiters)
}

fn status_line(s: &baton_client::Status) -> String {
    match s.holder_token {
        Some(t) => format!(
            "{} held token={t} remaining={}ms waiters={}",
            s.resource,
            s.remaining.as_millis(),
            s.n_waiters
        ),
        None => format!("{} free waiters={}", s.resource, s.n_waiters),
    }
}

async fn status(opts: &ClientOpts, name: &str) -> Result<Exit, Exit> {
    let mut client = connect(opts).await?;
    let s = client
        .status(name)
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    if opts.json {
        println!("{}", status_json(&s));
    } else {
        println!("{}", status_line(&s));
    }
    Ok(Exit::Ok)
}

async fn list(
    opts: &ClientOpts,
    prefix: &str,
    start_after: Option<&str>,
    limit: u32,
) -> Result<Exit, Exit> {
    let mut client = connect(opts).await?;
    let entries = client
        .list(prefix, start_after, limit)
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    if opts.json {
        println!(
            "{}",
            Json::obj().arr("entries", entries.iter().map(status_json).collect())
        );
    } else {
        entries.iter().for_each(|s| println!("{}", status_line(s)));
    }
    Ok(Exit::Ok)
}

async fn fence(opts: &ClientOpts, name: &str) -> Result<Exit, Exit> {
    let mut client = connect(opts).await?;
    let f = client
        .fence(name)
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    if opts.json {
        let j = Json::obj()
            .str("resource", name)
            .num("token", f.token.get());
        let j = match f.revoked {
            Some(t) => j.num("revoked_token", t.get()),
            None => j.null("revoked_token"),
        };
        println!("{j}");
    } else {
        let revoked = f.revoked.map_or("no lease was held".to_string(), |t| {
            format!("revoked token {t}")
        });
        println!("fenced {name} token={} ({revoked})", f.token);
    }
    Ok(Exit::Ok)
}

async fn backup(opts: &ClientOpts, out: &std::path::Path) -> Result<Exit, Exit> {
    use prost::Message;
    let mut client = connect(opts).await?;
    let snapshot = client
        .backup()
        .await
        .map_err(|e| client_failure(opts.json, &e))?;
    let bytes = snapshot.encode_to_vec();
    let tmp = out.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, out)
    };
    write().map_err(|e| {
        fail(
            opts.json,
            Exit::Failure,
            &format!("cannot write {}: {e}", out.display()),
        )
    })?;
    if opts.json {
        println!(
            "{}",
            Json::obj()
                .str("path", &out.display().to_string())
                .num("epoch", u64::from(snapshot.epoch))
                .num("counter", snapshot.counter)
                .num("n_leases", snapshot.stored_leases.len() as u64)
        );
    } else {
        println!(
            "backup written to {}: epoch {} counter {} leases {}",
            out.display(),
            snapshot.epoch,
            snapshot.counter,
            snapshot.stored_leases.len()
        );
    }
    Ok(Exit::Ok)
}

async fn restore(
    from: Option<&std::path::Path>,
    data_dir: &std::path::Path,
    min_epoch: Option<u32>,
    floor_from: &[String],
    json: bool,
) -> Result<Exit, Exit> {
    let to_exit = |e: restore::RestoreError| {
        let code = if e.usage { Exit::Usage } else { Exit::Failure };
        fail(json, code, &e.message)
    };
    let mut resources_floor = None;
    for url in floor_from {
        let floor = restore::resources_floor(url).await.map_err(to_exit)?;
        resources_floor = resources_floor.max(floor);
    }
    let now_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let r = restore::restore(from, data_dir, min_epoch, resources_floor, now_unix_s)
        .map_err(to_exit)?;
    let backup_epoch = r.backup_epoch.map_or(0, |e| u64::from(e.get()));
    if json {
        println!(
            "{}",
            Json::obj()
                .num("backup_epoch", backup_epoch)
                .num("resources_floor", r.resources_floor.map_or(0, |t| t.get()))
                .num("epoch", u64::from(r.epoch.get()))
                .num("first_token", r.first_token.get())
                .num("dropped_leases", r.dropped_leases as u64)
        );
    } else {
        let floor = r.resources_floor.map_or(String::new(), |t| {
            format!("; resources recorded up to token {t}")
        });
        println!(
            "restored into {}: new epoch {} (backup epoch {backup_epoch}{floor}); every new token is at least {}; {} leases from the backup were dropped",
            data_dir.display(),
            r.epoch.get(),
            r.first_token,
            r.dropped_leases
        );
    }
    Ok(Exit::Ok)
}

async fn fill(opts: &ClientOpts, n_leases: usize, ttl: Duration) -> Result<Exit, Exit> {
    let run_id = std::process::id().to_string();
    let took = baton_bench::fill(&opts.server, n_leases, ttl, &run_id)
        .await
        .map_err(|e| fail(opts.json, Exit::Failure, &format!("bench: {e}")))?;
    let per_s = n_leases as f64 / took.as_secs_f64();
    if opts.json {
        println!(
            "{}",
            Json::obj()
                .num("leases", n_leases as u64)
                .num("millis", took.as_millis() as u64)
                .num("leases_per_s", per_s as u64)
        );
    } else {
        println!(
            "filled {n_leases} leases in {:.1}s ({per_s:.0} leases/s)",
            took.as_secs_f64()
        );
    }
    Ok(Exit::Ok)
}

struct ScaleArgs {
    levels: String,
    clients: String,
    duration: Duration,
    ttl: Duration,
    server_pid: Option<u32>,
    baseline_server: Option<String>,
    rounds: usize,
}

fn scale_line(row: &baton_bench::ScaleRow) -> String {
    let ms = |us: u64| format!("{:.2}ms", us as f64 / 1000.0);
    let rss = row
        .server_rss_bytes
        .map_or("-".to_string(), |b| format!("{} MiB", b / (1 << 20)));
    let (base, base_p99, ratio) = match (row.baseline_cycles_per_s, row.baseline_acquire_p99_us) {
        (Some(b), Some(p)) => (
            format!("{b:.0}"),
            ms(p),
            format!("{:.2}", row.cycles_per_s / b),
        ),
        _ => ("-".into(), "-".into(), "-".into()),
    };
    format!(
        "{:>12} {:>10.0} {:>9} {:>10} {:>9} {:>6} {:>11} {:>8.1}",
        row.live_leases,
        row.cycles_per_s,
        ms(row.acquire_p99_us),
        base,
        base_p99,
        ratio,
        rss,
        row.fill_s
    )
}

async fn scale(opts: &ClientOpts, a: ScaleArgs) -> Result<Exit, Exit> {
    let usage = |flag: &str, e: String| fail(opts.json, Exit::Usage, &format!("{flag}: {e}"));
    let levels = baton_bench::parse_counts(&a.levels).map_err(|e| usage("--live-leases", e))?;
    let clients = baton_bench::parse_clients(&a.clients).map_err(|e| usage("--clients", e))?[0];
    let target = baton_bench::Baton {
        url: opts.server.clone(),
        ttl: a.ttl,
    };
    let baseline = a
        .baseline_server
        .map(|url| baton_bench::Baton { url, ttl: a.ttl });
    let run = baton_bench::Scale {
        target: &target,
        baseline: baseline.as_ref(),
        levels: &levels,
        fill_ttl: a.ttl,
        clients,
        duration: a.duration,
        rounds: a.rounds,
        server_pid: a.server_pid,
    };
    if !opts.json {
        println!(
            "distinct acquire -> release cycles, C={clients}, medians of {} rounds",
            a.rounds
        );
        println!(
            "{:>12} {:>10} {:>9} {:>10} {:>9} {:>6} {:>11} {:>8}",
            "live leases",
            "cycles/s",
            "acq p99",
            "empty c/s",
            "empty p99",
            "ratio",
            "server RSS",
            "fill s"
        );
    }
    let json = opts.json;
    let run_id = std::process::id().to_string();
    let rows = baton_bench::scale(&run, &run_id, |row| {
        if !json {
            println!("{}", scale_line(row));
        }
    })
    .await
    .map_err(|e| fail(opts.json, Exit::Failure, &format!("bench: {e}")))?;
    if opts.json {
        let rows = rows
            .iter()
            .map(|r| {
                Json::obj()
                    .num("live_leases", r.live_leases as u64)
                    .num("cycles_per_s", r.cycles_per_s.round() as u64)
                    .num("acquire_p99_us", r.acquire_p99_us)
                    .num(
                        "baseline_cycles_per_s",
                        r.baseline_cycles_per_s.map_or(0, |c| c.round() as u64),
                    )
                    .num("server_rss_bytes", r.server_rss_bytes.unwrap_or(0))
            })
            .collect();
        println!("{}", Json::obj().arr("rows", rows));
    }
    Ok(Exit::Ok)
}

async fn bench(
    opts: &ClientOpts,
    clients: &str,
    duration: Duration,
    ttl: Duration,
    modes: &str,
) -> Result<Exit, Exit> {
    use baton_bench::{parse_clients, Baton, Mode, Report};
    let counts = parse_clients(clients)
        .map_err(|e| fail(opts.json, Exit::Usage, &format!("--clients: {e}")))?;
    let modes = match modes {
        "distinct" => vec![Mode::Distinct],
        "shared" => vec![Mode::Shared],
        _ => vec![Mode::Distinct, Mode::Shared],
    };
    let target = Baton {
        url: opts.server.clone(),
        ttl,
    };
    let run_id = std::process::id().to_string();
    let mut rows = Vec::new();
    if !opts.json {
        println!("{}", Report::header());
    }
    for mode in modes {
        for &c in &counts {
            let report = baton_bench::run(&target, mode, c, duration, &run_id)
                .await
                .map_err(|e| fail(opts.json, Exit::Failure, &format!("bench: {e}")))?;
            if opts.json {
                rows.push(
                    Json::obj()
                        .str("mode", mode.label())
                        .num("clients", c as u64)
                        .num("cycles", report.cycles)
                        .num("cycles_per_s", report.cycles_per_s.round() as u64)
                        .num("acquire_p50_us", report.acquire_us.p50)
                        .num("acquire_p99_us", report.acquire_us.p99)
                        .num("acquire_max_us", report.acquire_us.max)
                        .num("release_p50_us", report.release_us.p50)
                        .num("release_p99_us", report.release_us.p99)
                        .num("errors", report.errors),
                );
            } else {
                println!("{}", report.line());
            }
        }
    }
    if opts.json {
        println!("{}", Json::obj().arr("runs", rows));
    }
    Ok(Exit::Ok)
}
