//! `baton-sim`: runs Baton under seeds. See docs/simulator.md.

use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use baton_sim::{run, Config, Report, Variant};
use clap::Parser;

/// Runs Baton's deterministic simulation: one seed with its trace, a
/// range of seeds, a timed block of fresh random seeds, or the search
/// for each known-bad variant.
#[derive(Parser, Debug)]
#[command(name = "baton-sim", version)]
struct Args {
    /// Replay one seed and print its readable trace.
    #[arg(long, conflicts_with_all = ["seeds", "minutes", "variants"])]
    seed: Option<u64>,
    /// Run a range of seeds, `A..B` (B excluded).
    #[arg(long, value_parser = parse_range)]
    seeds: Option<Range<u64>>,
    /// Run fresh random seeds for this many minutes (a block: its range is printed).
    #[arg(long)]
    minutes: Option<f64>,
    /// Search for each known-bad variant (a build with `--features known-bad`).
    #[arg(long)]
    variants: bool,
    /// Give up on a variant after this many seeds.
    #[arg(long, default_value_t = 2_000)]
    max_seeds: u64,
    /// Run with this known-bad variant in force.
    #[arg(long, value_parser = parse_variant)]
    variant: Option<Variant>,
    /// Virtual time per seed, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    run_ms: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

/// A command-line value that is not one.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("a range is A..B, B excluded (for example 0..1000)")]
    RangeShape,
    #[error("the range's {which} {value:?} is not a seed: {source}")]
    RangeBound {
        which: &'static str,
        value: String,
        source: std::num::ParseIntError,
    },
    #[error("the range {start}..{end} is empty: its end must be above its start")]
    RangeEmpty { start: u64, end: u64 },
    #[error("no variant {name:?}; the variants are {known}")]
    UnknownVariant { name: String, known: String },
}

fn parse_range(s: &str) -> Result<Range<u64>, ArgError> {
    let (a, b) = s.split_once("..").ok_or(ArgError::RangeShape)?;
    let bound = |which, v: &str| {
        v.parse::<u64>().map_err(|source| ArgError::RangeBound {
            which,
            value: v.to_string(),
            source,
        })
    };
    let (start, end) = (bound("start", a)?, bound("end", b)?);
    if start >= end {
        return Err(ArgError::RangeEmpty { start, end });
    }
    Ok(start..end)
}

fn parse_variant(s: &str) -> Result<Variant, ArgError> {
    Variant::parse(s).ok_or_else(|| {
        let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
        ArgError::UnknownVariant {
            name: s.to_string(),
            known: names.join(", "),
        }
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if (args.variant.is_some() || args.variants) && !baton_core::bad::COMPILED {
        eprintln!(
            "baton-sim: this build has no known-bad variants; build it with `--features known-bad`"
        );
        return ExitCode::from(2);
    }
    // Panics are reported per seed (see `run`), not printed as they happen.
    std::panic::set_hook(Box::new(|_| {}));
    let config = Config {
        run_ms: args.run_ms,
        variant: args.variant,
        ..Config::default()
    };
    if let Some(seed) = args.seed {
        return replay(seed, &config);
    }
    if args.variants {
        return variants(&args, &config);
    }
    let ok = if let Some(range) = args.seeds.clone() {
        block(range, None, &config, args.jobs)
    } else if let Some(minutes) = args.minutes {
        let start = fresh_start();
        block(
            start..u64::MAX,
            Some(Duration::from_secs_f64(minutes * 60.0)),
            &config,
            args.jobs,
        )
    } else {
        eprintln!("baton-sim: say --seed N, --seeds A..B, --minutes M or --variants (see --help)");
        return ExitCode::from(2);
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A start for a block of fresh seeds: any value, printed with the range.
fn fresh_start() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    baton_client::rng::Rng::new(nanos).next_u64() >> 16
}

fn replay(seed: u64, config: &Config) -> ExitCode {
    let report = run(
        seed,
        &Config {
            keep_trace: true,
            ..config.clone()
        },
    );
    for line in report.trace.iter().flatten() {
        println!("{line}");
    }
    summary(&report);
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn summary(r: &Report) {
    println!(
        "seed {} ({}): {} events, {} operations ({} indeterminate), {} claims, {} writes accepted, {} stale refused, {} recoveries, {} sessions ({} heartbeats, {} claims under them), at most {} of {} permits held at once, at most {} readers at once, {} messages lost, {} duplicated, faults {:?}, trace hash {:016x}",
        r.seed,
        if r.cluster { "cluster of 3" } else { "single server" },
        r.n_events, r.n_ops, r.n_indeterminate, r.n_claims, r.n_writes_accepted, r.n_stale_refused, r.n_recoveries, r.n_sessions_opened, r.n_heartbeats, r.n_session_claims, r.most_permits, baton_sim::SEMAPHORE_PERMITS, r.most_readers, r.n_dropped, r.n_duplicated, r.faults, r.trace_hash
    );
    for v in &r.violations {
        println!("  VIOLATION: {v}");
    }
}

/// Runs seeds from `range` on `jobs` threads until the range or the time
/// runs out. True if no seed failed.
fn block(range: Range<u64>, budget: Option<Duration>, config: &Config, jobs: usize) -> bool {
    let started = Instant::now();
    let next = AtomicU64::new(range.start);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let totals = Mutex::new((0u64, 0u64, 0u64, 0u64, 0usize, 0usize));
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) || budget.is_some_and(|b| started.elapsed() >= b) {
                    break;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= range.end {
                    break;
                }
                let r = run(seed, config);
                done.fetch_add(1, Ordering::Relaxed);
                let mut t = totals.lock().expect("totals");
                t.0 += r.n_ops;
                t.1 += r.faults.values().sum::<u64>();
                t.2 += r.n_stale_refused;
                t.3 += r.n_events;
                t.4 = t.4.max(r.most_permits);
                t.5 = t.5.max(r.most_readers);
                if !r.violations.is_empty() {
                    summary(&r);
                    failed.lock().expect("failed").push(seed);
                }
            });
        }
    });
    let n = done.load(Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    let last = range.start + n;
    let (ops, faults, stale, events, permits, readers) = *totals.lock().expect("totals");
    println!(
        "seeds {}..{}: {n} run in {secs:.1} s on {jobs} threads ({:.0} seeds/min); {ops} operations, {faults} faults, {events} events, {stale} stale writes refused; at most {permits} of {} permits held at once, at most {readers} shared holders at once; {} failed",
        range.start,
        last.max(range.start),
        n as f64 / secs * 60.0,
        baton_sim::SEMAPHORE_PERMITS,
        failed.lock().expect("failed").len()
    );
    let failed = failed.into_inner().expect("failed");
    for seed in &failed {
        println!("  failed: replay with `baton-sim --seed {seed}`");
    }
    failed.is_empty()
}

