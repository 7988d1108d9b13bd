//! `baton-bench`: the `baton bench` cycle, run side by side against Baton,
//! Redis (SET NX PX, INCR for a token, compare-and-delete), etcd's lock API
//! and PostgreSQL advisory locks. A peer that is not running is reported as
//! such and skipped; Baton must be running.

mod brute;
mod commits;
mod etcd;
mod pg;
mod redis;

use baton_bench::{run, Baton, CycleFlags, Mode, Report, Target, Transport};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Acquire/release cycles against Baton and its peers, side by side")]
struct Args {
    /// Baton server (on its embedded store).
    #[arg(long, default_value = "http://127.0.0.1:7700")]
    server: String,
    /// A second Baton server (an earlier build, say), measured beside
    /// --server with the same transports ("baton baseline"); empty to skip.
    /// Both servers' processes are named `baton`, so each target's server
    /// CPU includes the other's, which idles meanwhile.
    #[arg(long, default_value = "")]
    baseline_server: String,
    /// A Baton cluster on PostgreSQL (comma-separated servers), measured
    /// beside the embedded one; empty to skip.
    #[arg(long, default_value = "")]
    cluster: String,
    /// --server's HTTP listener (IP:PORT): its store commits per run are
    /// printed under each of its lines (cycles per fsync).
    #[arg(long, default_value = "")]
    server_http: String,
    /// The cluster's HTTP listeners (comma-separated IP:PORT): its
    /// leader's commits per run are printed under each cluster line.
    #[arg(long, default_value = "")]
    cluster_http: String,
    /// The cluster's PostgreSQL connection string: the WAL bytes per cycle
    /// are printed too (the database's whole log: nothing else may write
    /// to that PostgreSQL server meanwhile).
    #[arg(long, default_value = "")]
    cluster_store: String,
    /// PostgreSQL connection string for the plain lease-table pattern (one
    /// transaction per acquire and per release); empty to skip.
    #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=test")]
    lease_table: String,
    /// Redis address (host:port); empty to skip.
    #[arg(long, default_value = "127.0.0.1:6379")]
    redis: String,
    /// Measure Redis once per appendfsync mode (always, everysec) by setting
    /// it with CONFIG SET, restoring the previous settings afterwards.
    #[arg(long)]
    redis_aof_modes: bool,
    /// etcd gRPC endpoint; empty to skip.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// PostgreSQL connection string for advisory locks; empty to skip.
    #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=test")]
    postgres: String,
    #[command(flatten)]
    cycle: CycleFlags,
    /// How Baton is called, comma-separated: unary (a call per acquire and
    /// per release, a connection per client), session (a session per
    /// client, a connection per client), session-1conn (a session per
    /// client, one connection for all).
    #[arg(
        long,
        value_enum,
        default_value = "unary,session,session-1conn",
        value_delimiter = ','
    )]
    transports: Vec<Transport>,
    /// Rounds: every target is measured once per round, rounds one after
    /// the other, so noise falls on all targets alike; with several, a table
    /// of medians and the median per-round ratio of each Baton target to
    /// each peer follow.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// A second Baton server with TLS and an auth file, measured beside
    /// --server with the same transports ("tls+auth"); empty to skip.
    #[arg(long, default_value = "")]
    secure_server: String,
    /// The CA of --secure-server's certificate (PEM).
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
    /// A bearer token file of a principal with `lease` on `bench:`.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// With --server-http or --cluster-http: also print, every this long
    /// during a run (like 10s), the store's commits and their mean latency
    /// in that interval (a long run's drift: a table that fills, a vacuum).
    #[arg(long, value_parser = baton_client::flags::parse_positive_duration)]
    every: Option<std::time::Duration>,
    /// Instead of the cycle table: this many calls with wrong tokens
    /// against --secure-server while a correct client cycles; reports the
    /// correct client's acquire p99 with and without the attack, per round.
    #[arg(long)]
    brute_force: Option<usize>,
}

