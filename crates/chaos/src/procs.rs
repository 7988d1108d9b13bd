//! The processes and proxies of a chaos run: the Baton server, the workers,
//! their proxies, and the timers that resume and restart them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use baton_faults::{Direction, Proxy};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::net::direction;
use super::schedule::Fault;
use super::ChaosConfig;
use baton_faults::signal::Signal;

use crate::service::{Service, WorkerSpec};
use baton_client::rng::Rng;

pub struct WorkerSlot {
    pub child: Option<Child>,
    pub incarnation: u32,
    pub stopped: bool,
    pub baton: Proxy,
    pub postgres: Option<Proxy>,
}

pub enum Timer {
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

pub struct Run {
    pub cfg: ChaosConfig,
    pub service: std::sync::Arc<dyn Service>,
    pub dir: PathBuf,
    pub prefix: String,
    pub server_addr: SocketAddr,
    pub server: Option<Child>,
    pub worker_url: Option<(String, SocketAddr)>,
    pub slots: Vec<WorkerSlot>,
    pub timers: Vec<(Instant, Timer)>,
    pub fired: BTreeMap<&'static str, u64>,
    pub events: mpsc::UnboundedSender<(usize, u32)>,
    /// Publishes the workers reported refused as stale, for the status line.
    pub stale_seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub rng: Rng,
    /// From the service's effects: where the workers' publications notify.
    pub worker_args: Vec<String>,
}

impl Run {
    pub async fn start_server(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join("server.log"))?;
        let mut child = self
            .service
            .server_command(&self.dir.join("baton-data"), self.server_addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start the Baton server: {e}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        // The server prints one line once it listens.
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("listening") => {}
            other => {
                return Err(anyhow::anyhow!(
                    "the Baton server did not start ({other:?}); see {}",
                    self.dir.join("logs").join("server.log").display()
                ))
            }
        }
        self.server = Some(child);
        Ok(())
    }

    pub fn start_worker(&mut self, w: usize) -> anyhow::Result<()> {
        self.slots[w].incarnation += 1;
        self.slots[w].stopped = false;
        let incarnation = self.slots[w].incarnation;
        let name = format!("w{w}.{incarnation}");
        let log_path = self.dir.join("logs").join(format!("w{w}.log"));
        let cmd = self.worker_command(w, &name);
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = cmd;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start a worker: {e}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let stale = self.stale_seen.clone();
        forward_output(stdout, log_path, self.events.clone(), stale, w, incarnation);
        self.slots[w].child = Some(child);
        Ok(())
    }

    /// The command line of worker `w`'s next incarnation, from the service.
    fn worker_command(&self, w: usize, name: &str) -> Command {
        let slot = &self.slots[w];
        let incarnation = slot.incarnation;
        let database_url = match (&self.worker_url, &slot.postgres) {
            (Some((url, _)), Some(p)) => Some(url.replace("{port}", &p.addr().port().to_string())),
            _ => None,
        };
        self.service.worker_command(&WorkerSpec {
            dir: self.dir.clone(),
            history: self.dir.join("history").join(format!("w{w}.jsonl")),
            server_url: format!("http://{}", slot.baton.addr()),
            name: name.to_string(),
            ttl: self.cfg.ttl,
            accounts: self.prefix.clone(),
            pause_chance_pct: self.cfg.pause_chance_pct,
            chaos_seed: self.cfg.seed ^ ((w as u64) << 32) ^ u64::from(incarnation),
            database_url,
            unfenced: self.cfg.negative_control,
            extra_args: self.worker_args.clone(),
        })
    }

    fn count(&mut self, kind: &'static str) {
        *self.fired.entry(kind).or_default() += 1;
    }

