//! Crash test: concurrent acquirers while the server is killed with SIGKILL
//! and restarted, over and over. Afterwards every token returned for a
//! resource is unique and ordered consistently with real time, and no lease
//! that its holder abandoned was granted again within one TTL. Half of the
//! acquirers hold their leases on sessions: they resume their session after
//! each restart, and abandon it (no close, no heartbeat) to abandon a lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Acquired, Client, Release};
use baton_systest as common;
use common::TempDir;

const TTL: Duration = Duration::from_millis(120);
const RESOURCES: usize = 3;

#[derive(Clone, Debug)]
struct Grant {
    resource: usize,
    token: u64,
    sent: Instant,
    received: Instant,
    /// The holder gave it up on purpose (a crashed worker never releases).
    abandoned: bool,
    /// Held on a session (else with its own TTL).
    on_session: bool,
}

use baton_client::rng::Rng;

fn seed() -> u64 {
    baton_testkit::seed_from_env("BATON_CRASH_SEED")
}

async fn worker(
    url: String,
    id: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Grant>>>,
) {
    let mut rng = Rng::new(seed ^ (id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = common::reconnect(&mut client, &url).await else {
            continue;
        };
        let resource = rng.below(RESOURCES as u64) as usize;
        let name = format!("crash:{resource}");
        let wait = if rng.below(2) == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(150)
        };
        let sent = Instant::now();
        match c.acquire(&name, Some(TTL), wait).await {
            Ok(Acquired::Granted(lease)) => {
                let received = Instant::now();
                let abandoned = rng.below(3) == 0;
                history.lock().unwrap().push(Grant {
                    resource,
                    token: lease.token.get(),
                    sent,
                    received,
                    abandoned,
                    on_session: false,
                });
                if !abandoned {
                    tokio::time::sleep(Duration::from_millis(rng.below(10))).await;
                    if let Ok(Release::NotHeld) = c.release(&name, &lease.acquisition_id).await {
                        // Allowed only if the TTL ran out meanwhile (a restart may take a
                        // while). The grant happened after `sent`, so measure from there.
                        assert!(
                            sent.elapsed() >= TTL,
                            "lease {} lost before its TTL",
                            lease.token
                        );
                    }
                }
            }
            Ok(Acquired::NotAcquired(_)) => {}
            Err(_) => client = None,
        }
    }
}

