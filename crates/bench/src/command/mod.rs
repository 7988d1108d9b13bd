//! `baton bench`: cycles, filling, the live-lease scaling run, and the
//! overheads of watchers, pages and events beside the lease path. The
//! `baton` binary parses [`Args`] beside its client flags and calls
//! [`run`]; text rows are printed as each measurement ends, `--json`
//! prints one object at the end.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::{Baton, CycleFlags, Report, ScaleRow, Transport};

mod event;
mod page;
mod watch;

/// The flags of `baton bench` (the client flags aside: the server, TLS,
/// token and `--json` come in an [`Endpoint`]).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Client counts, time per measurement, TTL and modes.
    #[command(flatten)]
    pub cycle: CycleFlags,
    /// Cycle on sessions (one stream per client, leases tied to it, all on
    /// one connection) instead of a unary call per acquire and release.
    #[arg(long)]
    pub session: bool,
    /// How the clients hold what they acquire: exclusive, permits:N (a
    /// semaphore of N), readers:N (N shared holders to each writer).
    #[arg(long, default_value = "exclusive", value_parser = crate::parse_lock)]
    pub lock: crate::LockShape,
    /// Instead of cycling, fill the server with this many live leases
    /// (TTL --ttl) and report the rate; then read the server's memory.
    #[arg(long)]
    pub fill_leases: Option<usize>,
    /// Scaling run: for each count (ascending, like 0,100k,1M,10M), top
    /// the server up to that many live leases (TTL --ttl), then cycle on
    /// distinct resources with the first --clients count.
    #[arg(long)]
    pub live_leases: Option<String>,
    /// The server's process id, to report its resident memory per row.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// With --live-leases: an empty server measured in alternating rounds.
    #[arg(long)]
    pub baseline_server: Option<String>,
    /// With --live-leases or --watchers: rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Watch overhead: IDLE,BUSY watchers (like 1000,100). Rounds cycle on
    /// distinct resources at the first --clients count without watchers,
    /// then with IDLE watchers on a prefix that never changes and BUSY
    /// watchers reading every bench change; medians and their ratio.
    #[arg(long)]
    pub watchers: Option<String>,
    /// Operator page overhead: the server's HTTP address (--http-listen).
    /// Reports the time to the page's first data, then rounds cycle at the
    /// first --clients count without pages and beside --pages pages that
    /// refresh every second; medians and their ratio.
    #[arg(long, value_name = "HTTP_ADDR")]
    pub page: Option<String>,
    /// With --page: open pages.
    #[arg(long, default_value_t = 1)]
    pub pages: usize,
    /// Stall run: the first --clients count cycles on sessions on distinct
    /// resources while this event happens (`backup`: three `admin backup`
    /// in a row; `session-end`: a session holding 100,000 leases, set up
    /// first, closes, until the server has dropped them all, as its
    /// `baton_leases_ending` gauge says with --http; `none`: --settle of
    /// nothing, the baseline); prints
    /// the worst and p99.9 acquire and the worst `/readyz` before, during
    /// and after it. Fill the server first (--fill-leases).
    #[arg(long, value_enum)]
    pub event: Option<Event>,
    /// With --event: the server's HTTP address, probed at /readyz every 10 ms.
    #[arg(long, value_name = "HTTP_ADDR")]
    pub http: Option<std::net::SocketAddr>,
    /// With --event: quiet time before and after the event.
    #[arg(long, default_value = "3s", value_parser = baton_client::flags::parse_positive_duration)]
    pub settle: Duration,
}

/// What happens beside the clients in an `--event` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Event {
    /// Three `baton admin backup` in a row.
    Backup,
    /// A session holding 100,000 leases closes.
    SessionEnd,
    /// Nothing: the baseline.
    None,
}

/// The server a run measures, and how to reach it.
#[derive(Clone)]
pub struct Endpoint {
    /// The server's gRPC URL (several, comma-separated, for a cluster).
    pub server: String,
    /// TLS and token for every connection.
    pub options: baton_client::ConnectOptions,
    /// The bearer token's file, for the page's HTTP calls.
    pub token_file: Option<PathBuf>,
    /// Each call's time limit, for the calls that set a run up.
    pub rpc_timeout: Duration,
    /// The `baton` executable that `--event backup` runs `admin backup` of.
    pub baton: PathBuf,
}

/// Why a run did not report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag's value cannot be measured (exit 2 in the CLI).
    #[error("{0}")]
    Usage(String),
    /// A measurement failed: the server refused or broke off.
    #[error("bench: {0}")]
    Failed(String),
}

impl From<baton_client::ClientError> for BenchError {
    fn from(e: baton_client::ClientError) -> Self {
        failed(e)
    }
}

/// A failed measurement, with every cause in its chain.
fn failed(e: impl std::fmt::Display) -> BenchError {
    BenchError::Failed(format!("{e:#}"))
}

/// Prints `out` as one JSON line or as its text.
fn emit<T: Serialize>(json: bool, out: &T, text: impl FnOnce(&T) -> String) {
    if json {
        print_json(out);
    } else {
        println!("{}", text(out));
    }
}

/// One measurement in `--json`.
#[derive(Serialize)]
struct RunJson {
    mode: &'static str,
    clients: usize,
    cycles: u64,
    cycles_per_s: u64,
    acquire_p50_us: u64,
    acquire_p99_us: u64,
    acquire_max_us: u64,
    release_p50_us: u64,
    release_p99_us: u64,
    errors: u64,
}

