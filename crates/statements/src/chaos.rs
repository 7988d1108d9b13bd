//! `statements chaos`: the statement service under a seeded storm of faults,
//! then the history checker's verdict.
//!
//! Real processes: a Baton server (`statements serve-baton`, killed with
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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::str::FromStr;
use std::time::Duration;

use baton_faults::checker::{self, Accepted, Observed, Status, Verdict};
use baton_faults::{Direction, Proxy};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::events::{field, object, V};
use crate::rng::Rng;
use crate::store::{self, Target};

const DATE: &str = "2026-12-01";

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
}

/// One scheduled fault. Durations are in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP a worker, SIGCONT it `ms` later.
    Pause {
        worker: usize,
        ms: u64,
    },
    /// SIGKILL a worker, start it again `ms` later.
    KillWorker {
        worker: usize,
        ms: u64,
    },
    /// SIGKILL the Baton server, start it again `ms` later.
    KillServer {
        ms: u64,
    },
    /// Hold one direction of a worker's Baton traffic for `ms`.
    HoldBaton {
        worker: usize,
        to_server: bool,
        ms: u64,
    },
    /// Drop the response to the worker's next Baton request.
    DropBatonResponse {
        worker: usize,
    },
    ResetBaton {
        worker: usize,
    },
    HoldPostgres {
        worker: usize,
        to_server: bool,
        ms: u64,
    },
    DropPostgresResponse {
        worker: usize,
    },
    ResetPostgres {
        worker: usize,
    },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pause { .. } => "pause",
            Fault::KillWorker { .. } => "kill_worker",
            Fault::KillServer { .. } => "kill_server",
            Fault::HoldBaton { .. } => "hold_baton",
            Fault::DropBatonResponse { .. } => "drop_baton_response",
            Fault::ResetBaton { .. } => "reset_baton",
            Fault::HoldPostgres { .. } => "hold_postgres",
            Fault::DropPostgresResponse { .. } => "drop_postgres_response",
            Fault::ResetPostgres { .. } => "reset_postgres",
        }
    }
}

/// The fault schedule: (offset from the start in ms, fault). A pure
/// function of its arguments, so the same seed gives the same schedule.
pub fn schedule(
    seed: u64,
    workers: usize,
    duration: Duration,
    ttl: Duration,
    postgres: bool,
) -> Vec<(u64, Fault)> {
    let mut rng = Rng::new(seed);
    let ttl_ms = ttl.as_millis() as u64;
    let end_ms = duration.as_millis() as u64;
    let n = workers as u64;
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        at += rng.between(150, 650);
        if at >= end_ms {
            return out;
        }
        let worker = rng.below(n) as usize;
        let pause_ms = rng.between(ttl_ms / 2, 3 * ttl_ms);
        let to_server = rng.below(2) == 0;
        let roll = rng.below(100);
        let fault = match roll {
            0..=24 => Fault::Pause {
                worker,
                ms: pause_ms,
            },
            25..=36 => Fault::KillWorker {
                worker,
                ms: rng.between(0, 1_000),
            },
            37..=40 => Fault::KillServer {
                ms: rng.between(100, 1_500),
            },
            41..=55 => Fault::HoldBaton {
                worker,
                to_server,
                ms: pause_ms,
            },
            56..=65 => Fault::DropBatonResponse { worker },
            66..=71 => Fault::ResetBaton { worker },
            _ if !postgres => Fault::Pause {
                worker,
                ms: pause_ms,
            },
            72..=83 => Fault::HoldPostgres {
                worker,
                to_server,
                ms: rng.between(ttl_ms / 5, 2 * ttl_ms),
            },
            84..=93 => Fault::DropPostgresResponse { worker },
            _ => Fault::ResetPostgres { worker },
        };
        out.push((at, fault));
    }
}

