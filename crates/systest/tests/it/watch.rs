//! `Watch` against a real server: a snapshot, then every change with no
//! gap under concurrent clients; a slow watcher cut off; the end of a
//! watch at a restart; the command line's lines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, WatchEvent, WatchKind};
use baton_systest as common;
use common::{Server, TempDir};

async fn connect(s: &Server) -> Client {
    Client::connect(&s.url()).await.unwrap()
}

/// Each of four clients takes and gives back its own `w:` resources (and
/// an `x:` one the watch must not see), 60 times; a watch starts after a
/// third of them. Every grant after the snapshot is seen, in order, and
/// each resource's events alternate holder set / holder gone from the
/// snapshot's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_the_snapshot_then_every_change_with_no_gap() {
    let dir = TempDir::new("watch-gap");
    let s = common::serve(dir.path(), &[]);
    let grants: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let started = Arc::new(tokio::sync::Barrier::new(5));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (url, grants, started) = (s.url(), grants.clone(), started.clone());
            tokio::spawn(async move {
                let mut c = Client::connect(&url).await.unwrap();
                for i in 0..60 {
                    if i == 20 {
                        started.wait().await;
                    }
                    // Every tenth lease is kept: the snapshot has some.
                    let keep = i % 10 == 0;
                    let name = if keep {
                        format!("w:{w}:kept:{i}")
                    } else {
                        format!("w:{w}:{}", i % 3)
                    };
                    let ttl = Duration::from_secs(30);
                    let Acquired::Granted(l) =
                        c.acquire(&name, Some(ttl), Duration::ZERO).await.unwrap()
                    else {
                        panic!("{name} is this worker's own")
                    };
                    grants.lock().unwrap().insert(l.token.get());
                    if !keep {
                        c.release(&name, &l.acquisition_id).await.unwrap();
                    }
                    c.acquire(&format!("x:{w}:{i}"), Some(ttl), Duration::ZERO)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    started.wait().await;
    let mut watch = connect(&s).await.watch("w:").await.unwrap();
    for w in workers {
        w.await.unwrap();
    }
    // A last grant marks the end of the traffic.
    let mut c = connect(&s).await;
    let Acquired::Granted(end) = c
        .acquire("w:end", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let mut events: Vec<WatchEvent> = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the end marker within 10 s")
            .unwrap()
            .changed()
            .expect("an event");
        let last = e.token == end.token;
        events.push(e);
        if last {
            break;
        }
    }
    check_history(&watch, &events, &grants.lock().unwrap(), end.token.get());
}

/// The watch's view against what the clients saw.
fn check_history(
    watch: &baton_client::Watch,
    events: &[WatchEvent],
    grants: &BTreeSet<u64>,
    end: u64,
) {
    let mut seq = watch.seq;
    for e in events {
        assert!(e.seq > seq, "sequence numbers increase: {e:?} after {seq}");
        assert!(e.resource.starts_with("w:"), "only the prefix: {e:?}");
        seq = e.seq;
    }
    // Per resource: from the snapshot's holder, each change alternates.
    let mut holder: BTreeMap<String, Option<u64>> = watch
        .holders
        .iter()
        .map(|h| (h.resource.clone(), Some(h.token.get())))
        .collect();
    let mut seen = BTreeSet::new();
    for e in events {
        let current = holder.entry(e.resource.clone()).or_default();
        match e.kind {
            WatchKind::Granted | WatchKind::HandedOff => {
                assert_eq!(*current, None, "granted while held: {e:?}");
                *current = Some(e.token.get());
                seen.insert(e.token.get());
            }
            WatchKind::Released | WatchKind::Expired => {
                assert_eq!(
                    *current,
                    Some(e.token.get()),
                    "ended another's lease: {e:?}"
                );
                *current = None;
            }
            WatchKind::Fenced => *current = None,
        }
    }
    // Tokens are issued in order: every grant with a token at or above the
    // first one the watch saw came after the snapshot, so the watch saw it.
    let first = *seen.first().expect("the watch saw grants");
    let after: BTreeSet<u64> = grants
        .iter()
        .copied()
        .filter(|t| *t >= first)
        .chain([end])
        .collect();
    let w_grants: BTreeSet<u64> = seen.iter().copied().collect();
    assert_eq!(w_grants, after, "no grant missed, none invented");
    let before = grants.iter().filter(|t| **t < first).count();
    assert!(
        before > 0 && !watch.holders.is_empty(),
        "the watch started mid-way"
    );
    eprintln!(
        "watch: snapshot of {} holders at seq {}, then {} events ({} grants); {before} grants came before",
        watch.holders.len(),
        watch.seq,
        events.len(),
        w_grants.len()
    );
}

/// A watcher that reads nothing while thousands of changes happen is cut
/// off with RESOURCE_EXHAUSTED, not buffered without bound. Each event
/// carries a 250-byte holder description, so the 20,000 events fill the
/// watcher's HTTP/2 window (2 MiB) and the server's send buffer, whatever
/// the timing: the server's queue of 4,096 then overflows. (With short
/// events a forwarder that keeps up fits them all in the window, and the
/// watcher is never cut off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_falls_behind_is_cut_off() {
    let dir = TempDir::new("watch-slow");
    let s = common::serve(dir.path(), &[]);
    let mut slow = connect(&s).await.watch("").await.unwrap().once();
    let holder = baton_core::Holder::parse(&"h".repeat(250)).unwrap();
    let c = connect(&s).await.with_holder(holder);
    let session = c.open_session(Duration::from_secs(30)).await.unwrap();
    for i in 0..10_000 {
        let name = format!("s:{}", i % 8);
        let Acquired::Granted(l) = session.acquire(&name, Duration::ZERO).await.unwrap() else {
            panic!("free")
        };
        session.release(&name, &l.acquisition_id).await.unwrap();
    }
    let mut read = 0;
    let end = loop {
        match slow.next().await {
            Ok(_) => read += 1,
            other => break other,
        }
    };
    let Err(ClientError::Exhausted(why)) = end else {
        panic!("cut off, not {end:?}")
    };
    assert!(
        why.contains("fell behind") && why.contains("watch again"),
        "{why}"
    );
    eprintln!("slow watcher: read {read} events, then: {why}");
    assert!(read < 20_000, "it did not get everything: {read}");
    // A watcher that keeps up is not cut off by the slow one.
    let mut fresh = c.watch("s:").await.unwrap();
    let Acquired::Granted(l) = session.acquire("s:fresh", Duration::ZERO).await.unwrap() else {
        panic!("free")
    };
    let e = fresh.next().await.unwrap().changed().unwrap();
    assert_eq!((e.kind, e.token), (WatchKind::Granted, l.token));
}

/// `baton watch r: --json`: the snapshot's line, the holder, then a grant,
/// as JSON lines; SIGINT ends it with exit 0.
async fn cli_prints_a_line_per_holder_and_change(s: &Server, c: &mut Client) {
    let mut watch = common::Proc::spawn(
        std::process::Command::new(&*common::BIN).args([
            "watch",
            "r:",
            "--json",
            "--server",
            &s.url(),
        ]),
        "baton watch",
    );
    let mut next = || serde_json::from_str::<serde_json::Value>(&watch.next_line().1).unwrap();
    let snapshot = next();
    assert_eq!(
        (
            &snapshot["kind"],
            &snapshot["prefix"],
            &snapshot["n_holders"]
        ),
        (&"snapshot".into(), &"r:".into(), &1.into())
    );
    let held = next();
    assert_eq!(
        (&held["kind"], &held["resource"]),
        (&"held".into(), &"r:1".into())
    );
    assert_eq!(held["seq"], snapshot["seq"], "the snapshot's number");
    let Acquired::Granted(l) = c
        .acquire("r:2", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let granted = next();
    assert_eq!(granted["kind"], "granted");
    assert_eq!(granted["token"], l.token.get());
    assert!(granted["seq"].as_u64() > held["seq"].as_u64());
    watch.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(watch.wait().code(), Some(0));
}

/// `baton watch e: --json` where nothing is held: the snapshot's line
/// alone, whose number `--after-seq` resumes from, with the grant made
/// while no watch ran as its first line.
async fn cli_resumes_from_a_snapshot_with_no_holder(s: &Server, c: &mut Client) {
    let json = |proc: &mut common::Proc| {
        serde_json::from_str::<serde_json::Value>(&proc.next_line().1).unwrap()
    };
    let watch = |args: &[&str]| {
        let mut cmd = std::process::Command::new(&*common::BIN);
        cmd.args(["watch", "e:", "--json", "--server", &s.url()])
            .args(args);
        common::Proc::spawn(&mut cmd, "baton watch e:")
    };
    let mut first = watch(&[]);
    let snapshot = json(&mut first);
    assert_eq!(
        (
            &snapshot["kind"],
            &snapshot["prefix"],
            &snapshot["n_holders"]
        ),
        (&"snapshot".into(), &"e:".into(), &0.into()),
        "{snapshot}"
    );
    first.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(first.wait().code(), Some(0));
    let seq = snapshot["seq"].as_u64().expect("a number");
    let Acquired::Granted(l) = c
        .acquire("e:1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let mut resumed = watch(&["--after-seq", &seq.to_string()]);
    let granted = json(&mut resumed);
    assert_eq!(
        (&granted["kind"], &granted["resource"], &granted["token"]),
        (&"granted".into(), &"e:1".into(), &l.token.get().into()),
        "no snapshot line after --after-seq, the change first: {granted}"
    );
    assert_eq!(
        granted["seq"].as_u64(),
        Some(seq + 1),
        "nothing else changed"
    );
    resumed.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(resumed.wait().code(), Some(0));
}

/// A restart ends the watch (watch again); a refused or invalid watch ends
/// before anything is streamed; the command line prints one line per
/// holder and change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_ends_the_watch_and_bad_watches_are_refused() {
    let dir = TempDir::new("watch-restart");
    let mut s = common::serve(dir.path(), &[]);
    let mut c = connect(&s).await;
    c.acquire("r:1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap();
    cli_prints_a_line_per_holder_and_change(&s, &mut c).await;
    cli_resumes_from_a_snapshot_with_no_holder(&s, &mut c).await;
    let mut watch = c.watch("r:").await.unwrap().once();
    assert_eq!(watch.holders.len(), 2, "r:1 and the command line's r:2");
    s.signal(nix::sys::signal::Signal::SIGTERM);
    let ended = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch ends with the server");
    let Err(ClientError::WatchEnded(why)) = ended else {
        panic!("{ended:?}")
    };
    assert!(why.contains("resume with after_seq"), "{why}");
    s.restart();
    let c = connect(&s).await;
    let invalid = c.watch("a\u{1}").await.unwrap_err();
    assert!(matches!(invalid, ClientError::Invalid(_)), "{invalid:?}");
}
