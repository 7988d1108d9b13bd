//! The fault suite's chaos run: a service under a seeded storm of faults,
//! then the history checker's verdict. `statements chaos` runs it on the
//! reference application through the [`Service`] seam (`service.rs`).
//!
//! Real processes: a Baton server (the service's server command, killed with
//! SIGKILL and restarted on the same port and data directory) and N worker
//! processes (paused with SIGSTOP, killed and restarted). Each worker talks
//! to Baton, and with PostgreSQL to the database, through its own fault
//! proxy, which holds traffic, drops the response to a request it delivered,
//! or resets connections. The faults come from a schedule that is a pure
//! function of the seed; on top of it, workers stop themselves just before
//! a publish on a seeded share of attempts (the seed's window: ownership
//! confirmed, then a pause), and the run either resumes them later or lets
//! them go at once with their publish held in the database proxy.
//!
//! Every worker appends each publish to its history (invoked, then ok, failed
//! or unknown); a trigger appends each pointer move to the publication log in
//! the same transaction. At the end the checker compares the two.
//!
//! Code map: `service.rs` (what the run needs from the service), `schedule.rs` (the faults, a pure function of the seed),
//! `procs.rs` (server, workers, proxies and timers), `seeder.rs` (jobs from
//! a thread of their own), `net.rs` (proxied addresses), `report.rs` (the
//! checker's verdict and the report). The history format and its reader are
//! `baton_faults::history`, next to the checker.

mod effects;
mod net;
mod procs;
mod report;
mod schedule;
mod seeder;
mod service;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_faults::Proxy;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use report::{check, Checked, Figures};
pub use schedule::{fingerprint, schedule, Fault};
pub use service::{
    DeliveryFigures, Effects, EffectsOpening, EffectsSpec, Opening, Service, ServiceDb, WorkerSpec,
};

use baton_client::rng::Rng;
use procs::{Run, WorkerSlot};
use report::Report;
use seeder::Seeder;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub workers: usize,
    pub duration: Duration,
    pub seed: u64,
    pub database_url: Option<String>,
    pub json: bool,
    pub negative_control: bool,
    pub ttl: Duration,
    pub dir: Option<PathBuf>,
    /// Percent of publish attempts on which a worker stops itself first.
    pub pause_chance_pct: u32,
    /// Dispatchers of the service's external effects, if it has any.
    pub dispatchers: usize,
}

/// Pauses announced by the workers: (worker, incarnation).
type Paused = mpsc::UnboundedReceiver<(usize, u32)>;