/// A fingerprint of a schedule, printed so two runs can be compared.
pub fn fingerprint(schedule: &[(u64, Fault)]) -> String {
    let text: String = schedule
        .iter()
        .map(|(at, fault)| format!("{at}{fault:?}"))
        .collect();
    format!("{:016x}", crate::rng::hash(0, text.into_bytes()))
}

struct WorkerSlot {
    child: Option<Child>,
    incarnation: u32,
    stopped: bool,
    baton: Proxy,
    postgres: Option<Proxy>,
}

enum Timer {
    /// SIGCONT a worker once it is stopped; `tries` counts the checks so far.
    Resume {
        worker: usize,
        incarnation: u32,
        tries: u32,
    },
    StartWorker {
        worker: usize,
    },
    StartServer,
}

struct Run {
    cfg: ChaosConfig,
    exe: PathBuf,
    dir: PathBuf,
    prefix: String,
    server_addr: SocketAddr,
    server: Option<Child>,
    worker_url: Option<(String, SocketAddr)>,
    slots: Vec<WorkerSlot>,
    timers: Vec<(Instant, Timer)>,
    fired: BTreeMap<&'static str, u64>,
    events: mpsc::UnboundedSender<(usize, u32)>,
    rng: Rng,
}

fn say(cfg: &ChaosConfig, text: &str) {
    // With --json, stdout carries only the report.
    if cfg.json {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
}

fn signal(child: &Child, sig: crate::signal::Signal) {
    if let Some(pid) = child.id() {
        let _ = crate::signal::send(pid, sig);
    }
}

pub async fn run(cfg: ChaosConfig) -> Result<ExitCode, String> {
    if cfg.workers == 0 || cfg.workers > 64 {
        return Err(format!("--workers is {}; it must be 1 to 64", cfg.workers));
    }
    if cfg.duration < Duration::from_secs(1) {
        return Err("--duration must be at least 1s".into());
    }
    if cfg.ttl < Duration::from_millis(200) || cfg.ttl > Duration::from_secs(60) {
        return Err("--ttl-ms must be 200 to 60000".into());
    }
    let worker_url = match &cfg.database_url {
        Some(url) => Some(postgres_via_proxy(url).await?),
        None => None,
    };
    let prefix = format!("c{:x}p{}-", cfg.seed, std::process::id());
    let dir = match &cfg.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("baton-chaos-{prefix}")),
    };
    std::fs::create_dir_all(dir.join("history")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| e.to_string())?;
    let target = Target {
        db: dir.join("statements.sqlite"),
        database_url: cfg.database_url.clone(),
    };
    let db = store::open(&target).await?;
    if cfg.negative_control {
        eprintln!(
            "*** NEGATIVE CONTROL: fencing is OFF at the resource. Workers move the publication \
             pointer with a blind write. This run is expected to FAIL; if the checker finds \
             nothing, the suite proves nothing. ***"
        );
    }
    let server_addr = free_port()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sched = schedule(
        cfg.seed,
        cfg.workers,
        cfg.duration,
        cfg.ttl,
        cfg.database_url.is_some(),
    );
    say(
        &cfg,
        &format!(
            "chaos: seed {} ({} faults scheduled, schedule {}), {} workers, {:?}, TTL {} ms, {}, files in {}",
            cfg.seed,
            sched.len(),
            fingerprint(&sched),
            cfg.workers,
            cfg.duration,
            cfg.ttl.as_millis(),
            if cfg.database_url.is_some() { "PostgreSQL" } else { "SQLite" },
            dir.display()
        ),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut slots = Vec::new();
    for _ in 0..cfg.workers {
        let baton = Proxy::start(server_addr).await.map_err(|e| e.to_string())?;
        let postgres = match &worker_url {
            Some((_, upstream)) => Some(Proxy::start(*upstream).await.map_err(|e| e.to_string())?),
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
    let mut run = Run {
        rng: Rng::new(cfg.seed ^ 0x5eed),
        cfg,
        exe,
        dir: dir.clone(),
        prefix,
        server_addr,
        server: None,
        worker_url,
        slots,
        timers: Vec::new(),
        fired: BTreeMap::new(),
        events: tx,
    };
    run.start_server().await?;
    for w in 0..run.cfg.workers {
        run.start_worker(w)?;
    }

    // The storm.
    let start = Instant::now();
    let end = start + run.cfg.duration;
    let mut next = 0;
    // Jobs keep coming from a thread of their own with its own connection:
    // with SQLite, a worker stopped inside a write transaction blocks every
    // writer until it is resumed, and resuming is this loop's job.
    let seeder = Seeder::start(target.clone(), run.prefix.clone(), run.cfg.workers * 2);
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        while next < sched.len() && start + Duration::from_millis(sched[next].0) <= now {
            run.apply(&sched[next].1).await?;
            next += 1;
        }
        run.fire_timers(now, false).await?;
        let mut wake = end;
        if let Some((at, _)) = sched.get(next) {
            wake = wake.min(start + Duration::from_millis(*at));
        }
        if let Some(t) = run.timers.iter().map(|(at, _)| *at).min() {
            wake = wake.min(t);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            Some((w, inc)) = rx.recv() => run.paused_before_publish(w, inc, true),
        }
    }

    // Settle: no more faults and no more jobs; everything resumed, restarted
    // and released; the workers finish the open jobs. Resume first: the
    // seeder may be waiting for a SQLite lock that a stopped worker holds.
    run.fire_timers(Instant::now(), true).await?;
    for w in 0..run.cfg.workers {
        run.slots[w].baton.release(Direction::ClientToServer);
        run.slots[w].baton.release(Direction::ServerToClient);
        if let Some(p) = &run.slots[w].postgres {
            p.release(Direction::ClientToServer);
            p.release(Direction::ServerToClient);
        }
        if run.slots[w].stopped {
            run.resume(w, 0);
        }
    }
    let seeded = tokio::task::spawn_blocking(move || seeder.stop())
        .await
        .map_err(|e| e.to_string())??;
    let settle = (run.cfg.ttl * 10).max(Duration::from_secs(20));
    let settle_end = Instant::now() + settle;
    let mut open = i64::MAX;
    while Instant::now() < settle_end {
        open = db
            .job_states(&run.prefix)
            .await
            .map_err(|e| format!("waiting for the open jobs: {e}"))?
            .iter()
            .filter(|(s, _)| s == "pending" || s == "generating")
            .map(|(_, n)| n)
            .sum();
        if open == 0 {
            break;
        }
        let mut wake = Instant::now() + Duration::from_millis(200);
        if let Some(t) = run.timers.iter().map(|(at, _)| *at).min() {
            wake = wake.min(t);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            Some((w, inc)) = rx.recv() => run.paused_before_publish(w, inc, false),
        }
        run.fire_timers(Instant::now(), false).await?;
    }
    for slot in &mut run.slots {
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill().await;
        }
    }
    if let Some(mut server) = run.server.take() {
        let _ = server.kill().await;
    }

    // The verdict.
    let checked = check(&db, &dir.join("history"), &run.prefix).await?;
    let jobs = db
        .job_states(&run.prefix)
        .await
        .map_err(|e| format!("reading the jobs: {e}"))?;
    let report = Report {
        run: &run,
        checked: &checked,
        jobs: &jobs,
        seeded,
        open_at_end: open,
        schedule: &fingerprint(&sched),
    };
    let clean = checked.verdict.is_clean();
    if run.cfg.json {
        println!("{}", report.json());
    } else {
        println!("{}", report.text());
    }
    if clean && run.cfg.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

impl Run {
    async fn start_server(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join("server.log"))
            .map_err(|e| e.to_string())?;
        let mut child = Command::new(&self.exe)
            .arg("serve-baton")
            .arg("--data-dir")
            .arg(self.dir.join("baton-data"))
            .arg("--listen")
            .arg(self.server_addr.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the Baton server: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        // The server prints one line once it listens.
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("listening") => {}
            other => {
                return Err(format!(
                    "the Baton server did not start ({other:?}); see {}",
                    self.dir.join("logs").join("server.log").display()
                ))
            }
        }
        self.server = Some(child);
        Ok(())
    }

    fn start_worker(&mut self, w: usize) -> Result<(), String> {
        let slot = &mut self.slots[w];
        slot.incarnation += 1;
        slot.stopped = false;
        let incarnation = slot.incarnation;
        let name = format!("w{w}.{incarnation}");
        let log_path = self.dir.join("logs").join(format!("w{w}.log"));
        let mut cmd = Command::new(&self.exe);
        cmd.arg("worker")
            .arg("--db")
            .arg(self.dir.join("statements.sqlite"))
            .arg("--objects")
            .arg(self.dir.join("objects"))
            .arg("--history")
            .arg(self.dir.join("history").join(format!("w{w}.jsonl")))
            .args(["--server", &format!("http://{}", slot.baton.addr())])
            .args(["--name", &name])
            .args(["--ttl-ms", &self.cfg.ttl.as_millis().to_string()])
            .args(["--poll-ms", "50"])
            .args(["--accounts", &self.prefix])
            .args(["--pause-chance-pct", &self.cfg.pause_chance_pct.to_string()])
            .args([
                "--chaos-seed",
                &(self.cfg.seed ^ ((w as u64) << 32) ^ u64::from(incarnation)).to_string(),
            ]);
        if let (Some((url, _)), Some(p)) = (&self.worker_url, &slot.postgres) {
            cmd.args([
                "--database-url",
                &url.replace("{port}", &p.addr().port().to_string()),
            ]);
        }
        if self.cfg.negative_control {
            cmd.arg("--unfenced");
        }
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let events = self.events.clone();
        tokio::spawn(async move {
            let mut log = match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
            {
                Ok(f) => f,
                Err(_) => return,
            };
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes());
                if field(&line, "event").as_deref() == Some("paused") {
                    let _ = events.send((w, incarnation));
                }
            }
        });
        slot.child = Some(child);
        Ok(())
    }

    fn count(&mut self, kind: &'static str) {
        *self.fired.entry(kind).or_default() += 1;
    }

    /// Sends SIGCONT once the worker is really stopped. A worker announces
    /// its own pause and then stops itself: a SIGCONT that overtook the stop
    /// would be lost and leave the worker stopped for good. So until
    /// `/proc` shows it stopped, check again every 5 ms (for 5 s at most).
    fn resume(&mut self, w: usize, tries: u32) {
        let slot = &mut self.slots[w];
        let Some(child) = &slot.child else {
            slot.stopped = false;
            return;
        };
        if tries >= 1_000 || child.id().is_none_or(process_stopped) {
            signal(child, crate::signal::Signal::SIGCONT);
            slot.stopped = false;
            return;
        }
        let incarnation = slot.incarnation;
        self.timers.push((
            Instant::now() + Duration::from_millis(5),
            Timer::Resume {
                worker: w,
                incarnation,
                tries: tries + 1,
            },
        ));
    }

    /// A worker stopped itself just before a publish. During the storm:
    /// either keep it stopped for 0.5 to 3 TTLs, or (with PostgreSQL) resume
    /// it at once with its database traffic held for that long, so its
    /// publish waits in the network instead. While settling: resume it.
    fn paused_before_publish(&mut self, w: usize, incarnation: u32, storm: bool) {
        if self.slots[w].incarnation != incarnation || self.slots[w].child.is_none() {
            return;
        }
        if !storm {
            self.resume(w, 0);
            return;
        }
        let ttl_ms = self.cfg.ttl.as_millis() as u64;
        let ms = self.rng.between(ttl_ms / 2, 3 * ttl_ms);
        let in_proxy = self.slots[w].postgres.is_some() && self.rng.below(2) == 0;
        if in_proxy {
            if let Some(p) = &self.slots[w].postgres {
                p.hold_for(Direction::ClientToServer, Duration::from_millis(ms));
            }
            self.resume(w, 0);
            self.count("publish_delayed_in_proxy");
        } else {
            self.slots[w].stopped = true;
            self.timers.push((
                Instant::now() + Duration::from_millis(ms),
                Timer::Resume {
                    worker: w,
                    incarnation,
                    tries: 0,
                },
            ));
            self.count("pause_before_publish");
        }
    }

    async fn fire_timers(&mut self, now: Instant, all: bool) -> Result<(), String> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.timers)
            .into_iter()
            .partition(|(at, _)| all || *at <= now);
        self.timers = later;
        for (_, timer) in due {
            match timer {
                Timer::Resume {
                    worker,
                    incarnation,
                    tries,
                } => {
                    if self.slots[worker].incarnation == incarnation {
                        self.resume(worker, tries);
                    }
                }
                Timer::StartWorker { worker } => self.start_worker(worker)?,
                Timer::StartServer => self.start_server().await?,
            }
        }
        Ok(())
    }

    async fn apply(&mut self, fault: &Fault) -> Result<(), String> {
        let now = Instant::now();
        let fired = match *fault {
            Fault::Pause { worker, ms } => {
                let slot = &mut self.slots[worker];
                match &slot.child {
                    Some(child) if !slot.stopped => {
                        signal(child, crate::signal::Signal::SIGSTOP);
                        slot.stopped = true;
                        let incarnation = slot.incarnation;
                        self.timers.push((
                            now + Duration::from_millis(ms),
                            Timer::Resume {
                                worker,
                                incarnation,
                                tries: 0,
                            },
                        ));
                        true
                    }
                    _ => false,
                }
            }
            Fault::KillWorker { worker, ms } => match self.slots[worker].child.take() {
                Some(mut child) => {
                    let _ = child.kill().await;
                    self.timers.push((
                        now + Duration::from_millis(ms),
                        Timer::StartWorker { worker },
                    ));
                    true
                }
                None => false,
            },
            Fault::KillServer { ms } => match self.server.take() {
                Some(mut server) => {
                    let _ = server.kill().await;
                    self.timers
                        .push((now + Duration::from_millis(ms), Timer::StartServer));
                    true
                }
                None => false,
            },
            Fault::HoldBaton {
                worker,
                to_server,
                ms,
            } => {
                self.slots[worker]
                    .baton
                    .hold_for(direction(to_server), Duration::from_millis(ms));
                true
            }
            Fault::DropBatonResponse { worker } => {
                self.slots[worker].baton.drop_next_response();
                true
            }
            Fault::ResetBaton { worker } => {
                self.slots[worker].baton.reset_all();
                true
            }
            Fault::HoldPostgres {
                worker,
                to_server,
                ms,
            } => match &self.slots[worker].postgres {
                Some(p) => {
                    p.hold_for(direction(to_server), Duration::from_millis(ms));
                    true
                }
                None => false,
            },
            Fault::DropPostgresResponse { worker } => match &self.slots[worker].postgres {
                Some(p) => {
                    p.drop_next_response();
                    true
                }
                None => false,
            },
            Fault::ResetPostgres { worker } => match &self.slots[worker].postgres {
                Some(p) => {
                    p.reset_all();
                    true
                }
                None => false,
            },
        };
        if fired {
            self.count(fault.kind());
        }
        Ok(())
    }
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn process_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    })
}

