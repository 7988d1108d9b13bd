//! `baton bench --watchers IDLE,BUSY`: what watchers cost the lease path,
//! measured side by side in alternating rounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use baton_client::{Client, Watch};
use serde::Serialize;

use super::{emit, failed, transport, Args, BenchError, Endpoint};
use crate::{Baton, Mode};

/// Watches per client connection (a server takes 200 streams at once on one).
const WATCHES_PER_CONNECTION: usize = 100;

/// Open watchers; dropping them ends every watch.
struct Watchers {
    _idle: Vec<Watch>,
    busy: Vec<tokio::task::JoinHandle<()>>,
    events: Arc<AtomicU64>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for task in &self.busy {
            task.abort();
        }
    }
}

fn parse(spec: &str) -> Result<(usize, usize), BenchError> {
    let bad = || {
        BenchError::Usage(format!(
            "--watchers {spec:?}: write IDLE,BUSY, like 1000,100"
        ))
    };
    let (idle, busy) = spec.split_once(',').ok_or_else(bad)?;
    Ok((
        idle.trim().parse().map_err(|_| bad())?,
        busy.trim().parse().map_err(|_| bad())?,
    ))
}

/// `idle` watchers of a prefix that never changes and `busy` ones of
/// `busy_prefix`, which every cycle's names start with.
async fn start(
    to: &Endpoint,
    (idle, busy): (usize, usize),
    run_id: &str,
    busy_prefix: &str,
) -> Result<Watchers, BenchError> {
    let events = Arc::new(AtomicU64::new(0));
    let (mut idles, mut tasks) = (Vec::new(), Vec::new());
    let mut client: Option<Client> = None;
    for i in 0..idle + busy {
        if i % WATCHES_PER_CONNECTION == 0 {
            client = Some(Client::connect_with(&to.server, to.options.clone()).await?);
        }
        let c = client.as_ref().expect("made above");
        if i < idle {
            idles.push(c.watch(&format!("idle:{run_id}:")).await?);
            continue;
        }
        let mut watch = c.watch(busy_prefix).await?;
        let events = events.clone();
        tasks.push(tokio::spawn(async move {
            while watch.next().await.is_ok() {
                events.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    Ok(Watchers {
        _idle: idles,
        busy: tasks,
        events,
    })
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of alternating rounds: without a load beside the clients, then
/// with it.
pub(super) struct Sides {
    pub clients: usize,
    pub rounds: usize,
    pub cycles_per_s_without: u64,
    pub cycles_per_s_with: u64,
    pub acquire_p99_us_without: u64,
    pub acquire_p99_us_with: u64,
    /// Medians of the server's CPU time per cycle (when its processes are
    /// found) and of this process's (its clients and whatever `start`
    /// runs in it), µs.
    pub server_cpu_us_per_cycle_without: Option<f64>,
    pub server_cpu_us_per_cycle_with: Option<f64>,
    pub own_cpu_us_per_cycle_without: Option<f64>,
    pub own_cpu_us_per_cycle_with: Option<f64>,
    /// Cycles completed beside the load, all rounds.
    pub cycles_with: u64,
}

impl Sides {
    pub fn ratio(&self) -> f64 {
        self.cycles_per_s_with as f64 / self.cycles_per_s_without.max(1) as f64
    }
}

/// Rounds of `--clients` (the first count) session or unary clients
/// cycling on distinct resources, first alone, then beside what `start`
/// starts (stopped when the guard it returns is dropped; `done` reads it
/// before).
pub(super) async fn alternating<G>(
    a: &Args,
    to: &Endpoint,
    mut start: impl AsyncFnMut() -> Result<G, BenchError>,
    mut done: impl FnMut(&G),
) -> Result<Sides, BenchError> {
    let clients = a.cycle.clients.first();
    let target = Baton::new("baton", to.server.clone(), a.cycle.ttl)
        .with_transport(transport(a))
        .with_options(to.options.clone())
        .with_processes(&["baton"]);
    let run_id = a.cycle.run_id("");
    let (mut without, mut with, mut p99_without, mut p99_with) = (vec![], vec![], vec![], vec![]);
    let (mut server, mut own) = ([vec![], vec![]], [vec![], vec![]]);
    let mut cycles_with = 0;
    for round in 0..a.rounds.max(1) {
        let r = crate::run(
            &target,
            Mode::Distinct,
            clients,
            a.cycle.duration,
            &format!("{run_id}-{round}-none"),
        )
        .await
        .map_err(failed)?;
        without.push(r.cycles_per_s);
        p99_without.push(r.acquire_us.p99 as f64);
        server[0].extend(r.server_cpu_us_per_cycle);
        own[0].extend(r.client_cpu_us_per_cycle);
        let guard = start().await?;
        let r = crate::run(
            &target,
            Mode::Distinct,
            clients,
            a.cycle.duration,
            &format!("{run_id}-{round}-beside"),
        )
        .await
        .map_err(failed)?;
        done(&guard);
        drop(guard);
        with.push(r.cycles_per_s);
        p99_with.push(r.acquire_us.p99 as f64);
        server[1].extend(r.server_cpu_us_per_cycle);
        own[1].extend(r.client_cpu_us_per_cycle);
        cycles_with += r.cycles;
    }
    let [server_without, server_with] = server.map(median_of);
    let [own_without, own_with] = own.map(median_of);
    Ok(Sides {
        clients,
        rounds: without.len(),
        cycles_per_s_without: median(without).round() as u64,
        cycles_per_s_with: median(with).round() as u64,
        acquire_p99_us_without: median(p99_without) as u64,
        acquire_p99_us_with: median(p99_with) as u64,
        server_cpu_us_per_cycle_without: server_without,
        server_cpu_us_per_cycle_with: server_with,
        own_cpu_us_per_cycle_without: own_without,
        own_cpu_us_per_cycle_with: own_with,
        cycles_with,
    })
}

/// The median, if there are figures.
fn median_of(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

/// Alternating rounds without and with the watchers.
pub(super) async fn overhead(
    a: &Args,
    to: &Endpoint,
    json: bool,
    spec: &str,
) -> Result<(), BenchError> {
    let (idle, busy) = parse(spec)?;
    let run_id = std::process::id().to_string();
    let mut delivered = 0;
    let sides = alternating(
        a,
        to,
        async || start(to, (idle, busy), &run_id, &a.cycle.prefix).await,
        |w: &Watchers| delivered += w.events.load(Ordering::Relaxed),
    )
    .await?;
    let out = Overhead {
        clients: sides.clients,
        idle_watchers: idle,
        busy_watchers: busy,
        rounds: sides.rounds,
        cycles_per_s_without: sides.cycles_per_s_without,
        cycles_per_s_with: sides.cycles_per_s_with,
        acquire_p99_us_without: sides.acquire_p99_us_without,
        acquire_p99_us_with: sides.acquire_p99_us_with,
        events_delivered: delivered,
        server_cpu_us_per_event: per_event(
            sides.server_cpu_us_per_cycle_without,
            sides.server_cpu_us_per_cycle_with,
            delivered,
            sides.cycles_with,
        ),
        own_cpu_us_per_event: per_event(
            sides.own_cpu_us_per_cycle_without,
            sides.own_cpu_us_per_cycle_with,
            delivered,
            sides.cycles_with,
        ),
    };
    emit(json, &out, Overhead::text);
    Ok(())
}

/// The CPU time a delivered event added, µs: the growth of the CPU per
/// cycle beside the watchers, over the events each cycle delivered.
fn per_event(without: Option<f64>, with: Option<f64>, events: u64, cycles: u64) -> Option<f64> {
    let events_per_cycle = events as f64 / cycles.max(1) as f64;
    (events > 0).then_some((with? - without?) / events_per_cycle)
}

impl Overhead {
    fn text(&self) -> String {
        let out = self;
        let (idle, busy) = (self.idle_watchers, self.busy_watchers);
        format!(
            "C={} distinct, medians of {} rounds: {} cycles/s without watchers, {} with {} idle + {} busy ({:.3}x); acquire p99 {} us -> {} us; {} events delivered to busy watchers; CPU per delivered event: server {} us, this process (its watchers decoding) {} us",
            out.clients,
            out.rounds,
            out.cycles_per_s_without,
            out.cycles_per_s_with,
            idle,
            busy,
            out.cycles_per_s_with as f64 / out.cycles_per_s_without.max(1) as f64,
            out.acquire_p99_us_without,
            out.acquire_p99_us_with,
            out.events_delivered,
            us(out.server_cpu_us_per_event),
            us(out.own_cpu_us_per_event),
        )
    }
}

#[derive(Serialize)]
struct Overhead {
    clients: usize,
    idle_watchers: usize,
    busy_watchers: usize,
    rounds: usize,
    cycles_per_s_without: u64,
    cycles_per_s_with: u64,
    acquire_p99_us_without: u64,
    acquire_p99_us_with: u64,
    events_delivered: u64,
    server_cpu_us_per_event: Option<f64>,
    own_cpu_us_per_event: Option<f64>,
}

fn us(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}