fn say(cfg: &ChaosConfig, text: &str) {
    // With --json, stdout carries only the report.
    if cfg.json {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
}

fn validate(cfg: &ChaosConfig) -> anyhow::Result<()> {
    if cfg.workers == 0 || cfg.workers > 64 {
        return Err(anyhow::anyhow!(
            "--workers is {}; it must be 1 to 64",
            cfg.workers
        ));
    }
    if cfg.duration < Duration::from_secs(1) {
        anyhow::bail!("--duration must be at least 1s");
    }
    if cfg.ttl < Duration::from_millis(200) || cfg.ttl > Duration::from_secs(60) {
        anyhow::bail!("--ttl is {:?}; it must be 200ms to 60s", cfg.ttl);
    }
    Ok(())
}

/// Runs the storm, settles, and prints the verdict; exit 0 only when clean.
pub async fn run(cfg: ChaosConfig, service: Arc<dyn Service>) -> anyhow::Result<ExitCode> {
    validate(&cfg)?;
    let (mut run, mut paused) = setup(cfg, service.clone()).await?;
    let sched = schedule(
        run.cfg.seed,
        run.cfg.workers,
        run.cfg.duration,
        run.cfg.ttl,
        run.cfg.database_url.is_some(),
    );
    announce(&run, &sched);
    run.start_server().await?;
    let effects = service
        .effects(&EffectsSpec {
            dir: run.dir.clone(),
            database_url: run.cfg.database_url.clone(),
            seed: run.cfg.seed,
            accounts: run.prefix.clone(),
            blind: run.cfg.negative_control,
        })
        .await?;
    let mut dispatchers = match effects {
        Some(effects) if run.cfg.dispatchers > 0 => {
            run.worker_args = effects.worker_args();
            Some(effects::Dispatchers::start(
                effects,
                run.cfg.dispatchers,
                format!("http://{}", run.server_addr),
                run.cfg.ttl,
                run.dir.join("logs"),
            )?)
        }
        _ => None,
    };
    for w in 0..run.cfg.workers {
        run.start_worker(w)?;
    }
    let seeder = Seeder::start(
        service.clone(),
        run.dir.clone(),
        run.cfg.database_url.clone(),
        run.prefix.clone(),
        run.cfg.workers * 2,
    );
    storm(&mut run, &sched, &mut paused, dispatchers.as_mut()).await?;
    // Resume everything before opening the database: a process stopped
    // inside its migration holds the migration lock.
    if let Some(d) = dispatchers.as_mut() {
        d.resume_all();
    }
    run.release_everything();
    let db = service
        .open(&run.dir, run.cfg.database_url.as_deref())
        .await?;
    let (seeded, open_at_end) = settle(&mut run, seeder, &*db, &mut paused).await?;
    let deliveries = match dispatchers.as_mut() {
        Some(d) => Some(d.drain(DELIVERY_DRAIN).await?),
        None => None,
    };
    if let Some(d) = dispatchers.as_mut() {
        d.kill_all().await;
    }
    run.kill_all().await;
    verdict(&run, &*db, &sched, seeded, open_at_end, deliveries).await
}

/// How long the dispatchers may take to settle every delivery once the
/// faults stop and the jobs settled: past it, an unsettled intent counts
/// as lost.
pub const DELIVERY_DRAIN: Duration = Duration::from_secs(60);

/// The run's directory, database, proxies and worker slots.
async fn setup(cfg: ChaosConfig, service: Arc<dyn Service>) -> anyhow::Result<(Run, Paused)> {
    let worker_url = match &cfg.database_url {
        Some(url) => Some(net::postgres_via_proxy(url).await?),
        None => None,
    };
    let prefix = format!("c{:x}p{}-", cfg.seed, std::process::id());
    let dir = match &cfg.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("baton-chaos-{prefix}")),
    };
    for sub in ["history", "logs"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    service.open(&dir, cfg.database_url.as_deref()).await?;
    if cfg.negative_control {
        eprintln!(
            "*** NEGATIVE CONTROL: fencing is OFF at the resource. Workers move the publication \
             pointer with a blind write. This run is expected to FAIL; if the checker finds \
             nothing, the suite proves nothing. ***"
        );
    }
    let server_addr = net::free_port()?;
    let mut slots = Vec::new();
    for _ in 0..cfg.workers {
        let baton = Proxy::start(server_addr).await?;
        let postgres = match &worker_url {
            Some((_, upstream)) => Some(Proxy::start(*upstream).await?),
            None => None,
        };
        slots.push(WorkerSlot {
            child: None,
            incarnation: 0,
            stopped: false,
            baton,
            postgres,
        });
    }
    let (events, paused) = mpsc::unbounded_channel();
    let run = Run {
        rng: Rng::new(cfg.seed ^ 0x5eed),
        service,
        cfg,
        dir,
        prefix,
        server_addr,
        server: None,
        worker_url,
        slots,
        timers: Vec::new(),
        fired: BTreeMap::new(),
        events,
        stale_seen: Default::default(),
        worker_args: Vec::new(),
    };
    Ok((run, paused))
}

fn announce(run: &Run, sched: &[(u64, Fault)]) {
    let cfg = &run.cfg;
    say(
        cfg,
        &format!(
            "chaos: seed {} ({} faults scheduled, schedule {}), {} workers, {:?}, TTL {} ms, {}, files in {}",
            cfg.seed,
            sched.len(),
            fingerprint(sched),
            cfg.workers,
            cfg.duration,
            cfg.ttl.as_millis(),
            if cfg.database_url.is_some() { "PostgreSQL" } else { "SQLite" },
            run.dir.display()
        ),
    );
}

/// Applies the schedule until the duration is over, with the timers and
/// the workers' own pauses in between.
async fn storm(
    run: &mut Run,
    sched: &[(u64, Fault)],
    paused: &mut Paused,
    mut dispatchers: Option<&mut effects::Dispatchers>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let end = start + run.cfg.duration;
    let mut next = 0;
    let mut status = Status::new(&run.cfg, start);
    loop {
        let now = Instant::now();
        status.show(run, now);
        if now >= end {
            status.finish();
            return Ok(());
        }
        while next < sched.len() && start + Duration::from_millis(sched[next].0) <= now {
            run.apply(&sched[next].1).await?;
            next += 1;
        }
        run.fire_timers(now, false).await?;
        if let Some(d) = dispatchers.as_deref_mut() {
            d.tick(now, &mut run.rng, &mut run.fired).await?;
        }
        let mut due = sched
            .get(next)
            .map_or(end, |(at, _)| end.min(start + Duration::from_millis(*at)));
        if let Some(d) = dispatchers.as_deref() {
            due = d.next_wake(due);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(run.next_wake(due)) => {}
            Some((w, inc)) = paused.recv() => run.paused_before_publish(w, inc, true),
        }
    }
}