impl From<&Report> for RunJson {
    fn from(r: &Report) -> Self {
        Self {
            mode: r.mode.label(),
            clients: r.clients,
            cycles: r.cycles,
            cycles_per_s: r.cycles_per_s.round() as u64,
            acquire_p50_us: r.acquire_us.p50,
            acquire_p99_us: r.acquire_us.p99,
            acquire_max_us: r.acquire_us.max,
            release_p50_us: r.release_us.p50,
            release_p99_us: r.release_us.p99,
            errors: r.errors,
        }
    }
}

/// One scaling row in `--json`.
#[derive(Serialize)]
struct ScaleJson {
    live_leases: usize,
    cycles_per_s: u64,
    acquire_p99_us: u64,
    baseline_cycles_per_s: u64,
    server_rss_bytes: u64,
}

impl From<&ScaleRow> for ScaleJson {
    fn from(r: &ScaleRow) -> Self {
        Self {
            live_leases: r.live_leases,
            cycles_per_s: r.cycles_per_s.round() as u64,
            acquire_p99_us: r.acquire_p99_us,
            baseline_cycles_per_s: r.baseline_cycles_per_s.map_or(0, |c| c.round() as u64),
            server_rss_bytes: r.server_rss_bytes.unwrap_or(0),
        }
    }
}

/// On a terminal (and without --json), a line every 2 s: leases filled so far.
fn progress_line(
    json: bool,
    total: usize,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Option<tokio::task::JoinHandle<()>> {
    if json || !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
        loop {
            tick.tick().await;
            let n = done.load(std::sync::atomic::Ordering::Relaxed);
            print!("\r  filled {n} of {total} leases   ");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
    }))
}

fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string(value).expect("output types serialize")
    );
}

/// `baton bench`, in whichever of its forms the flags ask for.
pub async fn run(a: &Args, to: &Endpoint, json: bool) -> Result<(), BenchError> {
    if let Some(n) = a.fill_leases {
        return fill(a, to, json, n).await;
    }
    if let Some(levels) = &a.live_leases {
        return scale(a, to, json, levels).await;
    }
    if let Some(spec) = &a.watchers {
        return watch::overhead(a, to, json, spec).await;
    }
    if let Some(addr) = &a.page {
        return page::overhead(a, to, json, addr).await;
    }
    if let Some(event) = a.event {
        return event::stalls(a, to, json, event).await;
    }
    cycles(a, to, json).await
}

/// Sessions on one shared connection, or a unary call per step.
fn transport(a: &Args) -> Transport {
    if a.session {
        Transport::SessionSharedConnection
    } else {
        Transport::Unary
    }
}

async fn cycles(a: &Args, to: &Endpoint, json: bool) -> Result<(), BenchError> {
    let label = if a.session { "baton session" } else { "baton" };
    let target = Baton::new(label, to.server.clone(), a.cycle.ttl)
        .with_transport(transport(a))
        .with_options(to.options.clone())
        .with_lock(a.lock);
    let run_id = a.cycle.run_id("");
    let mut runs = Vec::new();
    if !json {
        println!("{}", Report::header());
    }
    for mode in a.cycle.modes.to_vec() {
        for &c in a.cycle.clients.all() {
            let report = crate::run(&target, mode, c, a.cycle.duration, &run_id)
                .await
                .map_err(failed)?;
            if !json {
                println!("{}", report.line());
            }
            runs.push(RunJson::from(&report));
        }
    }
    if json {
        #[derive(Serialize)]
        struct Runs {
            runs: Vec<RunJson>,
        }
        print_json(&Runs { runs });
    }
    Ok(())
}

async fn fill(a: &Args, to: &Endpoint, json: bool, n_leases: usize) -> Result<(), BenchError> {
    let run_id = std::process::id().to_string();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = progress_line(json, n_leases, done.clone());
    let took = crate::fill_counting(&to.server, n_leases, a.cycle.ttl, &run_id, done)
        .await
        .map_err(failed);
    if let Some(p) = progress {
        p.abort();
        println!();
    }
    let took = took?;
    let per_s = n_leases as f64 / took.as_secs_f64();
    if json {
        #[derive(Serialize)]
        struct Filled {
            leases: usize,
            millis: u64,
            leases_per_s: u64,
        }
        print_json(&Filled {
            leases: n_leases,
            millis: took.as_millis() as u64,
            leases_per_s: per_s as u64,
        });
    } else {
        println!(
            "filled {n_leases} leases in {:.1}s ({per_s:.0} leases/s)",
            took.as_secs_f64()
        );
    }
    Ok(())
}

fn scale_line(row: &ScaleRow) -> String {
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

async fn scale(a: &Args, to: &Endpoint, json: bool, levels: &str) -> Result<(), BenchError> {
    let levels = crate::parse_counts(levels)
        .map_err(|e| BenchError::Usage(format!("--live-leases: {e}")))?;
    let clients = a.cycle.clients.first();
    let ttl = a.cycle.ttl;
    let target = Baton::new("baton", to.server.clone(), ttl);
    let baseline = a
        .baseline_server
        .clone()
        .map(|url| Baton::new("baton (baseline)", url, ttl));
    let run = crate::Scale {
        target: &target,
        baseline: baseline.as_ref(),
        levels: &levels,
        fill_ttl: ttl,
        clients,
        duration: a.cycle.duration,
        rounds: a.rounds,
        server_pid: a.server_pid,
    };
    if !json {
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
    let run_id = std::process::id().to_string();
    let rows = crate::scale(&run, &run_id, |row| {
        if !json {
            println!("{}", scale_line(row));
        }
    })
    .await
    .map_err(failed)?;
    if json {
        #[derive(Serialize)]
        struct Rows {
            rows: Vec<ScaleJson>,
        }
        print_json(&Rows {
            rows: rows.iter().map(ScaleJson::from).collect(),
        });
    }
    Ok(())
}