fn direction(to_server: bool) -> Direction {
    if to_server {
        Direction::ClientToServer
    } else {
        Direction::ServerToClient
    }
}

fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

/// The worker's connection string with the host and port of its proxy (the
/// port left as `{port}`), and the database's own address.
async fn postgres_via_proxy(url: &str) -> Result<(String, SocketAddr), String> {
    let config = tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("--database-url is not a PostgreSQL connection string: {e}"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => {
            return Err(
                "chaos puts a proxy in front of PostgreSQL, so --database-url needs a TCP host (host=127.0.0.1, not a socket directory)".into(),
            )
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}"))?;
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut out = String::from("host=127.0.0.1 port={port}");
    if let Some(user) = config.get_user() {
        out += &format!(" user={}", quote(user));
    }
    if let Some(db) = config.get_dbname() {
        out += &format!(" dbname={}", quote(db));
    }
    if let Some(pw) = config.get_password() {
        out += &format!(" password={}", quote(&String::from_utf8_lossy(pw)));
    }
    Ok((out, upstream))
}

/// Keeps `target` jobs open, seeding new accounts every 100 ms while fewer
/// are open, until stopped.
struct Seeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Result<u64, String>>,
}

impl Seeder {
    fn start(target: Target, prefix: String, open_target: usize) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let db = store::open(&target).await?;
                let mut seeded = 0u64;
                while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                    seeded += seed_jobs(&db, &prefix, open_target, seeded).await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(seeded)
            })
        });
        Self { stop, thread }
    }

    /// Stops seeding; returns how many jobs were seeded.
    fn stop(self) -> Result<u64, String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| "the seeding thread panicked".to_string())?
    }
}

