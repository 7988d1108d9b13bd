//! Three `baton serve` processes on one PostgreSQL database: leader kills,
//! a paused leader, PostgreSQL restarts and a database failover, with
//! every answer recorded and checked.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Acquired, AcquiredAll, Client, ClientError, Release, Renewal};
use baton_faults::grants::Grant;
use baton_systest as common;
use baton_testkit::pg_cluster::PgCluster;
use baton_testkit::{eventually, PgDb, TempDir};
use common::Cluster;

async fn client(endpoints: &str) -> Client {
    Client::connect(endpoints)
        .await
        .expect("connect")
        .with_rpc_timeout(Duration::from_secs(5))
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    refused: u64,
    definite_errors: u64,
    unknown: u64,
}

#[derive(Default)]
struct History {
    grants: Vec<Grant>,
    acquires: Tally,
    renewals: Tally,
    releases: Tally,
}

impl History {
    fn count<T>(t: &mut Tally, r: &Result<T, ClientError>, refused: impl Fn(&T) -> bool) {
        match r {
            Ok(v) if refused(v) => t.refused += 1,
            Ok(_) => t.ok += 1,
            Err(e) if e.is_definite() => t.definite_errors += 1,
            Err(_) => t.unknown += 1,
        }
    }

    /// The lease service's three promises, over every grant, by the fault
    /// suite's checker (`baton_faults::grants`).
    fn check(&self) {
        let verdict = baton_faults::grants::check(&self.grants);
        assert!(verdict.is_safe(), "unsafe grant history: {verdict:?}");
    }
}

