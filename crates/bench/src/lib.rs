//! The acquire → release load generator behind `baton bench` and `baton-bench`.
//!
//! Each of C clients has its own connection and cycles acquire → release for
//! a fixed time, either each on its own resource (`distinct`) or all on one
//! (`shared`, where acquires wait in line). The report gives cycles per
//! second and the p50/p99/max latency of each step, and the CPU time per
//! cycle of the server's processes and of the load generator itself, read
//! from `/proc` around the measured interval. These are benchmark figures,
//! printed for people; no test asserts on them.
#![warn(missing_docs)]

use anyhow::Context;
use std::future::Future;
use std::time::{Duration, Instant};

use baton_client::{AcquiredAll, Client, Release, Session};

/// How the clients share resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every client on its own resource: uncontended throughput.
    Distinct,
    /// All clients on one resource: hand-off rate under contention.
    Shared,
}

/// Which modes a run measures, as `--modes` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Modes {
    /// Each client on its own resource.
    Distinct,
    /// All clients on one resource.
    Shared,
    /// Distinct, then shared.
    Both,
}

impl Modes {
    /// The modes to run, in order.
    pub fn to_vec(self) -> Vec<Mode> {
        match self {
            Modes::Distinct => vec![Mode::Distinct],
            Modes::Shared => vec![Mode::Shared],
            Modes::Both => vec![Mode::Distinct, Mode::Shared],
        }
    }
}

impl Mode {
    /// The name printed in reports.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Distinct => "distinct",
            Mode::Shared => "shared",
        }
    }
}

/// One system under test.
pub trait Target: Sync {
    /// A connection to the target.
    type Conn: Conn;
    /// The name printed in reports.
    fn name(&self) -> String;
    /// Opens one client connection.
    fn connect(&self) -> impl Future<Output = anyhow::Result<Self::Conn>> + Send;
    /// Names (as in `/proc/PID/comm`) of the processes that serve this
    /// target: their CPU time is the server's cost per cycle.
    fn server_processes(&self) -> &'static [&'static str] {
        &[]
    }
}

/// CPU time (user + system) of every process named one of `names` but
/// this one (`baton bench` is named `baton` too), in µs. `/proc/PID/stat`
/// counts in USER_HZ, which Linux fixes at 100.
pub fn cpu_us_of(names: &[&str]) -> Option<u64> {
    if names.is_empty() {
        return None;
    }
    let own = std::process::id().to_string();
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name();
        let Some(pid) = pid
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()) && *p != own)
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if names.contains(&comm.trim_end()) {
            total += pid_cpu_us(pid).unwrap_or(0);
        }
    }
    Some(total)
}

/// CPU time of process `pid` ("self" for this one), in µs.
pub fn pid_cpu_us(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces): state is field 3,
    // utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // A zombie (a server killed and not yet reaped) no longer runs.
    if fields.first() == Some(&"Z") {
        return None;
    }
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000)
}

/// One client's connection: acquire (waiting if `wait`) and release.
pub trait Conn: Send + 'static {
    /// What an acquire returns and a release takes back.
    type Held: Send;
    /// Acquires `resource`, waiting in line if `wait`.
    fn acquire(
        &mut self,
        resource: &str,
        wait: bool,
    ) -> impl Future<Output = anyhow::Result<Self::Held>> + Send;
    /// Releases what `acquire` returned.
    fn release(&mut self, held: Self::Held) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// One measurement: a target, a mode and a client count.
#[derive(Clone, Debug)]
pub struct Report {
    /// The system measured.
    pub target: String,
    /// Distinct or shared resources.
    pub mode: Mode,
    /// Concurrent clients.
    pub clients: usize,
    /// Completed acquire → release cycles.
    pub cycles: u64,
    /// Cycles per second.
    pub cycles_per_s: f64,
    /// Acquire latency, µs.
    pub acquire_us: Percentiles,
    /// Release latency, µs.
    pub release_us: Percentiles,
    /// Failed steps.
    pub errors: u64,
    /// CPU time of the target's server processes per cycle, µs.
    pub server_cpu_us_per_cycle: Option<f64>,
    /// CPU time of this load generator per cycle, µs.
    pub client_cpu_us_per_cycle: Option<f64>,
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

fn percentiles(mut v: Vec<u64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        max: *v.last().expect("non-empty"),
    }
}