async fn seed_jobs(
    db: &store::Db,
    prefix: &str,
    target: usize,
    seeded: u64,
) -> Result<u64, String> {
    let open = db
        .open_jobs(prefix)
        .await
        .map_err(|e| format!("counting open jobs: {e}"))?
        .len();
    let mut added = 0;
    for n in open..target {
        let account = format!("{prefix}{:06}", seeded + added);
        db.seed(&account, DATE, 1_000 + n as i64)
            .await
            .map_err(|e| format!("seeding {account}: {e}"))?;
        added += 1;
    }
    Ok(added)
}

/// Reads every worker's history: the final status of each publish, the
/// number of attempts refused as stale, and the number of attempts.
fn read_histories(dir: &Path) -> Result<(Vec<Observed>, u64, u64), String> {
    let mut last: BTreeMap<(String, String), Observed> = BTreeMap::new();
    let mut stale = 0;
    let mut attempts = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        for line in text.lines() {
            let (Some(resource), Some(operation), Some(token), Some(status)) = (
                field(line, "resource"),
                field(line, "operation"),
                field(line, "token").and_then(|t| t.parse::<i64>().ok()),
                field(line, "status"),
            ) else {
                // A SIGKILL can cut nothing short here (one write per line),
                // so a line that does not parse is a bug worth stopping for.
                return Err(format!(
                    "{}: unreadable history line {line:?}",
                    path.display()
                ));
            };
            let status = match status.as_str() {
                "invoke" => {
                    attempts += 1;
                    Status::Unknown
                }
                "ok" => Status::Ok,
                "failed" => {
                    if field(line, "outcome").as_deref() == Some("stale") {
                        stale += 1;
                    }
                    Status::Failed
                }
                _ => Status::Unknown,
            };
            last.insert(
                (resource.clone(), operation.clone()),
                Observed {
                    resource,
                    operation,
                    token,
                    status,
                },
            );
        }
    }
    Ok((last.into_values().collect(), stale, attempts))
}