/// Like `worker`, with leases tied to a session of `TTL` that lives across
/// restarts (resumed by the client) until it is abandoned or ends.
async fn session_worker(
    url: String,
    id: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Grant>>>,
    counts: Arc<Mutex<SessionCounts>>,
) {
    let mut rng = Rng::new(seed ^ (id + 101).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut session: Option<baton_client::Session> = None;
    while !stop.load(Ordering::Relaxed) {
        let s = match &session {
            Some(s) if s.state().health != baton_client::Health::Ended => s.clone(),
            _ => {
                let opened = match Client::connect(&url).await {
                    Ok(c) => {
                        c.with_rpc_timeout(Duration::from_secs(2))
                            .open_session(TTL)
                            .await
                    }
                    Err(e) => Err(e),
                };
                match opened {
                    Ok(s) => {
                        counts.lock().unwrap().opened += 1;
                        session.insert(s).clone()
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                }
            }
        };
        let resource = rng.below(RESOURCES as u64) as usize;
        let name = format!("crash:{resource}");
        let wait = if rng.below(2) == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(150)
        };
        let sent = Instant::now();
        match s.acquire(&name, wait).await {
            Ok(Acquired::Granted(lease)) => {
                let received = Instant::now();
                let abandoned = rng.below(3) == 0;
                history.lock().unwrap().push(Grant {
                    resource,
                    token: lease.token.get(),
                    sent,
                    received,
                    abandoned,
                    on_session: true,
                });
                if abandoned {
                    // As a crashed process: the session (and the lease) end
                    // one TTL after the last heartbeat, which is no earlier
                    // than this acquire (an acquire is a heartbeat).
                    s.abandon();
                    counts.lock().unwrap().abandoned += 1;
                    session = None;
                } else {
                    tokio::time::sleep(Duration::from_millis(rng.below(10))).await;
                    if !release_on(&s, &name, &lease, sent, &counts).await {
                        // Its release was never answered: the lease may still
                        // be held, tied to a session this worker keeps alive.
                        // Give it up as a crashed process would, or the three
                        // resources end up held by the workers' own sessions.
                        s.abandon();
                        counts.lock().unwrap().abandoned += 1;
                        session = None;
                    }
                }
            }
            Ok(Acquired::NotAcquired(_)) => {}
            Err(baton_client::ClientError::SessionEnded) => {
                counts.lock().unwrap().ended += 1;
                session = None;
            }
            Err(_) => {}
        }
    }
    if let Some(s) = session {
        let beats = s.state().beats;
        counts.lock().unwrap().beats += beats;
    }
}

/// Releases a session's lease, asking again while the answer is lost (the
/// server killed under the call); `false` if no answer came.
async fn release_on(
    s: &baton_client::Session,
    name: &str,
    lease: &baton_client::Lease,
    sent: Instant,
    counts: &Mutex<SessionCounts>,
) -> bool {
    let mut lost = false;
    for _ in 0..20 {
        match s.release(name, &lease.acquisition_id).await {
            Ok(Release::Released { .. }) => return true,
            Ok(Release::NotHeld) | Err(baton_client::ClientError::SessionEnded) => {
                // Only if an earlier release applied and its answer was lost,
                // or the session went a TTL without a heartbeat reaching the
                // server (a slow restart), after `sent`.
                assert!(
                    lost || sent.elapsed() >= TTL,
                    "lease {} lost before its TTL",
                    lease.token
                );
                counts.lock().unwrap().ended += 1;
                return true;
            }
            Err(_) => {
                lost = true;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    false
}

#[derive(Debug, Default)]
struct SessionCounts {
    opened: u64,
    abandoned: u64,
    ended: u64,
    beats: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_ordered_and_exclusive_across_sigkill() {
    let kills: usize = std::env::var("BATON_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let seed = seed();
    println!("crash test seed {seed} (rerun with BATON_CRASH_SEED={seed}), kills {kills}");
    let dir = TempDir::new("crash");
    let server = common::serve(dir.path(), &[]);
    let url = server.url();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let counts = Arc::new(Mutex::new(SessionCounts::default()));
    let mut workers: Vec<_> = (0..3)
        .map(|id| tokio::spawn(worker(url.clone(), id, seed, stop.clone(), history.clone())))
        .collect();
    workers.extend((0..3).map(|id| {
        tokio::spawn(session_worker(
            url.clone(),
            id,
            seed,
            stop.clone(),
            history.clone(),
            counts.clone(),
        ))
    }));
    let granted = history.clone();
    let killer = tokio::task::spawn_blocking(move || {
        let mut server = server;
        let mut rng = Rng::new(seed);
        let mut to_first_grant = Vec::with_capacity(kills);
        for _ in 0..kills {
            // Each incarnation grants something before it is killed (on a
            // loaded machine a restart can take most of the interval), so
            // that every kill has grants on both sides of it.
            let (before, started) = (granted.lock().unwrap().len(), Instant::now());
            std::thread::sleep(Duration::from_millis(150 + rng.below(250)));
            // Bounded, so that 50 kills stay well inside the test's time.
            let deadline = Instant::now() + Duration::from_secs(2);
            while granted.lock().unwrap().len() == before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            to_first_grant.push(started.elapsed());
            server.restart();
        }
        to_first_grant.sort();
        println!(
            "incarnations: median {:?}, slowest {:?} from a restart to its first grant (or 2 s)",
            to_first_grant[kills / 2],
            to_first_grant[kills - 1]
        );
        server
    });
    let server = killer.await.unwrap();
    // The last incarnation serves until a session has abandoned a lease
    // and someone was granted its resource after it: under load the kills
    // can leave no time for either, and the checks below need both.
    common::eventually(Duration::from_secs(30), async || {
        let history = history.lock().unwrap();
        history.iter().any(|a| {
            a.abandoned
                && a.on_session
                && history
                    .iter()
                    .any(|b| b.resource == a.resource && b.sent > a.received)
        })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    drop(server);

    let history = history.lock().unwrap().clone();
    // The fault suite's checker: no token twice, tokens in real-time
    // order, and a lease left to expire (its holder killed or abandoned)
    // held for a full TTL from the request that granted it.
    let grants: Vec<baton_faults::grants::Grant> = history
        .iter()
        .map(|g| baton_faults::grants::Grant {
            resource: g.resource.to_string(),
            token: g.token,
            invoked: g.sent,
            answered: g.received,
            earliest_end: g.abandoned.then(|| g.sent + TTL),
        })
        .collect();
    let verdict = baton_faults::grants::check(&grants);
    assert!(verdict.is_safe(), "unsafe grant history: {verdict:?}");
    let checked_abandoned = verdict.exclusion_checked;
    let counts = counts.lock().unwrap();
    let on_sessions = history.iter().filter(|g| g.on_session).count();
    println!(
        "crash test: {kills} SIGKILLs, {} grants ({on_sessions} on sessions), {checked_abandoned} abandoned leases checked for exclusion; sessions: {counts:?}",
        history.len()
    );
    assert!(
        counts.abandoned > 0,
        "no session was abandoned holding a lease"
    );
    assert!(
        history.len() >= kills,
        "too few grants ({}) to prove anything",
        history.len()
    );
    assert!(
        checked_abandoned > 0,
        "no abandoned lease was followed by another grant"
    );
}