    /// Sends SIGCONT once the worker is really stopped. A worker announces
    /// its own pause and then stops itself: a SIGCONT that overtook the stop
    /// would be lost and leave the worker stopped for good. So until
    /// `/proc` shows it stopped, check again every 5 ms (for 5 s at most).
    pub fn resume(&mut self, w: usize, tries: u32) {
        let slot = &mut self.slots[w];
        let Some(child) = &slot.child else {
            slot.stopped = false;
            return;
        };
        if tries >= 1_000 || child.id().is_none_or(baton_faults::signal::is_stopped) {
            signal(child, Signal::SIGCONT);
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
    pub fn paused_before_publish(&mut self, w: usize, incarnation: u32, storm: bool) {
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

    pub async fn fire_timers(&mut self, now: Instant, all: bool) -> anyhow::Result<()> {
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

    /// Carries out one scheduled fault, counting it if it fired (a fault on
    /// a worker that is down or already stopped does not).
    pub async fn apply(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let fired = match *fault {
            Fault::Pause { worker, ms } => self.pause(worker, ms),
            Fault::KillWorker { worker, ms } => self.kill_worker(worker, ms).await,
            Fault::KillServer { ms } => self.kill_server(ms).await,
            _ => self.apply_to_proxy(fault),
        };
        if fired {
            self.count(fault.kind());
        }
        Ok(())
    }

    fn pause(&mut self, worker: usize, ms: u64) -> bool {
        let slot = &mut self.slots[worker];
        let Some(child) = slot.child.as_ref().filter(|_| !slot.stopped) else {
            return false;
        };
        signal(child, Signal::SIGSTOP);
        slot.stopped = true;
        let incarnation = slot.incarnation;
        let resume = Timer::Resume {
            worker,
            incarnation,
            tries: 0,
        };
        self.timers
            .push((Instant::now() + Duration::from_millis(ms), resume));
        true
    }

    async fn kill_worker(&mut self, worker: usize, ms: u64) -> bool {
        let Some(mut child) = self.slots[worker].child.take() else {
            return false;
        };
        let _ = child.kill().await;
        let restart = Timer::StartWorker { worker };
        self.timers
            .push((Instant::now() + Duration::from_millis(ms), restart));
        true
    }

    async fn kill_server(&mut self, ms: u64) -> bool {
        let Some(mut server) = self.server.take() else {
            return false;
        };
        let _ = server.kill().await;
        self.timers.push((
            Instant::now() + Duration::from_millis(ms),
            Timer::StartServer,
        ));
        true
    }

    /// Holds, drops and resets in a worker's Baton or PostgreSQL proxy.
    fn apply_to_proxy(&self, fault: &Fault) -> bool {
        let hold = |p: &Proxy, to_server: bool, ms: u64| {
            p.hold_for(direction(to_server), Duration::from_millis(ms))
        };
        let postgres = |worker: usize| self.slots[worker].postgres.as_ref();
        match *fault {
            Fault::HoldBaton {
                worker,
                to_server,
                ms,
            } => hold(&self.slots[worker].baton, to_server, ms),
            Fault::DropBatonResponse { worker } => self.slots[worker].baton.drop_next_response(),
            Fault::ResetBaton { worker } => self.slots[worker].baton.reset_all(),
            Fault::HoldPostgres {
                worker,
                to_server,
                ms,
            } => match postgres(worker) {
                Some(p) => hold(p, to_server, ms),
                None => return false,
            },
            Fault::DropPostgresResponse { worker } => match postgres(worker) {
                Some(p) => p.drop_next_response(),
                None => return false,
            },
            Fault::ResetPostgres { worker } => match postgres(worker) {
                Some(p) => p.reset_all(),
                None => return false,
            },
            Fault::Pause { .. } | Fault::KillWorker { .. } | Fault::KillServer { .. } => {
                return false
            }
        }
        true
    }

    /// What the proxies did, summed over the workers.
    pub fn proxy_totals(&self) -> BTreeMap<&'static str, u64> {
        let mut t = [0u64; 6];
        for s in &self.slots {
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
        BTreeMap::from([
            ("baton_held_chunks", t[0]),
            ("baton_dropped_responses", t[1]),
            ("baton_connections_reset", t[2]),
            ("postgres_held_chunks", t[3]),
            ("postgres_dropped_responses", t[4]),
            ("postgres_connections_reset", t[5]),
        ])
    }

    /// Lets every held direction flow and resumes every stopped worker.
    pub fn release_everything(&mut self) {
        for w in 0..self.slots.len() {
            let slot = &self.slots[w];
            for p in std::iter::once(&slot.baton).chain(slot.postgres.as_ref()) {
                p.release(Direction::ClientToServer);
                p.release(Direction::ServerToClient);
            }
            if self.slots[w].stopped {
                self.resume(w, 0);
            }
        }
    }

    /// Kills every worker and the server.
    pub async fn kill_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill().await;
            }
        }
        if let Some(mut server) = self.server.take() {
            let _ = server.kill().await;
        }
    }

    /// When the loop must next wake up for a timer, at the latest `at`.
    pub fn next_wake(&self, at: Instant) -> Instant {
        self.timers.iter().map(|(t, _)| *t).fold(at, Instant::min)
    }
}

/// Copies a worker's stdout to its log and reports its self-announced pauses.
fn forward_output(
    stdout: ChildStdout,
    log_path: PathBuf,
    events: mpsc::UnboundedSender<(usize, u32)>,
    stale: std::sync::Arc<std::sync::atomic::AtomicU64>,
    w: usize,
    incarnation: u32,
) {
    tokio::spawn(async move {
        let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
        else {
            return;
        };
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes());
            match field(&line, "event").as_deref() {
                Some("paused") => {
                    let _ = events.send((w, incarnation));
                }
                Some("publish_refused") if field(&line, "outcome").as_deref() == Some("stale") => {
                    stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                _ => {}
            }
        }
    });
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        let _ = baton_faults::signal::send(pid, sig);
    }
}

/// Field `key` of one JSON event line, as text.
fn field(line: &str, key: &str) -> Option<String> {
    match serde_json::from_str::<serde_json::Value>(line)
        .ok()?
        .get(key)?
    {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    }
}