/// The checker's verdict on one run, with the counts around it.
pub struct Checked {
    pub verdict: Verdict,
    pub stale_rejected: u64,
    pub attempts: u64,
    pub accepted: usize,
    /// Resources whose pointer moved more than once: allowed (each move had a
    /// higher token), but a sign that an owner's publish outlived its lease.
    pub republished: usize,
}

impl Checked {
    /// The checker's figures as JSON fields.
    pub fn fields(&self) -> Vec<(&'static str, V<'static>)> {
        let v = &self.verdict;
        vec![
            ("publish_attempts", V::N(self.attempts as i64)),
            ("publications_accepted", V::N(self.accepted as i64)),
            (
                "resources_published_more_than_once",
                V::N(self.republished as i64),
            ),
            ("stale_rejected", V::N(self.stale_rejected as i64)),
            ("stale_overwrites", V::N(v.stale_overwrites.len() as i64)),
            (
                "doubled_operations",
                V::N(v.doubled_operations.len() as i64),
            ),
            ("lost_publications", V::N(v.lost_publications.len() as i64)),
            (
                "pointer_regressions",
                V::N(v.pointer_regressions.len() as i64),
            ),
            ("verdict", V::S(self.verdict_word())),
        ]
    }

    pub fn verdict_word(&self) -> &'static str {
        if self.verdict.is_clean() {
            "clean"
        } else {
            "violations"
        }
    }
}

