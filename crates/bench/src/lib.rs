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

use baton_client::{Acquired, Client, Release, Session};

/// How the clients share resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every client on its own resource: uncontended throughput.
    Distinct,
    /// All clients on one resource: hand-off rate under contention.
    Shared,
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

/// CPU time (user + system) of every process named one of `names`, in µs.
/// `/proc/PID/stat` counts in USER_HZ, which Linux fixes at 100.
pub fn cpu_us_of(names: &[&str]) -> Option<u64> {
    if names.is_empty() {
        return None;
    }
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name();
        let Some(pid) = pid
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
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

/// Runs C clients for `duration` against `target` and reports.
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
            Mode::Distinct => format!("bench:{run_id}:c{clients}:r{i}"),
            Mode::Shared => format!("bench:{run_id}:c{clients}:shared"),
        };
        let wait = mode == Mode::Shared;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let (mut acq, mut rel, mut errors) = (Vec::new(), Vec::new(), 0u64);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let held = match conn.acquire(&resource, wait).await {
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

/// How the load generator's clients talk to Baton.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// A unary call per acquire and per release, a connection per client.
    #[default]
    Unary,
    /// A session (one stream) per client, a connection per client; the
    /// leases are tied to the session.
    Session,
    /// A session per client, all sessions on one shared connection (what
    /// clones of one `Client` do).
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
        Ok(BatonConn {
            client,
            session,
            ttl: self.ttl,
        })
    }
}

/// One client connection to Baton.
pub struct BatonConn {
    client: Client,
    session: Option<Session>,
    ttl: Duration,
}

impl Conn for BatonConn {
    type Held = baton_client::Lease;