/// A status line on a terminal every few seconds: elapsed time, faults
/// fired, stale publishes refused so far. Quiet with --json or when stdout
/// is not a terminal (CI logs stay clean).
struct Status {
    on: bool,
    start: Instant,
    next: Instant,
    total: Duration,
}

impl Status {
    const EVERY: Duration = Duration::from_secs(3);

    fn new(cfg: &ChaosConfig, start: Instant) -> Self {
        let on = !cfg.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
        Self {
            on,
            start,
            next: start + Self::EVERY,
            total: cfg.duration,
        }
    }

    fn show(&mut self, run: &Run, now: Instant) {
        if !self.on || now < self.next {
            return;
        }
        self.next = now + Self::EVERY;
        let fired: u64 = run.fired.values().sum();
        let stale = run.stale_seen.load(std::sync::atomic::Ordering::Relaxed);
        print!(
            "\r  {}s / {}s  faults fired {fired}  stale publishes refused {stale}   ",
            (now - self.start).as_secs(),
            self.total.as_secs()
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }

    fn finish(&self) {
        if self.on {
            println!();
        }
    }
}

/// No more faults and no more jobs: everything resumed, restarted and
/// released, and the workers finish the open jobs (bounded). Resume first:
/// the seeder may be waiting for a SQLite lock that a stopped worker holds.
/// Returns the jobs seeded and those still open.
async fn settle(
    run: &mut Run,
    seeder: Seeder,
    db: &dyn ServiceDb,
    paused: &mut Paused,
) -> anyhow::Result<(u64, i64)> {
    run.fire_timers(Instant::now(), true).await?;
    run.release_everything();
    let seeded = tokio::task::spawn_blocking(move || seeder.stop()).await??;
    let settle_end = Instant::now() + (run.cfg.ttl * 10).max(Duration::from_secs(20));
    let mut open = i64::MAX;
    while Instant::now() < settle_end {
        open = db
            .job_states(&run.prefix)
            .await
            .map_err(|e| anyhow::anyhow!("waiting for the open jobs: {e}"))?
            .iter()
            .filter(|(s, _)| run.service.is_open_state(s))
            .map(|(_, n)| n)
            .sum();
        if open == 0 {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(run.next_wake(Instant::now() + Duration::from_millis(200))) => {}
            Some((w, inc)) = paused.recv() => run.paused_before_publish(w, inc, false),
        }
        run.fire_timers(Instant::now(), false).await?;
    }
    Ok((seeded, open))
}

/// The checker's verdict and the report; exit 0 only when clean.
async fn verdict(
    run: &Run,
    db: &dyn ServiceDb,
    sched: &[(u64, Fault)],
    seeded: u64,
    open_at_end: i64,
    deliveries: Option<DeliveryFigures>,
) -> anyhow::Result<ExitCode> {
    let checked = check(db, &run.dir.join("history"), &run.prefix).await?;
    let jobs = db
        .job_states(&run.prefix)
        .await
        .map_err(|e| anyhow::anyhow!("reading the jobs: {e}"))?;
    let cfg = &run.cfg;
    let report = Report {
        seed: cfg.seed,
        schedule: fingerprint(sched),
        negative_control: cfg.negative_control,
        backend: if cfg.database_url.is_some() {
            "postgres"
        } else {
            "sqlite"
        },
        workers: cfg.workers,
        duration_s: cfg.duration.as_secs(),
        ttl_ms: cfg.ttl.as_millis() as u64,
        faults: run.fired.clone(),
        proxy: run.proxy_totals(),
        jobs_seeded: seeded,
        jobs: jobs.into_iter().collect(),
        open_jobs_at_end: open_at_end,
        stale_overwrite_examples: Vec::new(),
        files: run.dir.display().to_string(),
        accounts: run.prefix.clone(),
        figures: checked.figures(),
        examples_text: Vec::new(),
        deliveries,
    }
    .with_verdict(&checked);
    if cfg.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
    } else {
        println!("{}", report.text());
    }
    let clean = report.figures.verdict == "clean";
    if clean && cfg.dir.is_none() {
        let _ = std::fs::remove_dir_all(&run.dir);
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