impl Report {
    /// The header line of the text table.
    pub fn header() -> String {
        format!(
            "{:<26} {:<9} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}",
            "target",
            "mode",
            "C",
            "cycles/s",
            "acq p50",
            "acq p99",
            "acq max",
            "rel p50",
            "rel p99",
            "rel max",
            "errors",
            "srv µs/c",
            "gen µs/c"
        )
    }

    /// The row of this report in the text table.
    pub fn line(&self) -> String {
        let ms = |us: u64| format!("{:.2}ms", us as f64 / 1000.0);
        let cpu = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "{:<26} {:<9} {:>4} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}",
            self.target,
            self.mode.label(),
            self.clients,
            self.cycles_per_s,
            ms(self.acquire_us.p50),
            ms(self.acquire_us.p99),
            ms(self.acquire_us.max),
            ms(self.release_us.p50),
            ms(self.release_us.p99),
            ms(self.release_us.max),
            self.errors,
            cpu(self.server_cpu_us_per_cycle),
            cpu(self.client_cpu_us_per_cycle),
        )
    }
}

/// Runs C clients for `duration` against `target` and reports; every
/// name starts with `run_id` (`CycleFlags::run_id`).
pub async fn run<T: Target>(
    target: &T,
    mode: Mode,
    clients: usize,
    duration: Duration,
    run_id: &str,
) -> anyhow::Result<Report> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(target.connect().await?);
    }
    let start = Instant::now() + Duration::from_millis(100);
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(clients);
    for (i, mut conn) in conns.into_iter().enumerate() {
        let resource = match mode {
            Mode::Distinct => format!("{run_id}:c{clients}:r{i}"),
            Mode::Shared => format!("{run_id}:c{clients}:shared"),
        };
        let wait = mode == Mode::Shared;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let (acq, rel, errors) = cycle(&mut conn, &resource, wait, deadline).await;
            // The connection goes back with the figures: a server process
            // per connection (PostgreSQL) must still be there when its CPU
            // time is read.
            (acq, rel, errors, conn)
        }));
    }
    tokio::time::sleep_until(start.into()).await;
    let names = target.server_processes();
    let (server0, client0) = (cpu_us_of(names), pid_cpu_us("self"));
    let (mut acq, mut rel, mut errors, mut conns) = (Vec::new(), Vec::new(), 0, Vec::new());
    for t in tasks {
        let (a, r, e, conn) = t.await?;
        acq.extend(a);
        rel.extend(r);
        errors += e;
        conns.push(conn);
    }
    let elapsed = Instant::now()
        .saturating_duration_since(start)
        .max(duration);
    let (server1, client1) = (cpu_us_of(names), pid_cpu_us("self"));
    drop(conns);
    let cycles = acq.len() as u64;
    let per_cycle =
        |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?) as f64 / cycles.max(1) as f64);
    Ok(Report {
        server_cpu_us_per_cycle: per_cycle(server0, server1),
        client_cpu_us_per_cycle: per_cycle(client0, client1),
        target: target.name(),
        mode,
        clients,
        cycles,
        cycles_per_s: cycles as f64 / elapsed.as_secs_f64(),
        acquire_us: percentiles(acq),
        release_us: percentiles(rel),
        errors,
    })
}

/// One client's acquire → release cycles until `deadline`: each
/// acquire's and release's time in µs, and the errors.
async fn cycle<C: Conn>(
    conn: &mut C,
    resource: &str,
    wait: bool,
    deadline: Instant,
) -> (Vec<u64>, Vec<u64>, u64) {
    let (mut acq, mut rel, mut errors) = (Vec::new(), Vec::new(), 0u64);
    while Instant::now() < deadline {
        let t0 = Instant::now();
        let held = match conn.acquire(resource, wait).await {
            Ok(h) => h,
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        let t1 = Instant::now();
        if conn.release(held).await.is_err() {
            errors += 1;
        }
        let t2 = Instant::now();
        acq.push((t1 - t0).as_micros() as u64);
        rel.push((t2 - t1).as_micros() as u64);
    }
    (acq, rel, errors)
}

/// How the load generator's clients talk to Baton (`--transports` names
/// them unary, session and session-1conn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// A unary call per acquire and per release, a connection per client.
    #[default]
    Unary,
    /// A session (one stream) per client, a connection per client; the
    /// leases are tied to the session.
    Session,
    /// A session per client, all sessions on one shared connection (what
    /// clones of one `Client` do).
    #[value(name = "session-1conn")]
    SessionSharedConnection,
}

