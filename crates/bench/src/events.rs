//! The event run: C clients cycle acquire → release on distinct resources
//! while an event happens beside them (a backup, a restart, a session
//! ending), and a prober asks `/readyz` every 10 ms. The report splits
//! the run into before, during and after the event: cycles per second,
//! the worst and p99.9 acquire, and the worst `/readyz` answer. An
//! acquire counts as *during* if it overlapped the event at all.

use super::*;

/// Time between two `/readyz` probes.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// One timed call: when it started and ended, since the run's start.
#[derive(Clone, Copy, Debug)]
struct Timed {
    from: Duration,
    to: Duration,
}

impl Timed {
    fn us(self) -> u64 {
        (self.to - self.from).as_micros() as u64
    }
}

/// One window of the run.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Its length.
    pub length: Duration,
    /// Acquires (each followed by a release) completed in it.
    pub cycles: u64,
    /// Cycles per second.
    pub cycles_per_s: f64,
    /// The slowest acquire, µs.
    pub acquire_max_us: u64,
    /// The 99.9th percentile acquire, µs.
    pub acquire_p999_us: u64,
    /// The slowest `/readyz` answer, µs (`None` without an HTTP address).
    pub readyz_max_us: Option<u64>,
    /// Failed acquires and releases that overlap the window.
    pub errors: u64,
}

/// Before, during and after an event.
#[derive(Clone, Debug)]
pub struct EventReport {
    /// What happened.
    pub event: String,
    /// The windows, in order.
    pub before: Window,
    /// The event's own window (it took `during.length`).
    pub during: Window,
    /// After the event.
    pub after: Window,
}

/// How to run the clients beside an event.
pub struct EventRun<'a, T: Target> {
    /// Where the clients cycle.
    pub target: &'a T,
    /// Concurrent clients.
    pub clients: usize,
    /// Quiet time before and after the event.
    pub settle: Duration,
    /// The server's HTTP address, for `/readyz`.
    pub http: Option<std::net::SocketAddr>,
}

impl<T: Target> EventRun<'_, T> {
    /// Runs the clients, `event` after [`EventRun::settle`], then the
    /// settle time again; `event` names itself in the report.
    pub async fn around<F, E>(
        &self,
        name: &str,
        event: F,
        run_id: &str,
    ) -> anyhow::Result<EventReport>
    where
        F: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let origin = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = self.spawn_clients(origin, &stop, run_id).await?;
        let prober = self.http.map(|addr| {
            let stop = stop.clone();
            tokio::spawn(probe_readyz(addr, origin, stop))
        });
        tokio::time::sleep(self.settle).await;
        let started = origin.elapsed();
        let outcome = event.await;
        let ended = origin.elapsed();
        tokio::time::sleep(self.settle).await;
        let end = origin.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        outcome.map_err(|e| anyhow::anyhow!("the event ({name}) failed: {e}"))?;
        let (mut calls, mut errors) = (Vec::new(), Vec::new());
        for t in tasks {
            let (c, e) = t.await?;
            calls.extend(c);
            errors.extend(e);
        }
        let probes = match prober {
            Some(p) => Some(p.await?),
            None => None,
        };
        let window =
            |from: Duration, to: Duration| window(&calls, &errors, probes.as_deref(), from, to);
        Ok(EventReport {
            event: name.to_string(),
            before: window(Duration::ZERO, started),
            during: window(started, ended),
            after: window(ended, end),
        })
    }

    /// Starts the clients: each cycles until `stop`, then answers its
    /// timed acquires and its timed failures.
    async fn spawn_clients(
        &self,
        origin: Instant,
        stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
        run_id: &str,
    ) -> anyhow::Result<Vec<tokio::task::JoinHandle<(Vec<Timed>, Vec<Timed>)>>> {
        let mut tasks = Vec::with_capacity(self.clients);
        for i in 0..self.clients {
            let mut conn = self.target.connect().await?;
            let resource = format!("bench:{run_id}:event:r{i}");
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let (mut calls, mut errors) = (Vec::new(), Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let from = origin.elapsed();
                    let acquired = conn.acquire(&resource, false).await;
                    let acquire = Timed {
                        from,
                        to: origin.elapsed(),
                    };
                    match acquired {
                        Ok(held) => {
                            calls.push(acquire);
                            if conn.release(held).await.is_err() {
                                errors.push(Timed {
                                    from: acquire.to,
                                    to: origin.elapsed(),
                                });
                            }
                        }
                        Err(_) => errors.push(acquire),
                    }
                }
                (calls, errors)
            }));
        }
        Ok(tasks)
    }
}

/// The window `from..to`: every call, failure and probe that overlaps it.
fn window(
    calls: &[Timed],
    errors: &[Timed],
    probes: Option<&[Timed]>,
    from: Duration,
    to: Duration,
) -> Window {
    let overlaps = |c: &&Timed| c.to >= from && c.from <= to;
    let mut acquires: Vec<u64> = calls.iter().filter(overlaps).map(|c| c.us()).collect();
    acquires.sort_unstable();
    let at = |q: f64| {
        acquires
            .get(((acquires.len().saturating_sub(1)) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let length = to - from;
    Window {
        length,
        cycles: acquires.len() as u64,
        cycles_per_s: acquires.len() as f64 / length.as_secs_f64().max(1e-3),
        acquire_max_us: acquires.last().copied().unwrap_or(0),
        acquire_p999_us: at(0.999),
        readyz_max_us: probes.map(|p| p.iter().filter(overlaps).map(|c| c.us()).max().unwrap_or(0)),
        errors: errors.iter().filter(overlaps).count() as u64,
    }
}

/// `GET /readyz` every [`PROBE_EVERY`] on a new connection until `stop`;
/// each probe's time. A probe that fails counts until it failed.
async fn probe_readyz(
    addr: std::net::SocketAddr,
    origin: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Timed> {
    let mut probes = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let from = origin.elapsed();
        let _answer = http_get(addr, "/readyz").await;
        probes.push(Timed {
            from,
            to: origin.elapsed(),
        });
        tokio::time::sleep(PROBE_EVERY).await;
    }
    probes
}

/// `GET path` over HTTP/1.0 on a new connection: the whole answer, head
/// and body. (The bench needs two plain GETs on loopback; an HTTP client
/// crate would add a dependency for them.)
async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nhost: bench\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The value of metric `name` (a line `name VALUE`) on a server's
/// `/metrics`, as written there.
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> std::io::Result<String> {
    let text = http_get(addr, "/metrics").await?;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| std::io::Error::other(format!("/metrics has no {name}")))
}

/// Waits until the server's `baton_leases_ending` gauge (ended leases
/// not yet dropped from its table) is 0, asking `/metrics` every
/// millisecond: the end of an event whose work the server finishes after
/// answering (a big session's close).
pub async fn until_no_leases_ending(addr: std::net::SocketAddr) -> std::io::Result<()> {
    loop {
        if metric(addr, "baton_leases_ending").await? == "0" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