/// For each variant, runs seeds from 0 until one fails, and prints how
/// many it took and the trace's end up to the first failing moment.
fn variants(args: &Args, config: &Config) -> ExitCode {
    let mut all_found = true;
    for v in Variant::ALL {
        let cfg = Config {
            variant: Some(v),
            ..config.clone()
        };
        let found = (0..args.max_seeds).find(|seed| !run(*seed, &cfg).violations.is_empty());
        match found {
            Some(seed) => {
                let cut = shortest_failing(seed, &cfg);
                let r = run(
                    seed,
                    &Config {
                        run_ms: cut,
                        keep_trace: true,
                        ..cfg.clone()
                    },
                );
                println!(
                    "variant {}: found by seed {seed} after {} seeds; fails within {cut} ms",
                    v.name(),
                    seed + 1
                );
                for v in r.violations.iter().take(3) {
                    println!("  VIOLATION: {v}");
                }
                for line in minimal_trace(&r) {
                    println!("    {line}");
                }
            }
            None => {
                all_found = false;
                println!(
                    "variant {}: NOT FOUND in {} seeds",
                    v.name(),
                    args.max_seeds
                );
            }
        }
    }
    if all_found {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The lines of a failing run's trace that concern its first violation:
/// the ones naming a token it names (and the token's resource), and every
/// crash, restart, leadership change and restore; the last 40 of them.
fn minimal_trace(r: &Report) -> Vec<String> {
    let first = r.violations.first().map(String::as_str).unwrap_or("");
    let tokens: Vec<&str> = first
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| w.len() >= 10)
        .collect();
    let markers = [
        "crash",
        "Restart",
        "leads",
        "steps down",
        "restored",
        "Fence",
        "Pause",
        "Isolate",
        "Brownout",
    ];
    let lines: Vec<String> = r
        .trace
        .iter()
        .flatten()
        .filter(|l| tokens.iter().any(|t| l.contains(t)) || markers.iter().any(|m| l.contains(m)))
        .cloned()
        .collect();
    lines[lines.len().saturating_sub(40)..].to_vec()
}

/// The shortest run of `seed` that still fails: a shorter run is a
/// prefix of a longer one, so the search is a bisection on its length.
fn shortest_failing(seed: u64, config: &Config) -> u64 {
    let (mut lo, mut hi) = (0u64, config.run_ms);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if run(
            seed,
            &Config {
                run_ms: mid,
                ..config.clone()
            },
        )
        .violations
        .is_empty()
        {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}