/// A worker: acquire one of `resources` (waiting briefly), renew once,
/// release; every answer recorded.
async fn worker(
    endpoints: String,
    resources: Vec<String>,
    seed: u64,
    history: Arc<Mutex<History>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let ttl = Duration::from_millis(1_500);
    let mut client = client(&endpoints).await;
    let mut rng = baton_client::rng::Rng::new(seed);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let resource = &resources[rng.below(resources.len() as u64) as usize];
        let invoked = Instant::now();
        let r = client
            .acquire(resource, Some(ttl), Duration::from_millis(300))
            .await;
        let answered = Instant::now();
        History::count(&mut history.lock().unwrap().acquires, &r, |a| {
            matches!(a, Acquired::NotAcquired(_))
        });
        let lease = match r {
            Ok(Acquired::Granted(lease)) => lease,
            Ok(Acquired::NotAcquired(_)) => continue,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let mut confirmed = invoked;
        tokio::time::sleep(Duration::from_millis(10 + rng.below(20))).await;
        let sent = Instant::now();
        let renewed = client.renew(resource, &lease.acquisition_id).await;
        History::count(&mut history.lock().unwrap().renewals, &renewed, |r| {
            matches!(r, Renewal::NotOwner)
        });
        if let Ok(Renewal::Renewed { token, .. }) = renewed {
            assert_eq!(token, lease.token, "a renewal keeps the token");
            confirmed = sent;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
        let release_sent = Instant::now();
        let released = client.release(resource, &lease.acquisition_id).await;
        History::count(&mut history.lock().unwrap().releases, &released, |r| {
            matches!(r, Release::NotHeld)
        });
        let end = (confirmed + ttl).min(release_sent);
        history.lock().unwrap().grants.push(Grant {
            resource: resource.clone(),
            token: lease.token.get(),
            invoked,
            answered,
            earliest_end: Some(end),
        });
    }
}

struct Load {
    history: Arc<Mutex<History>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(endpoints: &str, prefix: &str, n_workers: u64, n_resources: usize) -> Self {
        let history = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let resources: Vec<String> = (0..n_resources).map(|i| format!("{prefix}:r{i}")).collect();
        let tasks = (0..n_workers)
            .map(|i| {
                tokio::spawn(worker(
                    endpoints.to_string(),
                    resources.clone(),
                    0xba70 + i,
                    history.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        Self {
            history,
            stop,
            tasks,
        }
    }

    fn n_grants(&self) -> usize {
        self.history.lock().unwrap().grants.len()
    }

    async fn finish(self) -> History {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("worker");
        }
        Arc::try_unwrap(self.history)
            .ok()
            .expect("workers done")
            .into_inner()
            .unwrap()
    }
}

/// Acquires `resource` try-once until granted; the time it took.
async fn first_grant(client: &mut Client, resource: &str) -> Duration {
    let started = Instant::now();
    loop {
        if let Ok(Acquired::Granted(_)) = client
            .acquire(resource, Some(Duration::from_secs(1)), Duration::ZERO)
            .await
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no grant within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Kill the leader with SIGKILL again and again under load; every answer
/// is checked. BATON_CLUSTER_KILLS sets the count (default 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_kills_lose_no_grant_and_never_reuse_or_lower_a_token() {
    let kills: usize = std::env::var("BATON_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let db = PgDb::create("cluster_kills").await;
    let mut cluster = Cluster::start(&db.url, 3);
    cluster.wait_leader(None).await;
    let load = Load::start(&cluster.endpoints(), "kill", 8, 4);
    let mut probe = client(&cluster.endpoints()).await;
    let mut failovers = Vec::new();
    for k in 0..kills {
        let leader = cluster.wait_leader(None).await;
        // Some load on this leader before it dies.
        let before = load.n_grants();
        eventually(Duration::from_secs(30), async || {
            load.n_grants() >= before + 5
        })
        .await;
        let killed = Instant::now();
        cluster.nodes[leader].kill9();
        first_grant(&mut probe, &format!("kill:probe{k}")).await;
        failovers.push(killed.elapsed());
        cluster.nodes[leader].restart();
    }
    let history = load.finish().await;
    eprintln!(
        "leader kills: {kills}; failover (kill to first grant) median {:?} max {:?}; grants {}; acquires {:?}; renewals {:?}; releases {:?}",
        median(failovers.clone()),
        failovers.iter().max().unwrap(),
        history.grants.len(),
        history.acquires,
        history.renewals,
        history.releases,
    );
    assert!(
        history.grants.len() > kills * 5,
        "the load made progress across the kills"
    );
    history.check();
}

/// A 30 s lease is renewed through a failover with its token, and nobody
/// else gets the resource meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_is_renewed_through_a_failover_and_keeps_its_token() {
    let db = PgDb::create("cluster_held").await;
    let mut cluster = Cluster::start(&db.url, 3);
    let leader = cluster.wait_leader(None).await;
    let description = baton_client::baton_core::Holder::parse("worker 1 @ host-a").unwrap();
    let mut holder = client(&cluster.endpoints())
        .await
        .with_holder(description.clone());
    let Acquired::Granted(lease) = holder
        .acquire("held:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free resource not granted")
    };
    cluster.nodes[leader].kill9();
    let mut rival = client(&cluster.endpoints()).await;
    let mut renew_failures = 0;
    let mut rival_refusals = 0;
    loop {
        if let Ok(Acquired::Granted(l)) = rival
            .acquire("held:r", Some(Duration::from_secs(1)), Duration::ZERO)
            .await
        {
            panic!(
                "held:r was granted to another holder (token {}) during the failover",
                l.token
            );
        }
        rival_refusals += 1;
        match holder.renew("held:r", &lease.acquisition_id).await {
            Ok(Renewal::Renewed { token, .. }) => {
                assert_eq!(token, lease.token);
                break;
            }
            Ok(Renewal::NotOwner) => panic!("the lease was lost in the failover"),
            Err(_) => renew_failures += 1,
        }
    }
    let new_leader = cluster.wait_leader(Some(leader)).await;
    assert_ne!(new_leader, leader);
    let status = holder.status("held:r").await.unwrap();
    assert_eq!(status.holder_token, Some(lease.token));
    // The description is in the cluster's store: the new leader has it.
    assert_eq!(status.holder.as_deref(), Some(description.as_str()));
    eprintln!("renewal failures during the failover: {renew_failures}; rival attempts refused: {rival_refusals}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_on_the_new_leader_with_its_leases() {
    let db = PgDb::create("cluster_session").await;
    let mut cluster = Cluster::start(&db.url, 3);
    let leader = cluster.wait_leader(None).await;
    let holder = client(&cluster.endpoints()).await;
    let session = holder.open_session(Duration::from_secs(10)).await.unwrap();
    let AcquiredAll::Granted { leases, .. } = session
        .acquire_all(&["sess:a", "sess:b"], Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free resources not granted")
    };
    let mut state = session.watch();
    cluster.nodes[leader].kill9();
    let mut rival = client(&cluster.endpoints()).await;
    let mut saw_reconnecting = false;
    let mut rival_refusals = 0;
    loop {
        let health = state.borrow_and_update().health;
        assert_ne!(
            health,
            baton_client::Health::Ended,
            "the session was lost in the failover"
        );
        saw_reconnecting |= health == baton_client::Health::Reconnecting;
        if saw_reconnecting && health == baton_client::Health::Live {
            break;
        }
        if let Ok(Acquired::Granted(l)) = rival
            .acquire("sess:a", Some(Duration::from_secs(1)), Duration::ZERO)
            .await
        {
            panic!(
                "sess:a was granted to another holder (token {}) during the failover",
                l.token
            );
        }
        rival_refusals += 1;
        let _ = tokio::time::timeout(Duration::from_millis(200), state.changed()).await;
    }
    let new_leader = cluster.wait_leader(Some(leader)).await;
    assert_ne!(new_leader, leader);
    let beats = session.state().beats;
    eventually(Duration::from_secs(10), async || {
        session.state().beats > beats + 1
    })
    .await;
    for l in &leases {
        let status = rival.status(&l.resource).await.unwrap();
        assert_eq!(
            status.holder_token,
            Some(l.token),
            "{} kept its token",
            l.resource
        );
    }
    assert!(session.close().await.unwrap());
    for l in &leases {
        assert_eq!(rival.status(&l.resource).await.unwrap().holder_token, None);
    }
    eprintln!("session resumed on the new leader; rival attempts refused: {rival_refusals}");
}

/// A session on a leader that is stopped (SIGSTOP), not killed: its TCP
/// connection stands but heartbeats go unanswered. The client notices,
/// resumes on the new leader, and keeps its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_a_paused_leader_resumes_on_the_next_one() {
    use nix::sys::signal::{kill, Signal::SIGCONT, Signal::SIGSTOP};
    use nix::unistd::Pid;
    let db = PgDb::create("cluster_session_pause").await;
    let cluster = Cluster::start(&db.url, 3);
    let old = cluster.wait_leader(None).await;
    let holder = client(&cluster.endpoints()).await;
    let session = holder.open_session(Duration::from_secs(6)).await.unwrap();
    let Acquired::Granted(lease) = session.acquire("sess:p", Duration::ZERO).await.unwrap() else {
        panic!("free resource not granted")
    };
    let mut state = session.watch();
    let pid = Pid::from_raw(cluster.pid(old) as i32);
    kill(pid, SIGSTOP).unwrap();
    let paused = Instant::now();
    let mut saw_reconnecting = false;
    loop {
        let health = state.borrow_and_update().health;
        assert_ne!(health, baton_client::Health::Ended, "the session was lost");
        saw_reconnecting |= health == baton_client::Health::Reconnecting;
        if saw_reconnecting && health == baton_client::Health::Live {
            break;
        }
        assert!(
            paused.elapsed() < Duration::from_secs(30),
            "no resume within 30 s"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), state.changed()).await;
    }
    let resumed_after = paused.elapsed();
    let new = cluster.wait_leader(Some(old)).await;
    let mut observer = client(&cluster.nodes[new].url()).await;
    assert_eq!(
        observer.status("sess:p").await.unwrap().holder_token,
        Some(lease.token),
        "the lease survived the paused leader"
    );
    kill(pid, SIGCONT).unwrap();
    assert!(session.close().await.unwrap());
    eprintln!("session resumed {resumed_after:?} after its leader was stopped");
}

/// A watch on a leader that is stopped past its leadership ends, when it
/// wakes and steps down, with the documented status (UNAVAILABLE: watch
/// again, on the leader); a new watch there starts from a snapshot that
/// has the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_server_stops_leading() {
    use nix::sys::signal::{kill, Signal::SIGCONT, Signal::SIGSTOP};
    use nix::unistd::Pid;
    let db = PgDb::create("cluster_watch").await;
    let cluster = Cluster::start(&db.url, 2);
    let old = cluster.wait_leader(None).await;
    let on_leader = client(&cluster.nodes[old].url()).await;
    let mut watch = on_leader.watch("w:").await.unwrap().once();
    let mut holder = client(&cluster.endpoints()).await;
    let Acquired::Granted(lease) = holder
        .acquire("w:1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let granted = watch.next().await.unwrap().changed().unwrap();
    assert_eq!(granted.token, lease.token);
    let pid = Pid::from_raw(cluster.pid(old) as i32);
    kill(pid, SIGSTOP).unwrap();
    let new = cluster.wait_leader(Some(old)).await;
    kill(pid, SIGCONT).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect("the watch ends once the old leader steps down");
    let Err(ClientError::WatchEnded(why)) = ended else {
        panic!("{ended:?}")
    };
    assert!(
        why.contains("stopped leading") && why.contains("on the leader"),
        "{why}"
    );
    let again = client(&cluster.nodes[new].url())
        .await
        .watch("w:")
        .await
        .unwrap();
    assert_eq!(
        again.holders.iter().map(|h| h.token).collect::<Vec<_>>(),
        vec![lease.token]
    );
    eprintln!("watch on the stopped leader ended: {why}");
}

/// A leader stopped past its leadership (SIGSTOP) and cut off from the
/// database wakes to find another in its place: it confirms no renewal it
/// would answer from memory, commits nothing, and steps down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_confirms_nothing_commits_nothing_and_steps_down() {
    use baton_faults::{Direction, Proxy};
    use nix::sys::signal::{kill, Signal::SIGCONT, Signal::SIGSTOP};
    use nix::unistd::Pid;
    let db = PgDb::create("cluster_pause").await;
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(Proxy::start(db.upstream()).await.unwrap());
    }
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| db.url_via(p.addr().port()))
        .collect();
    let cluster = Cluster::start_each(&urls);
    let old = cluster.wait_leader(None).await;
    let old_pid = cluster.pid(old);
    let mut a = client(&cluster.endpoints()).await;
    let Acquired::Granted(lease_a) = a
        .acquire("pause:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    // A connection straight to the old leader, made before it is stopped.
    let mut direct =
        baton_proto::v1::leases_client::LeasesClient::connect(cluster.nodes[old].url())
            .await
            .unwrap();
    let commits_before = cluster.nodes[old].metric("baton_store_commits_total");
    let pid = Pid::from_raw(old_pid as i32);
    kill(pid, SIGSTOP).unwrap();
    eventually(Duration::from_secs(5), async || {
        baton_testkit::stopped(old_pid)
    })
    .await;
    // Its database connections stall too: on waking it cannot learn from
    // the database that it lost; only its own deadline stops it.
    proxies[old].hold(Direction::ClientToServer);
    proxies[old].hold(Direction::ServerToClient);
    let new = cluster.wait_leader(Some(old)).await;
    // On the new leader an operator fences A's lease (still valid in the
    // stopped leader's memory) and B gets the resource with a higher token.
    // B talks to the new leader only: a follower that has not yet read the
    // takeover would still name the stopped leader, and a call there waits
    // out its timeout.
    let mut b = client(&cluster.nodes[new].url()).await;
    let fenced = b.fence("pause:r").await.unwrap();
    assert_eq!(fenced.revoked, Some(lease_a.token));
    let Acquired::Granted(lease_b) = b
        .acquire("pause:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("B waited in vain")
    };
    assert!(lease_b.token > lease_a.token);
    // A's renewal reaches the stopped old leader and waits in its socket.
    let renewal = tokio::spawn(async move {
        direct
            .renew(baton_proto::v1::RenewRequest {
                resource: "pause:r".into(),
                acquisition_id: lease_a.acquisition_id.as_bytes().to_vec(),
            })
            .await
    });
    kill(pid, SIGCONT).unwrap();
    let answer = renewal.await.unwrap();
    match &answer {
        Ok(r) => assert!(
            !r.get_ref().renewed,
            "the woken old leader confirmed a renewal of a lease that moved on"
        ),
        Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
    }
    proxies[old].release(Direction::ClientToServer);
    proxies[old].release(Direction::ServerToClient);
    eventually(Duration::from_secs(10), async || {
        cluster.nodes[old]
            .http_get("/healthz")
            .contains("ok follower")
    })
    .await;
    assert_eq!(
        cluster.nodes[old].metric("baton_store_commits_total"),
        commits_before,
        "the woken old leader committed something"
    );
    assert_eq!(cluster.nodes[old].metric("baton_is_leader"), 0);
    // B's lease is intact in the database and on the leader.
    let token: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT token FROM baton_server.leases WHERE resource = 'pause:r'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(token as u64, lease_b.token.get());
    assert_eq!(cluster.leader(None), Some(new));
    let status = b.status("pause:r").await.unwrap();
    assert_eq!(status.holder_token, Some(lease_b.token));
    eprintln!("old leader's answer after waking: {answer:?}");
}

/// PostgreSQL restarted under load, fast and immediate: the servers come
/// back by themselves, no acknowledged grant is lost, no token goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarts_under_load_lose_nothing_and_need_no_restart() {
    let pg = PgCluster::start("cluster_pg_restart");
    pg.psql("CREATE DATABASE baton");
    let url = pg.url().replace("dbname=postgres", "dbname=baton");
    let cluster = Cluster::start(&url, 2);
    cluster.wait_leader(None).await;
    let mut holder = client(&cluster.endpoints()).await;
    let Acquired::Granted(held) = holder
        .acquire(
            "restart:held",
            Some(Duration::from_secs(60)),
            Duration::ZERO,
        )
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    let load = Load::start(&cluster.endpoints(), "restart", 6, 3);
    let mut probe = client(&cluster.endpoints()).await;
    let mut outages = Vec::new();
    for (i, mode) in ["fast", "immediate", "fast", "immediate"]
        .iter()
        .enumerate()
    {
        let before = load.n_grants();
        eventually(Duration::from_secs(30), async || {
            load.n_grants() >= before + 10
        })
        .await;
        let started = Instant::now();
        pg.ctl(&["restart", "-m", mode]);
        first_grant(&mut probe, &format!("restart:probe{i}")).await;
        outages.push((mode, started.elapsed()));
        let status = holder.status("restart:held").await.unwrap();
        assert_eq!(
            status.holder_token,
            Some(held.token),
            "after a {mode} restart"
        );
        let renewed = holder.renew("restart:held", &held.acquisition_id).await;
        assert!(
            matches!(renewed, Ok(Renewal::Renewed { token, .. }) if token == held.token),
            "{renewed:?}"
        );
    }
    let history = load.finish().await;
    eprintln!(
        "PostgreSQL restarts: {outages:?} (restart to first grant); grants {}; acquires {:?}; renewals {:?}; releases {:?}",
        history.grants.len(),
        history.acquires,
        history.renewals,
        history.releases
    );
    history.check();
}