    async fn acquire(&mut self, resource: &str, wait: bool) -> anyhow::Result<Self::Held> {
        let wait = if wait {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        };
        let acquired = match &self.session {
            Some(s) => s.acquire(resource, wait).await,
            None => self.client.acquire(resource, self.ttl, wait).await,
        };
        match acquired? {
            Acquired::Granted(lease) => Ok(lease),
            Acquired::NotAcquired(n) => Err(anyhow::anyhow!("not acquired: {n:?}")),
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

/// Parses `1,16,64` into client counts.
pub fn parse_clients(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| match p.trim().parse::<usize>() {
            Ok(n) if (1..=4096).contains(&n) => Ok(n),
            _ => Err(format!(
                "client count {p:?} must be a whole number from 1 to 4096"
            )),
        })
        .collect()
}

/// Fills the server with `n_leases` live leases (acquire-all requests of up
/// to 64 resources from 16 clients) and returns how long that took. Used to
/// measure the server's memory with many live leases.
pub async fn fill(
    url: &str,
    n_leases: usize,
    ttl: Duration,
    run_id: &str,
) -> anyhow::Result<Duration> {
    fill_counting(url, n_leases, ttl, run_id, Default::default()).await
}

/// [`fill`], counting the leases granted so far in `done` (for a progress line).
pub async fn fill_counting(
    url: &str,
    n_leases: usize,
    ttl: Duration,
    run_id: &str,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> anyhow::Result<Duration> {
    const CLIENTS: usize = 16;
    const PER_REQUEST: usize = 64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = Client::connect(url).await?;
        let run_id = run_id.to_string();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = c * PER_REQUEST;
            while i < n_leases {
                let names: Vec<String> = (i..(i + PER_REQUEST).min(n_leases))
                    .map(|k| format!("fill:{run_id}:{k:08}"))
                    .collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                match client.acquire_all(&refs, ttl, Duration::ZERO).await? {
                    baton_client::AcquiredAll::Granted { leases, .. } => {
                        done.fetch_add(leases.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                    other => return Err(anyhow::anyhow!("fill: not granted: {other:?}")),
                }
                i += CLIENTS * PER_REQUEST;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// One row of the scaling benchmark: cycles with `live_leases` held, and
/// the same cycles on an empty server measured in alternating rounds.
#[derive(Clone, Debug)]
pub struct ScaleRow {
    /// Live leases held during the row.
    pub live_leases: usize,
    /// Seconds it took to top the server up to this level.
    pub fill_s: f64,
    /// Medians over the rounds.
    pub cycles_per_s: f64,
    /// Median acquire p99, µs.
    pub acquire_p99_us: u64,
    /// Median cycles per second on the empty server.
    pub baseline_cycles_per_s: Option<f64>,
    /// Median acquire p99 on the empty server, µs.
    pub baseline_acquire_p99_us: Option<u64>,
    /// The server's resident memory after the row, if its pid was given.
    pub server_rss_bytes: Option<u64>,
}

/// Resident set size of process `pid`, from `/proc` (Linux).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Parses `0,100k,1M,10M` into ascending live-lease counts.
pub fn parse_counts(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for p in s.split(',') {
        let p = p.trim();
        let (digits, factor) = match p.char_indices().last() {
            Some((i, 'k')) => (&p[..i], 1_000),
            Some((i, 'M')) => (&p[..i], 1_000_000),
            _ => (p, 1),
        };
        let n: usize = digits.parse().map_err(|_| {
            format!(
                "lease count {p:?} must be a whole number, optionally with k or M (like 100k, 1M)"
            )
        })?;
        out.push(n * factor);
    }
    if out.windows(2).any(|w| w[0] > w[1]) {
        return Err(format!("lease counts {s:?} must be ascending"));
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The scaling run's settings.
pub struct Scale<'a> {
    /// The server being filled.
    pub target: &'a Baton,
    /// An empty server measured in alternating rounds, for the ratio.
    pub baseline: Option<&'a Baton>,
    /// Live-lease levels, ascending.
    pub levels: &'a [usize],
    /// TTL of the filled leases (must outlast the run).
    pub fill_ttl: Duration,
    /// Concurrent clients per measurement.
    pub clients: usize,
    /// Time per round.
    pub duration: Duration,
    /// Rounds per level (medians are reported).
    pub rounds: usize,
    /// The filled server's pid, to read its RSS.
    pub server_pid: Option<u32>,
}

/// For each level, tops the target up to `level` live leases, then runs
/// `rounds` rounds of distinct acquire → release cycles on it, alternating
/// with the same rounds on the empty baseline: whether a request's cost
/// grows with the number of leases, measured side by side.
pub async fn scale(
    s: &Scale<'_>,
    run_id: &str,
    mut on_row: impl FnMut(&ScaleRow),
) -> anyhow::Result<Vec<ScaleRow>> {
    let mut held = 0;
    let mut rows = Vec::new();
    for &level in s.levels {
        let fill_s = if level > held {
            let took = fill(
                &s.target.url,
                level - held,
                s.fill_ttl,
                &format!("{run_id}-{level}"),
            )
            .await?;
            held = level;
            took.as_secs_f64()
        } else {
            0.0
        };
        let (mut loaded, mut base) = (Vec::new(), Vec::new());
        for round in 0..s.rounds.max(1) {
            let tag = format!("{run_id}-at{level}-{round}");
            if let Some(b) = s.baseline {
                base.push(run(b, Mode::Distinct, s.clients, s.duration, &tag).await?);
            }
            loaded.push(run(s.target, Mode::Distinct, s.clients, s.duration, &tag).await?);
        }
        let cycles = |v: &[Report]| median(v.iter().map(|r| r.cycles_per_s).collect());
        let p99 = |v: &[Report]| median(v.iter().map(|r| r.acquire_us.p99 as f64).collect()) as u64;
        let row = ScaleRow {
            live_leases: level,
            fill_s,
            cycles_per_s: cycles(&loaded),
            acquire_p99_us: p99(&loaded),
            baseline_cycles_per_s: (!base.is_empty()).then(|| cycles(&base)),
            baseline_acquire_p99_us: (!base.is_empty()).then(|| p99(&base)),
            server_rss_bytes: s.server_pid.and_then(rss_bytes),
        };
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}
