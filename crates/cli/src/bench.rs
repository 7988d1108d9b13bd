//! `baton bench`: cycles, filling, and the live-lease scaling run. Text rows
//! are printed as each measurement ends; `--json` prints one object at the end.

use baton_bench::{Baton, Report, ScaleRow, Transport};
use serde::Serialize;

use crate::args::BenchArgs;
use crate::error::{CliError, Exit};

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

/// A failed measurement, with every cause in its chain.
pub(crate) fn bench_error(e: impl std::fmt::Display) -> CliError {
    CliError::failure(format!("bench: {e:#}"))
}

/// `baton bench`, in whichever of its three forms the flags ask for.
pub async fn bench(a: BenchArgs) -> Result<Exit, CliError> {
    if let Some(n) = a.fill_leases {
        return fill(&a, n).await;
    }
    if let Some(levels) = &a.live_leases {
        return scale(&a, levels).await;
    }
    if let Some(spec) = &a.watchers {
        return crate::bench_watch::overhead(&a, spec).await;
    }
    if let Some(addr) = &a.page {
        return crate::bench_page::overhead(&a, addr).await;
    }
    if let Some(event) = &a.event {
        return crate::bench_event::stalls(&a, event).await;
    }
    cycles(&a).await
}

async fn cycles(a: &BenchArgs) -> Result<Exit, CliError> {
    let json = a.client.json;
    let counts = baton_bench::parse_clients(&a.clients)
        .map_err(|e| CliError::usage(format!("--clients: {e}")))?;
    let modes = a.modes.to_vec();
    let label = if a.session { "baton session" } else { "baton" };
    let transport = if a.session {
        Transport::SessionSharedConnection
    } else {
        Transport::Unary
    };
    let target = Baton::new(label, a.client.server.clone(), a.ttl)
        .with_transport(transport)
        .with_options(crate::lease::connect_options(&a.client)?);
    let run_id = std::process::id().to_string();
    let mut runs = Vec::new();
    if !json {
        println!("{}", Report::header());
    }
    for mode in modes {
        for &c in &counts {
            let report = baton_bench::run(&target, mode, c, a.duration, &run_id)
                .await
                .map_err(bench_error)?;
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
    Ok(Exit::Ok)
}

async fn fill(a: &BenchArgs, n_leases: usize) -> Result<Exit, CliError> {
    let run_id = std::process::id().to_string();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = progress_line(a.client.json, n_leases, done.clone());
    let took = baton_bench::fill_counting(&a.client.server, n_leases, a.ttl, &run_id, done)
        .await
        .map_err(bench_error);
    if let Some(p) = progress {
        p.abort();
        println!();
    }
    let took = took?;
    let per_s = n_leases as f64 / took.as_secs_f64();
    if a.client.json {
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
    Ok(Exit::Ok)
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

async fn scale(a: &BenchArgs, levels: &str) -> Result<Exit, CliError> {
    let json = a.client.json;
    let levels = baton_bench::parse_counts(levels)
        .map_err(|e| CliError::usage(format!("--live-leases: {e}")))?;
    let clients = baton_bench::parse_clients(&a.clients)
        .map_err(|e| CliError::usage(format!("--clients: {e}")))?[0];
    let target = Baton::new("baton", a.client.server.clone(), a.ttl);
    let baseline = a
        .baseline_server
        .clone()
        .map(|url| Baton::new("baton (baseline)", url, a.ttl));
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
    let rows = baton_bench::scale(&run, &run_id, |row| {
        if !json {
            println!("{}", scale_line(row));
        }
    })
    .await
    .map_err(bench_error)?;
    if json {
        #[derive(Serialize)]
        struct Rows {
            rows: Vec<ScaleJson>,
        }
        print_json(&Rows {
            rows: rows.iter().map(ScaleJson::from).collect(),
        });
    }
    Ok(Exit::Ok)
}