/// Baton itself, over its gRPC API.
#[derive(Default)]
pub struct Baton {
    /// The name printed in reports.
    pub label: String,
    /// The server's gRPC URL (several, comma-separated, for a cluster).
    pub url: String,
    /// TTL of every lease acquired (the session TTL on sessions).
    pub ttl: Duration,
    /// Unary calls or sessions.
    pub transport: Transport,
    /// The server's process names (see [`Target::server_processes`]).
    pub processes: &'static [&'static str],
    /// The connection shared by every client, for [`Transport::SessionSharedConnection`].
    shared: tokio::sync::OnceCell<Client>,
    /// TLS and token for every connection.
    pub options: baton_client::ConnectOptions,
    /// How the clients hold what they acquire (`--lock`).
    pub lock: LockShape,
    /// Connections made so far: which one is a writer among readers.
    made: std::sync::atomic::AtomicUsize,
}

impl Baton {
    /// Unary calls, no process names (no server CPU figure).
    pub fn new(label: impl Into<String>, url: impl Into<String>, ttl: Duration) -> Self {
        Self {
            label: label.into(),
            url: url.into(),
            ttl,
            ..Default::default()
        }
    }

    /// Calls over `transport`.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Connects over TLS and/or with a token.
    pub fn with_options(mut self, options: baton_client::ConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Holds what the clients acquire as `lock` says.
    pub fn with_lock(mut self, lock: LockShape) -> Self {
        self.lock = lock;
        self
    }

    /// Counts the CPU time of the processes named `processes` as the server's.
    pub fn with_processes(mut self, processes: &'static [&'static str]) -> Self {
        self.processes = processes;
        self
    }
}

impl Target for Baton {
    type Conn = BatonConn;

    fn name(&self) -> String {
        self.label.clone()
    }

    fn server_processes(&self) -> &'static [&'static str] {
        self.processes
    }

    async fn connect(&self) -> anyhow::Result<BatonConn> {
        let connect = || async {
            Client::connect_with(&self.url, self.options.clone())
                .await
                .with_context(|| format!("connect to {}", self.url))
        };
        let client = match self.transport {
            Transport::SessionSharedConnection => {
                self.shared.get_or_try_init(connect).await?.clone()
            }
            _ => connect().await?,
        };
        let session = match self.transport {
            Transport::Unary => None,
            _ => Some(client.open_session(self.ttl).await?),
        };
        let i = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(BatonConn {
            client,
            session,
            ttl: self.ttl,
            shape: self.lock.of(i),
        })
    }
}

/// One client connection to Baton.
pub struct BatonConn {
    client: Client,
    session: Option<Session>,
    ttl: Duration,
    shape: baton_client::Shape,
}

impl Conn for BatonConn {
    type Held = baton_client::Lease;

    async fn acquire(&mut self, resource: &str, wait: bool) -> anyhow::Result<Self::Held> {
        let wait = if wait {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        };
        let claims = [(resource, self.shape)];
        let acquired = match &self.session {
            Some(s) => s.acquire_shaped(&claims, None, wait).await?,
            None => {
                self.client
                    .acquire_shaped(&claims, Some(self.ttl), wait)
                    .await?
            }
        };
        match acquired {
            AcquiredAll::Granted { mut leases, .. } => Ok(leases.pop().expect("one lease")),
            AcquiredAll::NotAcquired(n) => Err(anyhow::anyhow!("not acquired: {n:?}")),
        }
    }

    async fn release(&mut self, held: Self::Held) -> anyhow::Result<()> {
        let released = match &self.session {
            Some(s) => s.release(&held.resource, &held.acquisition_id).await,
            None => {
                self.client
                    .release(&held.resource, &held.acquisition_id)
                    .await
            }
        };
        match released? {
            Release::Released { .. } => Ok(()),
            Release::NotHeld => Err(anyhow::anyhow!("release: not held")),
        }
    }
}

mod flags;
pub use flags::{parse_clients, parse_lock, ClientCounts, CycleFlags, LockShape};

pub mod command;

mod scale;
pub use scale::{fill, fill_counting, parse_counts, rss_bytes, scale, Scale, ScaleRow};

mod events;
pub use events::{metric, until_no_leases_ending, EventReport, EventRun, Window};

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn a_mode_is_one_of_three_names_and_a_typo_is_refused() {
        assert_eq!(Modes::from_str("shared", false), Ok(Modes::Shared));
        assert!(Modes::from_str("distinc", false).is_err());
        assert_eq!(Modes::Both.to_vec(), vec![Mode::Distinct, Mode::Shared]);
    }
}
