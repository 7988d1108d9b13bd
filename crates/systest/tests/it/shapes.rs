//! Semaphores and shared locks against a real server, with real signals:
//! `baton hold --permits` processes paused, killed and released while they
//! contend, the grants checked by the fault suite (never more holders at
//! once than permits, and that many reached; one holder per slot at a
//! time), a paused holder's late write refused by the fence kit per slot,
//! a paused writer's late write refused beside readers, and the holders
//! and N kept across a restart.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{AcquiredAll, Client, Shape};
use baton_core::FencingToken;
use baton_faults::grants::{self, Grant};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{FenceRequest, Outcome};
use baton_systest as common;
use common::{Proc, TempDir};
use nix::sys::signal::Signal;

const TTL_MS: u64 = 500;

/// A `baton hold` of `name` as `shape_args`, and its grant: the token and
/// slot it printed, when it was started and when the line came. `None`
/// if it was not granted (it printed its refusal and exited).
fn hold(
    server: &str,
    name: &str,
    shape_args: &[&str],
) -> Option<(Proc, Instant, Instant, u64, Option<u64>)> {
    let invoked = Instant::now();
    let ttl = format!("{TTL_MS}ms");
    let mut args = vec![
        "hold", name, "--ttl", &ttl, "--wait", "30s", "--json", "--server", server,
    ];
    args.extend_from_slice(shape_args);
    let mut proc = Proc::spawn(Command::new(&*common::BIN).args(&args), "baton hold");
    let (answered, line) = proc.line_within(Duration::from_secs(40))?;
    let token = common::json_lease_u64(&line, "token")?;
    let slot = common::json_lease_u64(&line, "slot");
    Some((proc, invoked, answered, token, slot))
}

/// A write of `token` to `resource` through the fence kit.
fn write(fence: &Mutex<rusqlite::Connection>, resource: &str, token: u64, what: &str) -> Outcome {
    let token = FencingToken::from_u64(token).unwrap();
    let req = FenceRequest::new(resource, token, what, what.as_bytes(), b"").unwrap();
    SqliteFence::publish(&mut fence.lock().unwrap(), &req).unwrap()
}

/// A reader's own output under its shared lease (the fence kit's shared
/// side), with `token`.
fn write_shared(
    fence: &Mutex<rusqlite::Connection>,
    resource: &str,
    token: u64,
    what: &str,
) -> Outcome {
    let token = FencingToken::from_u64(token).unwrap();
    let req = FenceRequest::new(resource, token, what, what.as_bytes(), b"")
        .unwrap()
        .shared();
    SqliteFence::write(&mut fence.lock().unwrap(), &req, |_| {
        Ok::<_, baton_fence::FenceError>(())
    })
    .unwrap()
}

