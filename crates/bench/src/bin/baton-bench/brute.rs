//! Token brute force: while attackers send calls with wrong tokens, a
//! correct client's acquire latency is measured, and compared with the
//! same client's in a quiet phase of equal length, phases interleaved.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Acquired, Client, ConnectOptions};
use baton_proto::v1::{leases_client::LeasesClient, AcquireRequest};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// Attacking connections, each with this many guesses in flight.
const ATTACKERS: usize = 4;
const IN_FLIGHT: usize = 64;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Acquire + release cycles until `stop` returns true; acquire latencies in µs.
async fn cycle(
    client: &mut Client,
    tag: &str,
    stop: impl Fn() -> bool,
) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut i = 0u64;
    while !stop() {
        let name = format!("bench:brute:{tag}:{i}");
        i += 1;
        let sent = Instant::now();
        let got = client
            .acquire(&name, Some(Duration::from_secs(30)), Duration::ZERO)
            .await?;
        out.push(sent.elapsed().as_micros() as u64);
        if let Acquired::Granted(l) = got {
            client.release(&l.resource, &l.acquisition_id).await?;
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// `n` calls with wrong tokens from [`ATTACKERS`] connections; returns
/// how many were refused UNAUTHENTICATED.
async fn attack(url: &str, ca: &[u8], n: usize, round: usize) -> anyhow::Result<usize> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    let next = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..ATTACKERS {
        let channel = Endpoint::from_shared(url.to_string())?
            .tls_config(tls.clone())?
            .connect()
            .await?;
        for _ in 0..IN_FLIGHT {
            let (next, refused) = (next.clone(), refused.clone());
            let channel = channel.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = LeasesClient::new(channel);
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        return;
                    }
                    let mut r = tonic::Request::new(AcquireRequest {
                        resources: vec!["bench:brute:target".into()],
                        ttl_ms: Some(30_000),
                        wait_ms: 0,
                        holder: None,
                        request_id: Vec::new(),
                        first_sent_ms_ago: None,
                        shapes: Vec::new(),
                    });
                    let guess = format!("Bearer guess-{round}-{k:08}");
                    r.metadata_mut()
                        .insert("authorization", guess.parse().expect("ascii"));
                    if let Err(s) = c.acquire(r).await {
                        if s.code() == tonic::Code::Unauthenticated {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await?;
    }
    Ok(refused.load(Ordering::Relaxed))
}

/// Prints, per round, the quiet and the attacked phase side by side, then
/// the median ratio of the p99s.
pub async fn run(
    url: &str,
    options: ConnectOptions,
    ca: &[u8],
    n: usize,
    quiet: Duration,
    rounds: usize,
) -> anyhow::Result<()> {
    let mut client = Client::connect_with(url, options).await?;
    println!(
        "{:<6} {:<9} {:>8} {:>9} {:>9} {:>10} {:>9}",
        "round", "phase", "acquires", "p50", "p99", "wrong/s", "refused"
    );
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let started = Instant::now();
        let attacked = {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = done.clone();
            let attack = tokio::spawn({
                let (url, ca) = (url.to_string(), ca.to_vec());
                async move {
                    let r = attack(&url, &ca, n, round).await;
                    flag.store(true, Ordering::Relaxed);
                    r
                }
            });
            let lat = cycle(&mut client, &format!("a{round}"), || {
                done.load(Ordering::Relaxed)
            })
            .await?;
            let refused = attack.await??;
            (lat, refused, started.elapsed())
        };
        let (lat, refused, took) = attacked;
        let quiet_for = took.max(quiet);
        let q_start = Instant::now();
        let q = cycle(&mut client, &format!("q{round}"), || {
            q_start.elapsed() >= quiet_for
        })
        .await?;
        let row = |phase: &str, l: &[u64], rate: String, refused: String| {
            println!(
                "{round:<6} {phase:<9} {:>8} {:>7.2}ms {:>7.2}ms {rate:>10} {refused:>9}",
                l.len(),
                percentile(l, 0.5) as f64 / 1000.0,
                percentile(l, 0.99) as f64 / 1000.0,
            )
        };
        row("quiet", &q, "0".into(), "-".into());
        row(
            "attacked",
            &lat,
            format!("{:.0}", n as f64 / took.as_secs_f64()),
            refused.to_string(),
        );
        ratios.push(percentile(&lat, 0.99) as f64 / percentile(&q, 0.99) as f64);
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    println!(
        "correct client's acquire p99, attacked / quiet: median {:.2}x over {rounds} rounds ({} wrong tokens per attack, {ATTACKERS} connections x {IN_FLIGHT} in flight)",
        ratios[ratios.len() / 2],
        n
    );
    Ok(())
}