/// Checks the histories in `history` against the publication log and the
/// pointers of the statements of accounts starting with `prefix`.
pub async fn check(db: &store::Db, history: &Path, prefix: &str) -> Result<Checked, String> {
    let resource_prefix = format!("statement:{prefix}");
    let (observed, stale_rejected, attempts) = read_histories(history)?;
    let accepted: Vec<Accepted> = db
        .publication_log(&resource_prefix)
        .await
        .map_err(|e| format!("reading the publication log: {e}"))?
        .into_iter()
        .map(|p| Accepted {
            resource: p.resource,
            operation: p.operation,
            token: p.token,
        })
        .collect();
    let pointers: BTreeMap<String, i64> = db
        .pointers(&resource_prefix)
        .await
        .map_err(|e| format!("reading the pointers: {e}"))?
        .into_iter()
        .collect();
    let verdict = checker::check(&observed, &accepted, &pointers, true);
    let mut per_resource: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &accepted {
        *per_resource.entry(a.resource.as_str()).or_default() += 1;
    }
    Ok(Checked {
        stale_rejected,
        attempts,
        accepted: accepted.len(),
        republished: per_resource.values().filter(|n| **n > 1).count(),
        verdict,
    })
}

struct Report<'a> {
    run: &'a Run,
    checked: &'a Checked,
    jobs: &'a [(String, i64)],
    seeded: u64,
    open_at_end: i64,
    schedule: &'a str,
}

