//! Crash test of the server's long events: `kill -9` at random moments
//! while sessions of 3,000 leases end (closed, or left to expire), their
//! leases dropped a bounded number per step, while other clients take
//! those resources as they free, and while backups are read. The store's
//! logs fill and fold in the background meanwhile. Afterwards the fault
//! suite's checker finds no token twice, none out of real-time order, and
//! no lease that was left to expire granted again within a full TTL of the
//! request that granted it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::rng::Rng;
use baton_client::{AcquiredAll, Client};
use baton_faults::grants::Grant;
use baton_systest as common;
use common::TempDir;

const TTL: Duration = Duration::from_millis(400);
/// Leases per big session, acquired 64 at a time.
const BIG: usize = 3_000;
const PER_REQUEST: usize = 64;
const KILLS: usize = 15;

#[derive(Debug, Default)]
struct Counts {
    closed: AtomicU64,
    abandoned: AtomicU64,
    taken: AtomicU64,
    backups: AtomicU64,
}

type History = Arc<Mutex<Vec<Grant>>>;

fn big(k: usize) -> String {
    format!("big:{k:05}")
}

/// Opens a session, fills it with [`BIG`] leases, then closes it or
/// abandons it (as a crashed client), over and over.
async fn ender(
    url: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    history: History,
    counts: Arc<Counts>,
) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let Ok(client) = Client::connect(&url).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let Ok(session) = client
            .with_rpc_timeout(Duration::from_secs(2))
            .open_session(TTL)
            .await
        else {
            continue;
        };
        let mut mine = Vec::new();
        let start = rng.below(BIG as u64) as usize;
        for chunk in 0..BIG / PER_REQUEST {
            let names: Vec<String> = (0..PER_REQUEST)
                .map(|i| big((start + chunk * PER_REQUEST + i) % BIG))
                .collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let sent = Instant::now();
            match session.acquire_all(&refs, Duration::ZERO).await {
                Ok(AcquiredAll::Granted { leases, .. }) => {
                    let answered = Instant::now();
                    mine.extend(
                        leases
                            .iter()
                            .map(|l| (l.resource.clone(), l.token.get(), sent, answered)),
                    );
                }
                Ok(AcquiredAll::NotAcquired(_)) => {}
                Err(_) => break,
            }
        }
        let abandon = rng.below(2) == 0;
        let closed = !abandon && matches!(session.close().await, Ok(true));
        if abandon {
            // As a crashed process: its leases end one TTL after the last
            // heartbeat, which is no earlier than each acquire's send.
            session.abandon();
            counts.abandoned.fetch_add(1, Ordering::Relaxed);
        } else if closed {
            counts.closed.fetch_add(1, Ordering::Relaxed);
        }
        let mut history = history.lock().unwrap();
        history.extend(
            mine.into_iter()
                .map(|(resource, token, invoked, answered)| Grant {
                    resource,
                    token,
                    invoked,
                    answered,
                    // A close that failed may or may not have ended them: no claim.
                    earliest_end: abandon.then(|| invoked + TTL),
                }),
        );
    }
}

/// Takes a random big resource with a lease of its own when it is free,
/// and gives it back (or abandons it) at once.
async fn taker(
    url: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    history: History,
    counts: Arc<Counts>,
) {
    let mut rng = Rng::new(seed);
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        if common::reconnect(&mut client, &url).await.is_none() {
            continue;
        }
        let name = big(rng.below(BIG as u64) as usize);
        if common::take_once(&mut client, &name, TTL, &mut rng, &history).await {
            counts.taken.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Reads backups, one after another.
async fn backups(url: String, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = Client::connect(&url).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        if c.backup().await.is_ok() {
            counts.backups.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_ordered_across_sigkill_during_session_ends_and_backups() {
    let seed = baton_testkit::seed_from_env("BATON_CRASH_SEED");
    println!("crash-events seed {seed} (rerun with BATON_CRASH_SEED={seed}), kills {KILLS}");
    let dir = TempDir::new("crash-events");
    let server = common::serve(dir.path(), &[]);
    let url = server.url();
    let stop = Arc::new(AtomicBool::new(false));
    let history: History = Arc::default();
    let counts = Arc::new(Counts::default());
    let mut tasks = vec![
        tokio::spawn(ender(
            url.clone(),
            seed,
            stop.clone(),
            history.clone(),
            counts.clone(),
        )),
        tokio::spawn(backups(url.clone(), stop.clone(), counts.clone())),
    ];
    tasks.extend((0..2).map(|i| {
        tokio::spawn(taker(
            url.clone(),
            seed ^ (i + 7),
            stop.clone(),
            history.clone(),
            counts.clone(),
        ))
    }));
    let watched = counts.clone();
    let killer = tokio::task::spawn_blocking(move || {
        let mut server = server;
        let mut rng = Rng::new(seed ^ 0x5eed);
        for _ in 0..KILLS {
            std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
            server.restart();
        }
        // The last incarnation serves until both kinds of session end and
        // a backup happened at least once.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline
            && [&watched.closed, &watched.abandoned, &watched.backups]
                .iter()
                .any(|c| c.load(Ordering::Relaxed) == 0)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    });
    let server = killer.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    drop(server);
    let history = history.lock().unwrap().clone();
    let verdict = baton_faults::grants::check(&history);
    println!(
        "crash-events: {KILLS} SIGKILLs, {} grants, {} left to expire checked for exclusion; {counts:?}",
        history.len(),
        verdict.exclusion_checked
    );
    assert!(verdict.is_safe(), "unsafe grant history: {verdict:?}");
    for (what, n) in [
        ("closed big sessions", &counts.closed),
        ("abandoned big sessions", &counts.abandoned),
        ("backups", &counts.backups),
        ("takes of a big session's resource", &counts.taken),
    ] {
        assert!(
            n.load(Ordering::Relaxed) > 0,
            "no {what}: the test proved nothing about them"
        );
    }
    assert!(
        verdict.exclusion_checked > 0,
        "no abandoned lease was followed by another grant"
    );
}
