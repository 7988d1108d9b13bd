//! The live-lease scaling run: fill a server with leases, then measure
//! the cycle and the server's memory at each level.

use super::*;

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
                match client.acquire_all(&refs, Some(ttl), Duration::ZERO).await? {
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