/// What a worker saw of one grant, for the checks after the run.
struct Held {
    grant: Grant,
    slot: u64,
    /// A paused holder's write after it woke: when, and its outcome.
    late_write: Option<(Instant, Outcome)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_holders_of_three_permits_with_pauses_and_kills_never_exceed_three() {
    const PERMITS: u64 = 3;
    const WORKERS: u64 = 8;
    const ROUNDS: u64 = 5;
    let dir = TempDir::new("shapes-permits");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let conn = rusqlite::Connection::open(dir.path().join("fence.db")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let fence = Arc::new(Mutex::new(conn));
    let history = Arc::new(Mutex::new(Vec::<Held>::new()));
    let faults = Arc::new(Mutex::new([0u32; 3]));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (url, fence, history, faults) =
                (url.clone(), fence.clone(), history.clone(), faults.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let Some((mut proc, invoked, answered, token, slot)) =
                        hold(&url, "jobs", &["--permits", "3"])
                    else {
                        panic!("worker {w} round {round}: not granted within its wait");
                    };
                    let slot = slot.expect("a permit has a slot");
                    let resource = format!("jobs:slot-{slot}");
                    write(&fence, &resource, token, &format!("w{w}r{round}"));
                    // Each fault in turn: a release, a pause past the
                    // lease, a kill.
                    let fault = ((w + round) % 3) as usize;
                    faults.lock().unwrap()[fault] += 1;
                    let (earliest_end, late_write) = match fault {
                        0 => {
                            std::thread::sleep(Duration::from_millis(50 + 40 * w));
                            let at = Instant::now();
                            proc.signal(Signal::SIGTERM);
                            assert!(proc.wait().success(), "released on SIGTERM");
                            (at, None)
                        }
                        1 => {
                            proc.signal(Signal::SIGSTOP);
                            std::thread::sleep(Duration::from_millis(3 * TTL_MS));
                            // Woken past its lease, it writes as if it
                            // still held its permit.
                            let at = Instant::now();
                            let out =
                                write(&fence, &resource, token, &format!("late w{w}r{round}"));
                            proc.signal(Signal::SIGCONT);
                            proc.wait();
                            (invoked + Duration::from_millis(TTL_MS), Some((at, out)))
                        }
                        _ => {
                            std::thread::sleep(Duration::from_millis(30 * w));
                            proc.kill9();
                            (invoked + Duration::from_millis(TTL_MS), None)
                        }
                    };
                    history.lock().unwrap().push(Held {
                        grant: Grant {
                            resource: "jobs".into(),
                            token,
                            invoked,
                            answered,
                            earliest_end: Some(earliest_end.max(answered)),
                        },
                        slot,
                        late_write,
                    });
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let all: Vec<Grant> = history.iter().map(|h| h.grant.clone()).collect();
    let verdict = grants::check(&all);
    assert!(
        verdict.reissued.is_empty() && verdict.out_of_order.is_empty(),
        "{verdict:?}"
    );
    let most = grants::max_concurrent(&all)["jobs"];
    assert!(
        most as u64 <= PERMITS,
        "{most} permits held at once, of {PERMITS}"
    );
    assert_eq!(
        most as u64, PERMITS,
        "the permits were never all held at once: the test proved nothing"
    );
    // One holder per slot at a time, each slot's tokens rising.
    let by_slot: Vec<Grant> = history
        .iter()
        .map(|h| Grant {
            resource: format!("jobs:slot-{}", h.slot),
            ..h.grant.clone()
        })
        .collect();
    let slots = grants::check(&by_slot);
    assert!(slots.is_safe(), "{slots:?}");
    assert!(history.iter().all(|h| h.slot < PERMITS));
    // A paused holder's write is refused once its slot went to a newer
    // holder before it woke.
    let (mut stale_refused, mut late) = (0, 0);
    for h in &history {
        let Some((at, out)) = &h.late_write else {
            continue;
        };
        late += 1;
        let overtaken = history
            .iter()
            .any(|o| o.slot == h.slot && o.grant.token > h.grant.token && o.grant.answered < *at);
        if overtaken {
            assert!(
                matches!(out, Outcome::Stale { .. }),
                "a stale permit's write: {out:?}"
            );
            stale_refused += 1;
        }
    }
    assert!(
        stale_refused > 0,
        "no paused holder's slot was taken over: the test proved nothing"
    );
    let faults = faults.lock().unwrap();
    println!(
        "{} grants; at most {most} of {PERMITS} permits held at once; {} per-slot exclusions checked; \
         faults: {} releases, {} pauses past the lease, {} kills; {stale_refused} of {late} late writes \
         refused as stale",
        all.len(),
        slots.exclusion_checked,
        faults[0],
        faults[1],
        faults[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_writers_late_write_is_refused_after_readers_and_a_new_writer() {
    let dir = TempDir::new("shapes-rw");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let conn = rusqlite::Connection::open(dir.path().join("fence.db")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let fence = Mutex::new(conn);
    let (mut writer, _, _, old, _) = hold(&url, "doc", &[]).unwrap();
    assert!(write(&fence, "doc", old, "v1").is_applied());
    writer.signal(Signal::SIGSTOP);
    // Readers queue behind the writer, and are granted together once its
    // lease runs out; a second writer behind them waits for both.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || hold(&url, "doc", &["--shared"]).unwrap())
        })
        .collect();
    let readers: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let mut slots: Vec<_> = readers.iter().map(|r| r.4.unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [0, 1], "two shared holders, side by side");
    assert!(readers.iter().all(|r| r.3 > old));
    let mut c = Client::connect(&url).await.unwrap();
    assert_eq!(c.status("doc").await.unwrap().slots.len(), 2);
    let new_writer = {
        let url = url.clone();
        std::thread::spawn(move || hold(&url, "doc", &[]).unwrap())
    };
    std::thread::sleep(Duration::from_millis(200));
    // The first reader writes its summary and leaves; the second pauses
    // before writing its own, and its lease runs out.
    let mut readers = readers.into_iter();
    let (mut done, _, _, first_reader, _) = readers.next().unwrap();
    assert!(write_shared(&fence, "doc", first_reader, "summary").is_applied());
    done.signal(Signal::SIGTERM);
    assert!(done.wait().success());
    let (mut paused, _, _, paused_reader, _) = readers.next().unwrap();
    paused.signal(Signal::SIGSTOP);
    let (mut new_writer, _, _, new, slot) = new_writer.join().unwrap();
    assert_eq!(slot, None, "an exclusive lease has no slot");
    assert!(write(&fence, "doc", new, "v2").is_applied());
    writer.signal(Signal::SIGCONT);
    let late = write(&fence, "doc", old, "late v1");
    assert!(
        matches!(late, Outcome::Stale { .. }),
        "the paused writer's late write: {late:?}"
    );
    paused.signal(Signal::SIGCONT);
    let late_summary = write_shared(&fence, "doc", paused_reader, "late summary");
    assert_eq!(
        late_summary,
        Outcome::Stale {
            presented: FencingToken::from_u64(paused_reader).unwrap(),
            current: FencingToken::from_u64(new).unwrap()
        },
        "the paused reader's summary of the old data"
    );
    writer.wait();
    paused.wait();
    new_writer.signal(Signal::SIGTERM);
    new_writer.wait();
    println!(
        "writer {old} and reader {paused_reader} paused; writer {new} wrote; their late writes: 2 refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_shared_holders_and_n_survive_a_restart() {
    let dir = TempDir::new("shapes-restart");
    let mut s = common::serve(dir.path(), &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    let ttl = Some(Duration::from_secs(30));
    let granted = |all: AcquiredAll| match all {
        AcquiredAll::Granted { leases, .. } => leases,
        other => panic!("{other:?}"),
    };
    let mut permits = vec![];
    for _ in 0..2 {
        permits.extend(granted(
            c.acquire_shaped(&[("jobs", Shape::Permits(3))], ttl, Duration::ZERO)
                .await
                .unwrap(),
        ));
    }
    let readers = granted(
        c.acquire_shaped(
            &[("doc", Shape::Shared), ("jobs", Shape::Permits(3))],
            ttl,
            Duration::ZERO,
        )
        .await
        .unwrap(),
    );
    let before = (
        c.status("jobs").await.unwrap(),
        c.status("doc").await.unwrap(),
    );
    assert_eq!(before.0.permits, Some(3));
    assert_eq!(before.0.slots.len(), 3);
    assert_eq!(c.set_permits("jobs", 4).await.unwrap(), 3);
    s.restart();
    let mut c = Client::connect(&s.url()).await.unwrap();
    let after = (
        c.status("jobs").await.unwrap(),
        c.status("doc").await.unwrap(),
    );
    let tokens = |st: &baton_client::Status| {
        st.slots
            .iter()
            .map(|x| (x.slot, x.token))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        tokens(&after.0),
        tokens(&before.0),
        "the permits, slot by slot"
    );
    assert_eq!(tokens(&after.1), tokens(&before.1), "the shared holder");
    assert_eq!(
        after.0.permits,
        Some(4),
        "the operator's N, not the first request's"
    );
    let refused = c
        .acquire_shaped(&[("jobs", Shape::Permits(3))], ttl, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("semaphore of 4 permits"),
        "{refused}"
    );
    let fourth = granted(
        c.acquire_shaped(&[("jobs", Shape::Permits(4))], ttl, Duration::ZERO)
            .await
            .unwrap(),
    );
    assert_eq!(fourth[0].slot, Some(3));
    assert!(fourth[0].token > readers[1].token);
    // The semaphore is full: the refusal lists all four permits in the
    // way, the longest held first.
    let AcquiredAll::NotAcquired(full) = c
        .acquire_shaped(&[("jobs", Shape::Permits(4))], ttl, Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("a fifth permit of four")
    };
    let in_way: Vec<u64> = full.blockers[0]
        .holders
        .iter()
        .map(|h| h.token.get())
        .collect();
    let mut held: Vec<u64> = permits
        .iter()
        .chain(&readers[1..])
        .chain(&fourth)
        .map(|l| l.token.get())
        .collect();
    held.sort();
    assert_eq!((in_way, full.blockers[0].n_holders), (held, 4));
    // Renewed and released by their ids, as before the restart.
    for l in permits.iter().chain(&readers) {
        assert!(matches!(
            c.release(&l.resource, &l.acquisition_id).await.unwrap(),
            baton_client::Release::Released { .. }
        ));
    }
    assert_eq!(c.status("doc").await.unwrap().slots, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_shared_holders_and_n_survive_a_leader_failover() {
    let db = baton_testkit::PgDb::create("shapes_failover").await;
    let mut cluster = common::Cluster::start(&db.url, 3);
    let leader = cluster.wait_leader(None).await;
    let mut c = Client::connect(&cluster.endpoints()).await.unwrap();
    let ttl = Some(Duration::from_secs(30));
    let granted = |all: AcquiredAll| match all {
        AcquiredAll::Granted { leases, .. } => leases,
        other => panic!("{other:?}"),
    };
    let permits = granted(
        c.acquire_shaped(
            &[("jobs", Shape::Permits(2)), ("doc", Shape::Shared)],
            ttl,
            Duration::ZERO,
        )
        .await
        .unwrap(),
    );
    let second = granted(
        c.acquire_shaped(&[("jobs", Shape::Permits(2))], ttl, Duration::ZERO)
            .await
            .unwrap(),
    );
    let before = (
        c.status("jobs").await.unwrap(),
        c.status("doc").await.unwrap(),
    );
    cluster.nodes[leader].kill9();
    let new_leader = cluster.wait_leader(Some(leader)).await;
    assert_ne!(new_leader, leader);
    // The new leader has every holder, its slot and token, and the N.
    let mut after = None;
    common::eventually(Duration::from_secs(30), async || {
        after = match (c.status("jobs").await, c.status("doc").await) {
            (Ok(j), Ok(d)) => Some((j, d)),
            _ => None,
        };
        after.is_some()
    })
    .await;
    let after = after.unwrap();
    let tokens = |st: &baton_client::Status| {
        st.slots
            .iter()
            .map(|x| (x.slot, x.token))
            .collect::<Vec<_>>()
    };
    assert_eq!(tokens(&after.0), tokens(&before.0));
    assert_eq!(tokens(&after.1), tokens(&before.1));
    assert_eq!(after.0.permits, Some(2));
    assert!(matches!(
        c.acquire_shaped(&[("jobs", Shape::Permits(2))], ttl, Duration::ZERO)
            .await
            .unwrap(),
        AcquiredAll::NotAcquired(_)
    ));
    // Renewed by id on the new leader, with its token kept.
    match c.renew("jobs", &second[0].acquisition_id).await.unwrap() {
        baton_client::Renewal::Renewed { token, .. } => assert_eq!(token, second[0].token),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.release("jobs", &permits[0].acquisition_id).await.unwrap(),
        baton_client::Release::Released { .. }
    ));
    let third = granted(
        c.acquire_shaped(&[("jobs", Shape::Permits(2))], ttl, Duration::ZERO)
            .await
            .unwrap(),
    );
    assert_eq!(third[0].slot, Some(0));
    assert!(third[0].token > second[0].token);
}
