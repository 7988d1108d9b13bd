//! Sessions against a real server process: leases kept by one heartbeat,
//! expiry of everything at once, resume across a SIGKILL and restart,
//! waiters withdrawn when their stream breaks, a fenced lease reported
//! until released, and `baton hold`. The stream's protocol (answers by id,
//! refusals, limits, half-close) is tested in process, in
//! `crates/server/tests/it/session_stream.rs`.

use std::time::{Duration, Instant};

use baton_client::worker::{Keeper, KeeperConfig, Ownership};
use baton_client::{Acquired, AcquiredAll, Client, ClientError, Health};
use baton_systest as common;
use common::{eventually, TempDir};

const TTL: Duration = Duration::from_millis(300);

fn granted(a: Acquired) -> baton_client::Lease {
    match a {
        Acquired::Granted(l) => l,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_every_bound_lease_and_silence_ends_them_all() {
    let dir = TempDir::new("session-life");
    let s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let session = client.open_session(TTL).await.unwrap();
    let AcquiredAll::Granted { leases, .. } = session
        .acquire_all(&["s:a", "s:b", "s:c"], Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free resources must be granted")
    };
    assert!(
        leases.iter().all(|l| l.ttl == TTL),
        "bound leases carry the session TTL"
    );
    // Another client queues for one of them; its wait outlives the session.
    let mut other = client.clone();
    let waiting = tokio::spawn(async move {
        let sent = Instant::now();
        let out = other
            .acquire("s:b", Some(Duration::from_secs(5)), Duration::from_secs(10))
            .await
            .unwrap();
        (granted(out), sent.elapsed())
    });
    // Five TTLs pass: the heartbeats alone keep all three leases.
    let started = Instant::now();
    let mut observer = client.clone();
    while started.elapsed() < TTL * 5 {
        for l in &leases {
            let st = observer.status(&l.resource).await.unwrap();
            assert_eq!(
                st.holder_token,
                Some(l.token),
                "{} lost while the session lives",
                l.resource
            );
        }
        tokio::time::sleep(TTL / 4).await;
    }
    let beats = session.state().beats;
    assert!(
        beats >= 10,
        "only {beats} heartbeats acknowledged in five TTLs"
    );
    // Silence, as a crashed process: all three end together one TTL later.
    let silent_from = Instant::now();
    session.abandon();
    let (next, _) = waiting.await.unwrap();
    let held_for = silent_from.elapsed();
    assert!(next.token > leases[1].token);
    assert!(
        held_for + Duration::from_millis(5) >= TTL - TTL / 3,
        "ended {held_for:?} after the last heartbeat"
    );
    for l in [&leases[0], &leases[2]] {
        assert_eq!(
            observer.status(&l.resource).await.unwrap().holder_token,
            None
        );
    }
    println!(
        "session: {beats} heartbeats kept 3 leases for 5 TTLs; ended {held_for:?} after silence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_bound_lease_is_reported_until_it_is_released() {
    let dir = TempDir::new("session-fenced");
    let s = common::serve(dir.path(), &[]);
    let mut client = Client::connect(&s.url()).await.unwrap();
    let session = client.open_session(TTL).await.unwrap();
    let AcquiredAll::Granted { leases, .. } = session
        .acquire_all(&["f:a", "f:b"], Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free resources must be granted")
    };
    let mut state = session.watch();
    for (round, lease) in leases.iter().enumerate() {
        let fenced = client.fence(&lease.resource).await.unwrap();
        assert_eq!(fenced.revoked, Some(lease.token));
        // The next heartbeat reports it; a keeper sees it lost.
        let reported = tokio::time::timeout(
            TTL * 4,
            state.wait_for(|s| s.revoked.iter().any(|r| r.1 == lease.token)),
        )
        .await
        .expect("a heartbeat reports the fence")
        .unwrap()
        .revoked
        .len();
        assert_eq!(reported, 1, "round {round}: only the unreleased fence");
        let keeper = Keeper::start(session.clone(), lease.clone(), KeeperConfig::default());
        tokio::time::timeout(Duration::from_secs(5), keeper.cancellation().cancelled())
            .await
            .expect("the keeper cancels the work of a fenced lease");
        assert_eq!(keeper.ownership(), Ownership::Lost);
        let _ = keeper.stop();
        // Released, it leaves the list at the next heartbeat.
        session
            .release(&lease.resource, &lease.acquisition_id)
            .await
            .unwrap();
        let cleared = tokio::time::timeout(TTL * 4, state.wait_for(|s| s.revoked.is_empty())).await;
        assert!(
            matches!(cleared, Ok(Ok(_))),
            "round {round}: the released fence is still listed after a few heartbeats"
        );
    }
    assert!(session.close().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_after_a_crash_and_restart_with_its_leases() {
    let dir = TempDir::new("session-resume");
    let mut s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let session = client.open_session(Duration::from_secs(3)).await.unwrap();
    let lease = granted(session.acquire("s:resume", Duration::ZERO).await.unwrap());
    let mut keeper = Keeper::start(session.clone(), lease.clone(), KeeperConfig::default());
    let mut watch = session.watch();
    s.kill9();
    s.restart();
    // The driver notices the broken stream, reconnects and resumes. The
    // bound is for a hang, not a speed: a debug server restarting on a
    // loaded machine took more than 5 s once; a resume too late for the
    // session's own 3 s TTL ends it, which the loop below refuses.
    let mut saw_reconnecting = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let health = watch.borrow_and_update().health;
        saw_reconnecting |= health == Health::Reconnecting;
        if saw_reconnecting && health == Health::Live {
            break;
        }
        assert_ne!(health, Health::Ended, "the session must survive a restart");
        assert!(Instant::now() < deadline, "no resume within 20 s");
        let _ = tokio::time::timeout(Duration::from_millis(100), watch.changed()).await;
    }
    let beats = session.state().beats;
    eventually(Duration::from_secs(3), async || {
        session.state().beats > beats
    })
    .await;
    assert_eq!(keeper.ownership(), Ownership::Held);
    let mut c = client.clone();
    assert_eq!(
        c.status("s:resume").await.unwrap().holder_token,
        Some(lease.token),
        "the lease survived the crash"
    );
    // A graceful restart: the server ends the session's stream as it stops
    // (not after its shutdown grace), and the session resumes after it.
    let beats = session.state().beats;
    let stopping = Instant::now();
    assert!(s.terminate().success());
    let stopped_in = stopping.elapsed();
    s.restart();
    eventually(Duration::from_secs(5), async || {
        session.state().beats > beats + 1
    })
    .await;
    assert_eq!(session.state().health, Health::Live);
    assert_eq!(
        c.status("s:resume").await.unwrap().holder_token,
        Some(lease.token),
        "the lease survived the graceful restart"
    );
    println!("a server with a live session stopped in {stopped_in:?}");
    // Still the holder: a release with the same id works.
    assert!(matches!(
        session
            .release(&lease.resource, &lease.acquisition_id)
            .await
            .unwrap(),
        baton_client::Release::Released { .. }
    ));
    // The keeper may still have a change from the restarts to report (a
    // renewal that waited, then held): it lets go at the next one or two.
    let let_go = tokio::time::timeout(Duration::from_secs(5), async {
        while keeper.changed().await != Ownership::Lost {}
    })
    .await;
    assert!(let_go.is_ok(), "released: the keeper lets go");
}

/// A keeper over a session learns every acknowledged heartbeat, a
/// resume's among them, however its renewals fall between them: a server
/// restarted just before a heartbeat is due costs no lease. (A keeper that
/// waited for the next heartbeat after each renewal missed the one just
/// before its renewal and the resume's answer, and gave the lease up at a
/// restart the session survived: `baton hold` during a rolling upgrade.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_over_a_session_keeps_its_lease_through_a_restart_before_a_heartbeat() {
    let dir = TempDir::new("session-keeper-restart");
    let mut s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let session = client.open_session(ttl).await.unwrap();
    let lease = granted(session.acquire("s:kept", Duration::ZERO).await.unwrap());
    let mut state = session.watch();
    state.wait_for(|s| s.beats >= 1).await.unwrap();
    // Started after the first heartbeat was acknowledged, the keeper's
    // first renewal comes after it too.
    let keeper = Keeper::start(session.clone(), lease.clone(), KeeperConfig::default());
    // The restart goes just before the second heartbeat (a third of the
    // TTL after the first): the phase, not a wait for an event.
    tokio::time::sleep(ttl / 3 - Duration::from_millis(150)).await;
    assert!(s.terminate().success());
    s.restart();
    let restarted = Instant::now();
    state
        .wait_for(|s| s.health == Health::Live)
        .await
        .expect("the session resumes");
    println!("resumed {:?} after the restart", restarted.elapsed());
    // Two TTLs later the keeper still holds the lease, and so does the server.
    let lost = tokio::time::timeout(ttl * 2, keeper.cancellation().cancelled()).await;
    assert!(
        lost.is_err(),
        "the keeper gave the lease up at a restart its session survived: {:?}",
        keeper.loss_reason()
    );
    assert_eq!(keeper.ownership(), Ownership::Held);
    let mut c = client.clone();
    assert_eq!(
        c.status("s:kept").await.unwrap().holder_token,
        Some(lease.token)
    );
    drop(keeper);
    assert!(session.close().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_withdrawn_when_its_stream_breaks_and_a_cancel_withdraws_it() {
    let dir = TempDir::new("session-waiter");
    let s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let mut c = client.clone();
    let held = granted(
        c.acquire("s:busy", Some(Duration::from_secs(5)), Duration::ZERO)
            .await
            .unwrap(),
    );
    // A session dies while it waits.
    let doomed = client.open_session(TTL).await.unwrap();
    let waiter = doomed.clone();
    let wait = tokio::spawn(async move { waiter.acquire("s:busy", Duration::from_secs(30)).await });
    eventually(Duration::from_secs(3), async || {
        c.status("s:busy").await.unwrap().n_waiters == 1
    })
    .await;
    doomed.abandon();
    assert!(
        wait.await.unwrap().is_err(),
        "an abandoned session's wait fails"
    );
    eventually(Duration::from_secs(3), async || {
        c.status("s:busy").await.unwrap().n_waiters == 0
    })
    .await;
    // A cancelled wait (the caller gave up) is withdrawn at once too.
    let session = client.open_session(TTL).await.unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        session.acquire("s:busy", Duration::from_secs(30)),
    )
    .await;
    assert!(gave_up.is_err(), "the wait was still going");
    eventually(Duration::from_secs(3), async || {
        c.status("s:busy").await.unwrap().n_waiters == 0
    })
    .await;
    // Nobody waits any more: the release leaves the resource free.
    c.release(&held.resource, &held.acquisition_id)
        .await
        .unwrap();
    assert_eq!(c.status("s:busy").await.unwrap().holder_token, None);
    // The live session still works after its cancelled wait.
    let l = granted(session.acquire("s:busy", Duration::ZERO).await.unwrap());
    assert!(l.token > held.token);
    assert!(session.close().await.unwrap());
    assert_eq!(
        c.status("s:busy").await.unwrap().holder_token,
        None,
        "close releases"
    );
    assert!(matches!(
        session.acquire("s:other", Duration::ZERO).await,
        Err(ClientError::SessionEnded)
    ));
}

/// `baton hold` in its own process: held by heartbeats alone, released on
/// SIGTERM; paused with SIGSTOP, it loses the lease one TTL later and says
/// so when it wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_hold_keeps_until_sigterm_and_a_paused_holder_loses() {
    use nix::sys::signal::Signal;
    use std::process::Command;

    let dir = TempDir::new("session-hold");
    let s = common::serve(dir.path(), &[]);
    let hold = |name: &str| {
        let mut hold = common::Proc::spawn_merged(
            Command::new(&*common::BIN).args([
                "hold",
                name,
                "--ttl",
                "400ms",
                "--json",
                "--server",
                &s.url(),
            ]),
            "baton hold",
        );
        loop {
            let (_, line) = hold.next_line();
            if let Some(token) = common::json_lease_u64(&line, "token") {
                return (hold, token);
            }
        }
    };
    let mut c = Client::connect(&s.url()).await.unwrap();
    let (mut holder, token) = hold("h:a");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        c.status("h:a").await.unwrap().holder_token.map(|t| t.get()),
        Some(token)
    );
    holder.signal(Signal::SIGTERM);
    assert!(holder.wait().success());
    assert_eq!(
        c.status("h:a").await.unwrap().holder_token,
        None,
        "released on SIGTERM"
    );

    let (holder, token) = hold("h:b");
    holder.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    let next = granted(
        c.acquire("h:b", Some(Duration::from_secs(5)), Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert!(next.token.get() > token);
    assert!(paused.elapsed() >= Duration::from_millis(400) - Duration::from_millis(400) / 3);
    holder.signal(Signal::SIGCONT);
    let (code, stderr) = holder.exit();
    assert_eq!(
        code,
        Some(4),
        "a holder that lost its session exits 4: {stderr}"
    );
    assert!(
        stderr.contains("lost the lease on h:b") && stderr.contains(&token.to_string()),
        "{stderr}"
    );
}