impl Report<'_> {
    fn proxy_totals(&self) -> [(&'static str, u64); 6] {
        let mut t = [0u64; 6];
        for s in &self.run.slots {
            let b = s.baton.counts();
            t[0] += b.held_chunks;
            t[1] += b.dropped_responses;
            t[2] += b.resets;
            if let Some(p) = &s.postgres {
                let p = p.counts();
                t[3] += p.held_chunks;
                t[4] += p.dropped_responses;
                t[5] += p.resets;
            }
        }
        [
            ("baton_held_chunks", t[0]),
            ("baton_dropped_responses", t[1]),
            ("baton_connections_reset", t[2]),
            ("postgres_held_chunks", t[3]),
            ("postgres_dropped_responses", t[4]),
            ("postgres_connections_reset", t[5]),
        ]
    }

    fn json(&self) -> String {
        let faults: Vec<(&str, V<'_>)> = self
            .run
            .fired
            .iter()
            .map(|(k, n)| (*k, V::N(*n as i64)))
            .collect();
        let proxy: Vec<(&str, V<'_>)> = self
            .proxy_totals()
            .iter()
            .map(|(k, n)| (*k, V::N(*n as i64)))
            .collect();
        let jobs: Vec<(&str, V<'_>)> = self
            .jobs
            .iter()
            .map(|(k, n)| (k.as_str(), V::N(*n)))
            .collect();
        let v = &self.checked.verdict;
        let examples: Vec<String> = v
            .stale_overwrites
            .iter()
            .take(5)
            .map(|a| {
                object(&[
                    ("resource", V::S(&a.resource)),
                    ("operation", V::S(&a.operation)),
                    ("token", V::N(a.token)),
                ])
            })
            .collect();
        let examples = format!("[{}]", examples.join(","));
        let cfg = &self.run.cfg;
        let files = self.run.dir.display().to_string();
        let faults = object(&faults);
        let proxy = object(&proxy);
        let jobs = object(&jobs);
        let mut fields = vec![
            ("seed", V::N(cfg.seed as i64)),
            ("schedule", V::S(self.schedule)),
            (
                "negative_control",
                V::Raw(if cfg.negative_control {
                    "true"
                } else {
                    "false"
                }),
            ),
            (
                "backend",
                V::S(if cfg.database_url.is_some() {
                    "postgres"
                } else {
                    "sqlite"
                }),
            ),
            ("workers", V::N(cfg.workers as i64)),
            ("duration_s", V::N(cfg.duration.as_secs() as i64)),
            ("ttl_ms", V::N(cfg.ttl.as_millis() as i64)),
            ("faults", V::Raw(&faults)),
            ("proxy", V::Raw(&proxy)),
            ("jobs_seeded", V::N(self.seeded as i64)),
            ("jobs", V::Raw(&jobs)),
            ("open_jobs_at_end", V::N(self.open_at_end)),
            ("stale_overwrite_examples", V::Raw(&examples)),
            ("files", V::S(&files)),
            ("accounts", V::S(&self.run.prefix)),
        ];
        fields.extend(self.checked.fields());
        object(&fields)
    }

    fn text(&self) -> String {
        let c = self.checked;
        let v = &c.verdict;
        let mut out = String::new();
        let cfg = &self.run.cfg;
        if cfg.negative_control {
            out += "NEGATIVE CONTROL (fencing off at the resource)\n";
        }
        out += &format!(
            "seed {} (rerun with --seed {})\nfaults fired:\n",
            cfg.seed, cfg.seed
        );
        for (k, n) in &self.run.fired {
            out += &format!("  {k:<26} {n}\n");
        }
        out += "proxy:\n";
        for (k, n) in self.proxy_totals() {
            out += &format!("  {k:<26} {n}\n");
        }
        out += &format!(
            "jobs: {} seeded, {} still open at the end; {}\n",
            self.seeded,
            self.open_at_end,
            self.jobs
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        out += &format!(
            "publish attempts: {}, accepted: {}, stale attempts rejected at the resource: {}\n",
            c.attempts, c.accepted, c.stale_rejected
        );
        out += &format!(
            "checker: {} stale overwrites, {} doubled operations, {} lost publications, {} pointer regressions\n",
            v.stale_overwrites.len(),
            v.doubled_operations.len(),
            v.lost_publications.len(),
            v.pointer_regressions.len()
        );
        for a in v.stale_overwrites.iter().take(5) {
            out += &format!(
                "  stale overwrite: {} {} token {}\n",
                a.resource, a.operation, a.token
            );
        }
        for o in v.doubled_operations.iter().take(5) {
            out += &format!("  doubled: {o}\n");
        }
        for o in v.lost_publications.iter().take(5) {
            out += &format!("  lost: {} {}\n", o.resource, o.operation);
        }
        out += &format!("verdict: {}", self.checked.verdict_word());
        if !v.is_clean() {
            out += &format!(
                " (files kept in {}, accounts {})",
                self.run.dir.display(),
                self.run.prefix
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let a = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        let b = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        let c = schedule(8, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        assert_eq!(a, b);
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert!(a.len() > 60, "about one fault every 400 ms");
        let kinds: std::collections::BTreeSet<_> = a.iter().map(|(_, f)| f.kind()).collect();
        assert_eq!(
            kinds.len(),
            9,
            "every kind of fault is scheduled: {kinds:?}"
        );
        let sqlite = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), false);
        assert!(sqlite.iter().all(|(_, f)| !f.kind().contains("postgres")));
        assert!(a.windows(2).all(|w| w[0].0 < w[1].0) && a.last().unwrap().0 < 60_000);
    }
}