async fn measure<T: Target>(
    target: &T,
    args: &Args,
    clients: &[usize],
    modes: &[Mode],
    run_id: &str,
    out: &mut Vec<Report>,
    probe: Option<&commits::Probe>,
) {
    let duration = args.cycle.duration;
    for &mode in modes {
        for &c in clients {
            let before = match probe {
                Some(p) => Some(p.mark().await.unwrap_or_else(|e| probe_failed(&e))),
                None => None,
            };
            let ran = run(target, mode, c, duration, run_id);
            let ran = match (probe, args.every) {
                (Some(p), Some(every)) => {
                    let label = format!("{} {} {c}", target.name(), mode.label());
                    p.every(&label, every, ran).await
                }
                _ => ran.await,
            };
            match ran {
                Ok(report) => {
                    println!("{}", report.line());
                    if let (Some(p), Some(before)) = (probe, before) {
                        let after = p.mark().await.unwrap_or_else(|e| probe_failed(&e));
                        println!("{}", commits::Probe::line(&before, &after, &report));
                    }
                    out.push(report);
                }
                Err(e) => println!(
                    "{:<26} {:<9} {:>4} failed: {e:#}",
                    target.name(),
                    mode.label(),
                    c
                ),
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let clients = args.cycle.clients.all().to_vec();
    let modes = args.cycle.modes.to_vec();
    let secure = secure_options(&args);
    if let Some(n) = args.brute_force {
        brute_force(&args, n, secure).await;
        return;
    }
    // Every Baton server measured with each transport: label prefix, URL,
    // connection options.
    let mut servers = vec![("baton", args.server.clone(), None)];
    if !args.baseline_server.is_empty() {
        servers.push(("baton baseline", args.baseline_server.clone(), None));
    }
    if secure.is_some() {
        servers.push(("baton tls+auth", args.secure_server.clone(), secure));
    }
    let (server_probe, cluster_probe) = probes(&args).await;
    let mut all: Vec<Report> = Vec::new();
    for round in 1..=args.rounds.max(1) {
        let plan = Plan {
            args: &args,
            clients: &clients,
            modes: &modes,
            run_id: args.cycle.run_id(&format!("-{round}")),
            server_probe: server_probe.as_ref(),
            cluster_probe: cluster_probe.as_ref(),
        };
        println!("round {round}");
        println!("{}", Report::header());
        plan.batons(&servers, &mut all).await;
        plan.peers(&mut all).await;
    }
    if args.rounds > 1 {
        summarize(&all, args.rounds);
    }
}

fn probe_failed(e: &anyhow::Error) -> ! {
    eprintln!("error: reading a server's commits: {e:#}");
    std::process::exit(1);
}

/// The commit counters of --server-http, and of --cluster-http with
/// --cluster-store.
async fn probes(args: &Args) -> (Option<commits::Probe>, Option<commits::Probe>) {
    if args.every.is_some() && args.server_http.is_empty() && args.cluster_http.is_empty() {
        eprintln!("error: --every needs --server-http or --cluster-http");
        std::process::exit(2);
    }
    let probe = async |http: &str, store: &str| {
        if http.is_empty() {
            if !store.is_empty() {
                eprintln!("error: --cluster-store needs --cluster-http");
                std::process::exit(2);
            }
            return None;
        }
        Some(
            commits::Probe::new(http, store)
                .await
                .unwrap_or_else(|e| probe_failed(&e)),
        )
    };
    (
        probe(&args.server_http, "").await,
        probe(&args.cluster_http, &args.cluster_store).await,
    )
}

/// The TLS and token options of --secure-server, if one is given.
fn secure_options(args: &Args) -> Option<baton_client::ConnectOptions> {
    if args.secure_server.is_empty() {
        return None;
    }
    match baton_client::ConnectOptions::from_files(
        args.tls_ca.as_deref(),
        None,
        None,
        args.token_file.as_deref(),
    ) {
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("error: --secure-server: {e:#}");
            std::process::exit(2);
        }
    }
}

/// `--brute-force N`: the guessing attack beside a correct client.
async fn brute_force(args: &Args, n: usize, secure: Option<baton_client::ConnectOptions>) {
    let Some(options) = secure else {
        eprintln!("error: --brute-force needs --secure-server, --tls-ca and --token-file");
        std::process::exit(2);
    };
    let ca = std::fs::read(args.tls_ca.as_ref().expect("checked")).expect("read --tls-ca");
    let seconds = args.cycle.duration;
    if let Err(e) = brute::run(
        &args.secure_server,
        options,
        &ca,
        n,
        seconds,
        args.rounds.max(1),
    )
    .await
    {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// One round's measurements: every target, each mode and client count.
struct Plan<'a> {
    args: &'a Args,
    clients: &'a [usize],
    modes: &'a [Mode],
    run_id: String,
    server_probe: Option<&'a commits::Probe>,
    cluster_probe: Option<&'a commits::Probe>,
}

type Server = (&'static str, String, Option<baton_client::ConnectOptions>);

impl Plan<'_> {
    async fn measure<T: Target>(&self, target: &T, all: &mut Vec<Report>) {
        self.measure_with(target, all, None).await;
    }

    async fn measure_with<T: Target>(
        &self,
        target: &T,
        all: &mut Vec<Report>,
        probe: Option<&commits::Probe>,
    ) {
        measure(
            target,
            self.args,
            self.clients,
            self.modes,
            &self.run_id,
            all,
            probe,
        )
        .await;
    }

    /// Every Baton server with each transport asked for, then the cluster.
    async fn batons(&self, servers: &[Server], all: &mut Vec<Report>) {
        let args = self.args;
        let ttl = args.cycle.ttl;
        for (label, transport) in [
            ("baton unary", Transport::Unary),
            ("baton session", Transport::Session),
            ("baton session 1conn", Transport::SessionSharedConnection),
        ] {
            if !args.transports.contains(&transport) {
                continue;
            }
            for (i, (prefix, url, options)) in servers.iter().enumerate() {
                let mut baton = Baton::new(label.replace("baton", prefix), url.clone(), ttl)
                    .with_transport(transport)
                    .with_processes(&["baton"]);
                if let Some(options) = options {
                    baton = baton.with_options(options.clone());
                }
                // --server is the first.
                let probe = if i == 0 { self.server_probe } else { None };
                self.measure_with(&baton, all, probe).await;
            }
        }
        if !args.cluster.is_empty() {
            let cluster = Baton::new("baton on postgres", args.cluster.clone(), ttl)
                .with_transport(Transport::SessionSharedConnection)
                .with_processes(&["baton", "postgres"]);
            self.measure_with(&cluster, all, self.cluster_probe).await;
        }
    }

    /// The peers that answer; one that does not is reported and skipped.
    async fn peers(&self, all: &mut Vec<Report>) {
        let args = self.args;
        if !args.lease_table.is_empty() {
            match pg::LeaseTable::probe(&args.lease_table, ttl_s(args)).await {
                Err(e) => println!("postgres lease table: not reachable ({e:#}); skipped"),
                Ok(target) => self.measure(&target, all).await,
            }
        }
        if !args.redis.is_empty() {
            self.redis(all).await;
        }
        if !args.etcd.is_empty() {
            match etcd::Etcd::probe(&args.etcd).await {
                Err(e) => println!("etcd at {}: not running ({e:#}); skipped", args.etcd),
                Ok(target) => self.measure(&target, all).await,
            }
        }
        if !args.postgres.is_empty() {
            match pg::Advisory::probe(&args.postgres).await {
                Err(e) => println!("postgres advisory locks: not reachable ({e:#}); skipped"),
                Ok(target) => self.measure(&target, all).await,
            }
        }
    }

    /// Redis as it is, or once per appendfsync mode (restored afterwards).
    async fn redis(&self, all: &mut Vec<Report>) {
        let args = self.args;
        match redis::Redis::probe(&args.redis).await {
            Err(e) => println!("redis at {}: not running ({e:#}); skipped", args.redis),
            Ok(()) if args.redis_aof_modes => {
                let saved = redis::aof_settings(&args.redis).await;
                for mode in ["always", "everysec"] {
                    if let Err(e) = redis::set_aof(&args.redis, mode).await {
                        println!("redis: cannot set appendfsync {mode}: {e:#}");
                        continue;
                    }
                    let target =
                        redis::Redis::new(&args.redis, &format!("redis aof={mode}"), ttl_s(args));
                    self.measure(&target, all).await;
                }
                if let Ok((appendonly, fsync)) = saved {
                    let _ = redis::restore_aof(&args.redis, &appendonly, &fsync).await;
                }
            }
            Ok(()) => {
                let target = redis::Redis::new(&args.redis, "redis", ttl_s(args));
                self.measure(&target, all).await;
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Medians over the rounds, and each Baton target's median per-round ratio
/// to each peer (cycles per second).
fn summarize(all: &[Report], rounds: usize) {
    use std::collections::BTreeMap;
    let key = |r: &Report| (r.target.clone(), r.mode.label(), r.clients);
    let mut groups: BTreeMap<(String, &str, usize), Vec<&Report>> = BTreeMap::new();
    let mut order = Vec::new();
    for r in all {
        let k = key(r);
        if !groups.contains_key(&k) {
            order.push(k.clone());
        }
        groups.entry(k).or_default().push(r);
    }
    println!("\nmedians over {rounds} rounds");
    println!(
        "{:<26} {:<9} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "target", "mode", "C", "cycles/s", "acq p50", "acq p99", "rel p50", "srv µs/c", "gen µs/c"
    );
    for k in &order {
        let g = &groups[k];
        let ms = |v: Vec<f64>| format!("{:.2}ms", median(v) / 1000.0);
        let cpu = |v: Vec<Option<f64>>| {
            let v: Vec<f64> = v.into_iter().flatten().collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(v))
            }
        };
        println!(
            "{:<26} {:<9} {:>4} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>9}",
            k.0,
            k.1,
            k.2,
            median(g.iter().map(|r| r.cycles_per_s).collect()),
            ms(g.iter().map(|r| r.acquire_us.p50 as f64).collect()),
            ms(g.iter().map(|r| r.acquire_us.p99 as f64).collect()),
            ms(g.iter().map(|r| r.release_us.p50 as f64).collect()),
            cpu(g.iter().map(|r| r.server_cpu_us_per_cycle).collect()),
            cpu(g.iter().map(|r| r.client_cpu_us_per_cycle).collect()),
        );
    }
    println!("\nmedian per-round ratio of cycles/s (Baton target / peer)");
    let targets: Vec<String> = {
        let mut t: Vec<String> = order.iter().map(|k| k.0.clone()).collect();
        t.dedup();
        t
    };
    for b in targets.iter().filter(|t| t.starts_with("baton")) {
        for p in targets.iter().filter(|t| *t != b) {
            for k in order.iter().filter(|k| &k.0 == b) {
                let Some(peer) = groups.get(&(p.clone(), k.1, k.2)) else {
                    continue;
                };
                let ratios: Vec<f64> = groups[k]
                    .iter()
                    .zip(peer.iter())
                    .map(|(x, y)| x.cycles_per_s / y.cycles_per_s.max(1e-9))
                    .collect();
                println!(
                    "{b:<20} / {p:<24} {:<9} C={:<3} {:>6.2}",
                    k.1,
                    k.2,
                    median(ratios)
                );
            }
        }
    }
}

/// The peers' TTL in whole seconds (Redis, the lease table): `--ttl`
/// rounded up, at least 1.
fn ttl_s(args: &Args) -> u64 {
    args.cycle.ttl.as_secs_f64().ceil().max(1.0) as u64
}