/// The primary killed under load, its synchronous standby promoted; Baton
/// follows through a multi-host connection string. Every acknowledged
/// grant is there, and tokens continue above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_failover_to_a_synchronous_standby_keeps_every_grant() {
    let primary = PgCluster::start("cluster_primary");
    primary.psql("CREATE DATABASE baton");
    let standby = primary.synchronous_standby("cluster_standby");
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=baton target_session_attrs=read-write connect_timeout=2",
        primary.port(),
        standby.port()
    );
    let cluster = Cluster::start(&url, 2);
    cluster.wait_leader(None).await;
    let mut holder = client(&cluster.endpoints()).await;
    let mut held = Vec::new();
    for i in 0..20 {
        match holder
            .acquire(
                &format!("dbfail:held{i}"),
                Some(Duration::from_secs(60)),
                Duration::ZERO,
            )
            .await
            .unwrap()
        {
            Acquired::Granted(l) => held.push(l),
            other => panic!("{other:?}"),
        }
    }
    let load = Load::start(&cluster.endpoints(), "dbfail", 6, 3);
    let before = load.n_grants();
    eventually(Duration::from_secs(30), async || {
        load.n_grants() >= before + 20
    })
    .await;
    let started = Instant::now();
    primary.ctl(&["stop", "-m", "immediate"]);
    standby.ctl(&["promote"]);
    let mut probe = client(&cluster.endpoints()).await;
    first_grant(&mut probe, "dbfail:probe").await;
    let failover = started.elapsed();
    let before = load.n_grants();
    eventually(Duration::from_secs(30), async || {
        load.n_grants() >= before + 20
    })
    .await;
    let history = load.finish().await;
    let highest_before = held.iter().map(|l| l.token).max().unwrap();
    for l in &held {
        let status = holder.status(&l.resource).await.unwrap();
        assert_eq!(
            status.holder_token,
            Some(l.token),
            "{} after the failover",
            l.resource
        );
    }
    let Acquired::Granted(after) = holder
        .acquire("dbfail:after", Some(Duration::from_secs(5)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    assert!(after.token > highest_before);
    let highest_in_load = history.grants.iter().map(|g| g.token).max().unwrap();
    assert!(after.token.get() > highest_in_load);
    eprintln!(
        "database failover: primary killed to first grant {failover:?}; grants {}; acquires {:?}",
        history.grants.len(),
        history.acquires
    );
    history.check();
}

/// A restore onto a running cluster: the leader's term ends, the next
/// leader serves the new epoch above every earlier token, the dropped
/// lease is gone, and the store refuses a second cluster's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_onto_a_running_cluster_starts_above_every_token() {
    let db = PgDb::create("cluster_restore").await;
    let cluster = Cluster::start(&db.url, 2);
    let old = cluster.wait_leader(None).await;
    let mut c = client(&cluster.endpoints()).await;
    let Acquired::Granted(before) = c
        .acquire("restore:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    let backup = TempDir::new("cluster_backup");
    let backup_file = backup.path().join("b.pb");
    let out = common::cli(&[
        "admin",
        "backup",
        "--server",
        &cluster.endpoints(),
        "--out",
        backup_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let wrong = common::cli(&[
        "admin",
        "restore",
        "--store",
        &db.url,
        "--cluster",
        "other",
        "--empty",
    ]);
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("belongs to cluster \"baton\""));
    let out = common::cli(&[
        "admin",
        "restore",
        "--store",
        &db.url,
        "--from",
        backup_file.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let first = common::json_u64(&text, "first_token").unwrap();
    assert!(first > before.token.get(), "{text}");
    // The old leader's term is over: it steps down, and a leader of the
    // new term serves the new epoch.
    eventually(
        Duration::from_secs(20),
        async || matches!(c.status("restore:r").await, Ok(s) if s.holder_token.is_none()),
    )
    .await;
    let Acquired::Granted(after) = c
        .acquire("restore:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted after the restore")
    };
    assert!(after.token.get() >= first, "{} < {first}", after.token);
    assert!(matches!(
        c.renew("restore:r", &before.acquisition_id).await,
        Ok(Renewal::NotOwner)
    ));
    let leader = cluster.wait_leader(None).await;
    eprintln!(
        "restore: leader before {old}, after {leader}; tokens {} -> {}",
        before.token, after.token
    );
}

/// A server refuses to start on a malformed store address, on another
/// cluster's database, and without an address to advertise; each message
/// names the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_store_address_or_another_clusters_database_refuses_to_start() {
    let refused = |args: &[&str], needle: &str| {
        let mut all = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ];
        all.extend_from_slice(args);
        let out = common::cli(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(
        &["--store", "mysql://db/x", "--advertise", "http://a:1"],
        "not a PostgreSQL connection string",
    );
    refused(
        &["--store", "host=127.0.0.1 dbname=x"],
        "--advertise is required",
    );
    let db = PgDb::create("cluster_refuse").await;
    let cluster = Cluster::start(&db.url, 1);
    cluster.wait_leader(None).await;
    refused(
        &[
            "--store",
            &db.url,
            "--cluster",
            "other",
            "--advertise",
            "http://a:1",
        ],
        "belongs to cluster \"baton\"",
    );
    refused(
        &[
            "--store",
            &db.url,
            "--cluster",
            "Bad Name",
            "--advertise",
            "http://a:1",
        ],
        "cluster name",
    );
    refused(
        &["--store", &db.url, "--advertise", "ftp://a:1"],
        "advertise address",
    );
    refused(
        &[
            "--store",
            &format!("{} sslmode=verify", db.url),
            "--advertise",
            "http://a:1",
        ],
        "sslmode \"verify\" is not one of disable, prefer, require, verify-ca, verify-full",
    );
    refused(
        &[
            "--store",
            &format!(
                "{} sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
                db.url
            ),
            "--advertise",
            "http://a:1",
        ],
        "sslrootcert /nonexistent/ca.pem: cannot read it",
    );
    let no_such_db = db
        .url
        .replace(&format!("dbname={}", db.name), "dbname=baton_no_such_db");
    refused(
        &["--store", &no_such_db, "--advertise", "http://a:1"],
        "refused the connection",
    );
}

/// A server started while its database is down starts as a follower that
/// says why, creates the schema once the database is up, and leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_before_its_database_leads_once_it_is_up() {
    let pg = PgCluster::start("cluster_late_db");
    pg.psql("CREATE DATABASE baton");
    let url = pg.url().replace("dbname=postgres", "dbname=baton");
    pg.ctl(&["stop", "-m", "fast"]);
    let cluster = Cluster::start(&url, 1);
    let mut c = client(&cluster.endpoints()).await;
    let e = c
        .acquire("late:r", Some(Duration::from_secs(5)), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(e.is_definite(), "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    pg.start_again();
    cluster.wait_leader(None).await;
    assert!(matches!(
        c.acquire("late:r", Some(Duration::from_secs(5)), Duration::ZERO)
            .await,
        Ok(Acquired::Granted(_))
    ));
}

/// The database loses acknowledged commits (as when an asynchronous standby
/// is promoted): servers that saw the higher token position refuse to lead
/// rather than issue tokens again, say why, and serve again after a
/// restore starts a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_commits_is_refused_until_a_restore() {
    let db = PgDb::create("cluster_rollback").await;
    let mut cluster = Cluster::start(&db.url, 3);
    let leader = cluster.wait_leader(None).await;
    let mut c = client(&cluster.endpoints()).await;
    let Acquired::Granted(lease) = c
        .acquire("rollback:r", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    // Every server has read the position since the grant: two reports by
    // each after it.
    let pg = db.connect().await;
    for _ in 0..2 {
        let since: std::time::SystemTime = pg.query_one("SELECT now()", &[]).await.unwrap().get(0);
        eventually(Duration::from_secs(10), async || {
            let n: i64 = pg
                .query_one(
                    "SELECT count(*) FROM baton_server.members WHERE seen_at > $1",
                    &[&since],
                )
                .await
                .unwrap()
                .get(0);
            n == 3
        })
        .await;
    }
    // The database forgets the grant.
    pg.batch_execute(
        "UPDATE baton_server.meta SET counter = counter - 1; DELETE FROM baton_server.leases",
    )
    .await
    .unwrap();
    cluster.nodes[leader].kill9();
    let live: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| cluster.nodes[i].url())
        .collect();
    let mut other = client(&live.join(",")).await;
    let mut refusal = String::new();
    eventually(Duration::from_secs(20), async || {
        match other
            .acquire("rollback:r", Some(Duration::from_secs(30)), Duration::ZERO)
            .await
        {
            Ok(Acquired::Granted(l)) => {
                panic!("granted token {} from a store that lost commits", l.token)
            }
            Ok(Acquired::NotAcquired(n)) => {
                panic!("answered from a store that lost commits: {n:?}")
            }
            Err(e) => {
                refusal = e.to_string();
                refusal.contains("lost acknowledged commits")
            }
        }
    })
    .await;
    let out = common::cli(&["admin", "restore", "--store", &db.url, "--empty"]);
    assert!(out.status.success(), "{out:?}");
    let mut after = None;
    eventually(Duration::from_secs(20), async || {
        if let Ok(Acquired::Granted(l)) = other
            .acquire("rollback:r", Some(Duration::from_secs(30)), Duration::ZERO)
            .await
        {
            after = Some(l);
        }
        after.is_some()
    })
    .await;
    let after = after.unwrap();
    assert!(after.token > lease.token);
    cluster.nodes[leader].restart();
    eprintln!(
        "refused with: {refusal}; after the restore: token {} > {}",
        after.token, lease.token
    );
}

/// The cluster store over TLS: a PostgreSQL with `ssl = on` and a test
/// CA's certificate; a server given `sslmode=verify-full` and the CA leads
/// and grants; one given another CA refuses to start, naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_on_postgresql_over_verified_tls_leads_and_grants() {
    let certs = TempDir::new("cluster-tls-certs");
    let ca = baton_testkit::pki::Ca::new(certs.path(), "pg-ca");
    let other = baton_testkit::pki::Ca::new(certs.path(), "other-ca");
    let server_cert = ca.server("pg-server", false);
    let pg = PgCluster::start("cluster_tls");
    pg.enable_tls(&server_cert.cert, &server_cert.key);
    pg.psql("CREATE DATABASE baton");
    let store = |root: &std::path::Path| {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=baton sslmode=verify-full sslrootcert={}",
            pg.port(),
            root.display()
        )
    };
    let cluster = Cluster::start(&store(&ca.cert), 1);
    let leader = cluster.wait_leader(None).await;
    let mut c = Client::connect(&cluster.nodes[leader].url()).await.unwrap();
    let granted = c
        .acquire("tls:1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap();
    assert!(matches!(granted, Acquired::Granted(_)), "{granted:?}");
    let encrypted = pg.psql("SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND datname = 'baton'");
    assert!(
        encrypted.parse::<u32>().unwrap() >= 1,
        "the store's connections are TLS: {encrypted}"
    );

    // Another CA: a setting to fix, so the server refuses to start and
    // says why, in one line.
    let out = common::cli(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--advertise",
        "http://127.0.0.1:1",
        "--store",
        &store(&other.cert),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("invalid peer certificate") && stderr.contains("UnknownIssuer"),
        "names the cause: {stderr}"
    );
}

/// A role that reads and writes the schema but does not own its tables
/// (the schema was created by another) leads and grants; its leader
/// cannot vacuum the lease table and says so in the log, once a term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_role_does_not_own_the_tables_grants_and_says_it_cannot_vacuum() {
    let db = PgDb::create("cluster_not_owner").await;
    // The schema, created by its owner's server.
    let owner = Cluster::start(&db.url, 1);
    owner.wait_leader(None).await;
    drop(owner);
    let admin = db.connect().await;
    let role = format!("{}_dml", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA baton_server TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA baton_server TO {role}"
        ))
        .await
        .unwrap();
    let dir = TempDir::new("cluster-not-owner");
    let log = dir.path().join("server.log");
    let url = format!("{} user={role}", db.url);
    let mut s = common::Server::start_logged(
        &common::BIN,
        dir.path(),
        &[
            "--store",
            &url,
            "--advertise",
            "http://127.0.0.1:1",
            "--leader-ttl",
            common::cluster::LEADER_TTL,
        ],
        &log,
    );
    let c = client(&s.url()).await;
    eventually(Duration::from_secs(20), async || {
        matches!(
            c.clone()
                .acquire("owner:1", Some(Duration::from_secs(30)), Duration::ZERO)
                .await,
            Ok(Acquired::Granted(_))
        )
    })
    .await;
    let count = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    let said = || count("does not own these tables");
    eventually(Duration::from_secs(10), async || said() > 0).await;
    s.kill9();
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .unwrap();
    // At most once a term: a busy machine can make a load outlast the
    // term's deadline, and the member then leads again in a new term.
    assert!(
        said() <= count("won leadership"),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}
