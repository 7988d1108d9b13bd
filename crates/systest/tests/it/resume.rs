//! Watches that resume: under eight clients of churn, a watcher (the Rust
//! client's, and `baton watch --json`) across a server SIGKILLed right
//! after a release and restarted, a cluster leader SIGKILLed, and its
//! connection cut by the fault proxy. What it delivered is the committed
//! sequence, with no gap and no duplicate: every number once, in order,
//! every grant and release the clients were answered, and at the end the
//! holders a fresh snapshot shows. Then the refusals: a number older than
//! the kept changes (and a watcher cut off that far behind re-snapshots),
//! one from the future, and one from before a restore.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, Release, WatchEvent, WatchKind, WatchUpdate};
use baton_systest as common;
use common::cluster::Cluster;
use common::TempDir;
use tokio::task::JoinHandle;

/// What a client was answered.
#[derive(Clone, Debug)]
enum Acked {
    Granted(String, u64),
    Released(String, u64),
}

/// Eight clients, each taking and giving back its own three `r:` names
/// until stopped, through restarts (a failed call: a new client).
struct Churn {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    workers: Vec<JoinHandle<()>>,
}

impl Churn {
    fn start(urls: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
        let workers = (0..8)
            .map(|w| {
                let (urls, stop, acked) = (urls.to_string(), stop.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut slot = None;
                    let mut i = 0u64;
                    while !stop.load(Ordering::Acquire) {
                        let Some(c) = common::reconnect(&mut slot, &urls).await else {
                            continue;
                        };
                        i += 1;
                        let name = format!("r:{w}:{}", i % 3);
                        let ttl = Some(Duration::from_secs(60));
                        let lease = match c.acquire(&name, ttl, Duration::ZERO).await {
                            Ok(Acquired::Granted(l)) => l,
                            // Held: its release's answer was lost.
                            Ok(_) => continue,
                            Err(_) => {
                                slot = None;
                                continue;
                            }
                        };
                        acked
                            .lock()
                            .unwrap()
                            .push(Acked::Granted(name.clone(), lease.token.get()));
                        match c.release(&name, &lease.acquisition_id).await {
                            Ok(Release::Released { token }) => acked
                                .lock()
                                .unwrap()
                                .push(Acked::Released(name, token.get())),
                            Ok(_) => {}
                            Err(_) => slot = None,
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            acked,
            workers,
        }
    }

    /// Waits for a release answered after this call, after at least 100
    /// answers: the fault then comes right after a release.
    async fn next_release(&self) {
        let floor = self.acked.lock().unwrap().len() + 100;
        common::eventually(Duration::from_secs(20), async || {
            let enough = self.acked.lock().unwrap().len() >= floor;
            if !enough {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            enough
        })
        .await;
        let seen = self.acked.lock().unwrap().len();
        common::eventually(Duration::from_secs(20), async || {
            let released = self.acked.lock().unwrap()[seen..]
                .iter()
                .any(|a| matches!(a, Acked::Released(..)));
            if !released {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            released
        })
        .await;
    }

    async fn stop(self) -> Vec<Acked> {
        self.stop.store(true, Ordering::Release);
        for w in self.workers {
            w.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// A Rust watcher of `r:` on its own task, collecting every change.
struct Watcher {
    snapshot: BTreeMap<String, u64>,
    seq: u64,
    events: Arc<Mutex<Vec<WatchEvent>>>,
    task: JoinHandle<ClientError>,
}

impl Watcher {
    async fn start(url: &str) -> Self {
        let client = Client::connect(url)
            .await
            .unwrap()
            .with_rpc_timeout(Duration::from_secs(2));
        let mut watch = client.watch("r:").await.unwrap();
        let snapshot = watch
            .holders
            .iter()
            .map(|h| (h.resource.clone(), h.token.get()))
            .collect();
        let seq = watch.seq;
        let events: Arc<Mutex<Vec<WatchEvent>>> = Arc::default();
        let into = events.clone();
        let task = tokio::spawn(async move {
            loop {
                match watch.next().await {
                    Ok(WatchUpdate::Changed(e)) => into.lock().unwrap().push(e),
                    Ok(other) => panic!("no resnapshot within the window: {other:?}"),
                    Err(e) => return e,
                }
            }
        });
        Self {
            snapshot,
            seq,
            events,
            task,
        }
    }

    /// Every change up to the one granting `token`.
    async fn until(self, token: u64) -> (BTreeMap<String, u64>, u64, Vec<WatchEvent>) {
        let events = self.events.clone();
        common::eventually(Duration::from_secs(60), async || {
            let seen = events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.token.get() == token);
            if !seen {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        })
        .await;
        self.task.abort();
        let events = events.lock().unwrap().clone();
        (self.snapshot, self.seq, events)
    }
}

/// The end of the churn: one grant every watcher must see.
async fn marker(urls: &str) -> u64 {
    let mut c = Client::connect(urls).await.unwrap();
    let Acquired::Granted(l) = c
        .acquire("r:end", Some(Duration::from_secs(60)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    l.token.get()
}

/// The holders of `r:` now, from a fresh snapshot.
async fn holders_now(urls: &str) -> BTreeMap<String, u64> {
    let watch = Client::connect(urls)
        .await
        .unwrap()
        .watch("r:")
        .await
        .unwrap();
    watch
        .holders
        .iter()
        .map(|h| (h.resource.clone(), h.token.get()))
        .collect()
}

/// The watcher's changes against the committed sequence: every number
/// after the snapshot's once and in order (everything changed is under
/// `r:`), each resource's changes alternating from the snapshot's holder
/// to the holders now, and every grant and release a client was answered
/// among them.
fn check(
    what: &str,
    (snapshot, seq, events): (BTreeMap<String, u64>, u64, Vec<WatchEvent>),
    acked: &[Acked],
    now: &BTreeMap<String, u64>,
) {
    let numbers: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (seq + 1..=seq + events.len() as u64).collect();
    assert_eq!(numbers, expected, "{what}: no gap, no duplicate");
    let mut held: BTreeMap<String, u64> = snapshot.clone();
    let mut granted = std::collections::BTreeSet::new();
    let mut released = std::collections::BTreeSet::new();
    for e in &events {
        let name = e.resource.clone();
        match e.kind {
            WatchKind::Granted | WatchKind::HandedOff => {
                assert_eq!(
                    held.insert(name.clone(), e.token.get()),
                    None,
                    "{what}: {e:?}"
                );
                granted.insert((name, e.token.get()));
            }
            WatchKind::Released | WatchKind::Expired => {
                assert_eq!(held.remove(&name), Some(e.token.get()), "{what}: {e:?}");
                released.insert((name, e.token.get()));
            }
            WatchKind::Fenced => panic!("{what}: nothing was fenced: {e:?}"),
        }
    }
    assert_eq!(&held, now, "{what}: the changes lead to the holders now");
    // Tokens are issued in order: a grant at or above the first one the
    // watch saw came after its snapshot, and so did the release of such a
    // lease or of one the snapshot held.
    let first = granted.iter().map(|g| g.1).min().unwrap_or(u64::MAX);
    let (mut n_acked, mut n_undone) = (0, 0);
    for a in acked {
        let (seen, after) = match a {
            Acked::Granted(r, t) => (granted.contains(&(r.clone(), *t)), *t >= first),
            Acked::Released(r, t) => (
                released.contains(&(r.clone(), *t)),
                *t >= first || snapshot.get(r) == Some(t),
            ),
        };
        match a {
            _ if !after => {}
            _ if seen => n_acked += 1,
            // A release's write is lazy: a crash right after its answer
            // can undo it (the lease is held again until its TTL), and
            // then no watcher was told of it.
            Acked::Released(r, t) if now.get(r) == Some(t) => n_undone += 1,
            _ => panic!("{what}: the watch missed {a:?}"),
        }
    }
    eprintln!(
        "{what}: {} changes after seq {seq}, every one once and in order; {n_acked} answered grants and releases among them, {n_undone} answered releases undone by a crash (never delivered)",
        events.len()
    );
}

/// `baton watch r: --json` lines as the changes they print, after the
/// snapshot's line and its `held` lines (checked as the Rust watcher's).
/// A snapshot's holders and number, and the changes after it as `(seq,
/// kind, resource, token)`.
type Printed = (BTreeMap<String, u64>, u64, Vec<(u64, String, String, u64)>);

fn cli_changes(lines: &[String]) -> Printed {
    let mut snapshot = BTreeMap::new();
    let mut seq = 0;
    let mut changes = Vec::new();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.contains(r#""kind":"snapshot""#)),
        "the snapshot's line first: {lines:?}"
    );
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = v["kind"].as_str().unwrap().to_string();
        let resource = v["resource"].as_str().unwrap_or_default().to_string();
        let token = v["token"].as_u64().unwrap_or(0);
        match kind.as_str() {
            "snapshot" => {
                assert!(snapshot.is_empty() && changes.is_empty(), "first: {line}");
                seq = v["seq"].as_u64().unwrap();
            }
            "held" => {
                assert_eq!(
                    v["seq"].as_u64(),
                    Some(seq),
                    "the snapshot's number: {line}"
                );
                snapshot.insert(resource, token);
            }
            "resnapshot" => panic!("no resnapshot within the window: {line}"),
            _ => changes.push((v["seq"].as_u64().unwrap(), kind, resource, token)),
        }
    }
    (snapshot, seq, changes)
}

/// `baton watch r: --json` as a process, following `servers`, and the
/// lines read so far.
struct CliWatcher(common::Proc, Vec<String>);

impl CliWatcher {
    /// Started, and its first line (the snapshot's) read: it has its
    /// snapshot, the faults may begin.
    fn start(servers: &str) -> Self {
        let mut proc = common::Proc::spawn(
            std::process::Command::new(&*common::BIN)
                .args(["watch", "r:", "--json", "--server", servers]),
            "baton watch",
        );
        let first = proc.next_line().1;
        Self(proc, vec![first])
    }

    /// Reads its lines up to the grant of `end`, ends it with SIGINT
    /// (exit 0: it resumed rather than failed) and checks them as the
    /// Rust watcher's are.
    fn check_until(mut self, what: &str, end: u64, now: &BTreeMap<String, u64>) {
        let mut lines = std::mem::take(&mut self.1);
        let marker = format!("\"token\":{end}");
        while !lines.last().is_some_and(|l| l.contains(&marker)) {
            lines.push(self.0.next_line().1);
        }
        self.0.signal(nix::sys::signal::Signal::SIGINT);
        assert_eq!(
            self.0.wait().code(),
            Some(0),
            "{what}: resumed, then ended by SIGINT"
        );
        let (snapshot, seq, changes) = cli_changes(&lines);
        let numbers: Vec<u64> = changes.iter().map(|c| c.0).collect();
        let expected: Vec<u64> = (seq + 1..=seq + changes.len() as u64).collect();
        assert_eq!(numbers, expected, "{what}: no gap, no duplicate");
        let mut held = snapshot;
        for (_, kind, resource, token) in &changes {
            match kind.as_str() {
                "granted" | "handed_off" => {
                    assert_eq!(held.insert(resource.clone(), *token), None, "{what}")
                }
                _ => assert_eq!(
                    held.remove(resource),
                    Some(*token),
                    "{what}: {kind} {resource}"
                ),
            }
        }
        assert_eq!(&held, now, "{what}: the changes lead to the holders now");
        eprintln!(
            "{what}: {} changes after seq {seq}, every one once and in order",
            changes.len()
        );
    }
}

/// The server SIGKILLed three times, each right after a release was
/// answered, and restarted: the Rust watcher and `baton watch --json`
/// resume from their last number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_across_sigkill_with_no_gap_and_no_duplicate() {
    let dir = TempDir::new("resume-kill");
    let mut s = common::serve(dir.path(), &[]);
    let url = s.url();
    let churn = Churn::start(&url);
    churn.next_release().await;
    let watcher = Watcher::start(&url).await;
    let cli = CliWatcher::start(&url);
    let kills = 3;
    for _ in 0..kills {
        churn.next_release().await;
        s.kill9();
        s.restart();
    }
    churn.next_release().await;
    let acked = churn.stop().await;
    let end = marker(&url).await;
    let now = holders_now(&url).await;
    let watched = watcher.until(end).await;
    check("rust watcher across 3 SIGKILLs", watched, &acked, &now);
    cli.check_until("baton watch --json across 3 SIGKILLs", end, &now);
}

/// The leader SIGKILLed twice right after a release: the watchers (the
/// Rust client's and `baton watch`'s) resume on the new leader from the
/// changes the store kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_on_the_new_leader_after_the_leader_is_killed() {
    let db = baton_testkit::PgDb::create("resume_failover").await;
    let mut cluster = Cluster::start(&db.url, 3);
    cluster.wait_leader(None).await;
    let urls = cluster.endpoints();
    let churn = Churn::start(&urls);
    churn.next_release().await;
    let watcher = Watcher::start(&urls).await;
    let cli = CliWatcher::start(&urls);
    let kills = 2;
    for _ in 0..kills {
        churn.next_release().await;
        let leader = cluster.wait_leader(None).await;
        cluster.nodes[leader].kill9();
        cluster.wait_leader(Some(leader)).await;
        cluster.nodes[leader].restart();
    }
    churn.next_release().await;
    let acked = churn.stop().await;
    let end = marker(&urls).await;
    let now = holders_now(&urls).await;
    check(
        "rust watcher across 2 leader SIGKILLs",
        watcher.until(end).await,
        &acked,
        &now,
    );
    cli.check_until("baton watch --json across 2 leader SIGKILLs", end, &now);
}

/// The watchers' connections (the Rust client's and `baton watch`'s) cut
/// by the fault proxy three times: they resume on new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_after_its_connection_is_cut() {
    let dir = TempDir::new("resume-cut");
    let s = common::serve(dir.path(), &[]);
    let proxy = baton_faults::Proxy::start(s.grpc).await.unwrap();
    let churn = Churn::start(&s.url());
    churn.next_release().await;
    let via = format!("http://{}", proxy.addr());
    let watcher = Watcher::start(&via).await;
    let cli = CliWatcher::start(&via);
    for _ in 0..3 {
        churn.next_release().await;
        proxy.reset_all();
    }
    churn.next_release().await;
    let acked = churn.stop().await;
    let end = marker(&s.url()).await;
    let now = holders_now(&s.url()).await;
    eprintln!("proxy faults: {:?}", proxy.counts());
    check(
        "rust watcher across 3 cut connections",
        watcher.until(end).await,
        &acked,
        &now,
    );
    cli.check_until("baton watch --json across 3 cut connections", end, &now);
}

/// Changes of `r:` on `c`, one grant and release each.
async fn cycles(c: &mut Client, n: usize) {
    for _ in 0..n {
        let Acquired::Granted(l) = c
            .acquire("r:x", Some(Duration::from_secs(30)), Duration::ZERO)
            .await
            .unwrap()
        else {
            panic!("free")
        };
        c.release("r:x", &l.acquisition_id).await.unwrap();
    }
}

/// With `--watch-history 10`: a number older than the last ten changes is
/// refused (OUT_OF_RANGE, the oldest number in the metadata, a definite
/// error), as is one above the last change; the kept ones resume; a
/// watcher cut off for falling behind resumes with a new snapshot, said
/// so; `baton watch --after-seq` gets the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_and_future_numbers_are_refused_and_a_lagging_watch_resnapshots() {
    let dir = TempDir::new("resume-window");
    let mut s = common::serve(dir.path(), &["--watch-history", "10"]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    let start = c.watch("r:").await.unwrap().seq;
    cycles(&mut c, 20).await;
    let last = start + 40;
    let err = c.watch_after("r:", start).await.unwrap_err();
    let ClientError::WatchTooOld {
        oldest_seq,
        message,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(*oldest_seq, last - 10);
    assert!(
        message.contains("older than the changes this server keeps"),
        "{message}"
    );
    assert!(err.is_definite());
    let future = c.watch_after("r:", last + 1).await.unwrap_err();
    let ClientError::Invalid(why) = &future else {
        panic!("{future:?}")
    };
    assert!(why.contains("above the last change"), "{why}");
    let mut kept = c.watch_after("r:", last - 10).await.unwrap();
    let first = kept.next().await.unwrap().changed().unwrap();
    assert_eq!(first.seq, last - 9, "the oldest kept change comes first");
    // The kept changes survive a restart.
    s.restart();
    let c = Client::connect(&s.url()).await.unwrap();
    let mut again = c.watch_after("r:", last - 3).await.unwrap();
    assert_eq!(again.next().await.unwrap().changed().unwrap().seq, last - 2);
    let out = common::cli(&[
        "watch",
        "r:",
        "--after-seq",
        &start.to_string(),
        "--server",
        &s.url(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("older than the changes"), "{stderr}");
    // A watcher that reads nothing while a thousand changes happen is cut
    // off; its number is then older than the ten kept: a new snapshot.
    let mut slow = c.watch("").await.unwrap();
    let holder = baton_core::Holder::parse(&"h".repeat(250)).unwrap();
    let c2 = Client::connect(&s.url()).await.unwrap().with_holder(holder);
    let session = c2.open_session(Duration::from_secs(30)).await.unwrap();
    for i in 0..10_000 {
        let name = format!("r:s:{}", i % 8);
        let Acquired::Granted(l) = session.acquire(&name, Duration::ZERO).await.unwrap() else {
            panic!("free")
        };
        session.release(&name, &l.acquisition_id).await.unwrap();
    }
    let mut read = 0;
    let resnapshot = loop {
        match slow.next().await.unwrap() {
            WatchUpdate::Changed(_) => read += 1,
            other => break other,
        }
    };

    let WatchUpdate::Resnapshot { seq, holders } = resnapshot else {
        panic!("{resnapshot:?}")
    };
    assert!(holders.is_empty(), "{holders:?}");
    assert_eq!(seq, last + 20_000, "the new snapshot is at the last change");
    eprintln!("lagging watcher: read {read} changes, then a new snapshot at {seq}");
}

/// A restore starts a higher range of numbers: a watch resuming from
/// before it is told its number is too old, and its new snapshot's number
/// is above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_before_a_restore_is_told_to_take_a_new_snapshot() {
    let dir = TempDir::new("resume-restore");
    let files = TempDir::new("resume-restore-files");
    let mut s = common::serve(dir.path(), &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    cycles(&mut c, 3).await;
    let backup = files.path().join("baton.backup");
    let out = common::cli(&[
        "admin",
        "backup",
        "--out",
        backup.to_str().unwrap(),
        "--server",
        &s.url(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cycles(&mut c, 3).await;
    let before = c.watch("r:").await.unwrap().seq;
    s.kill9();
    let out = common::cli(&[
        "admin",
        "restore",
        "--from",
        backup.to_str().unwrap(),
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.restart();
    let c = Client::connect(&s.url()).await.unwrap();
    let err = c.watch_after("r:", before).await.unwrap_err();
    assert!(matches!(err, ClientError::WatchTooOld { .. }), "{err:?}");
    let after = c.watch("r:").await.unwrap().seq;
    assert!(
        after > before,
        "numbers rise across the restore: {after} > {before}"
    );
}

/// `baton watch --once` and `baton observe --once` keep the old end: the
/// stream's end at a restart is exit 1, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_ends_the_command_line_watch_at_a_restart() {
    let dir = TempDir::new("resume-once");
    let mut s = common::serve(dir.path(), &[]);
    let url = s.url();
    let mut c = Client::connect(&url).await.unwrap();
    // Held before the watch starts, so its snapshot line says it is
    // subscribed before the release it must see.
    let Acquired::Granted(l) = c
        .acquire("r:x", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let mut watch = common::Proc::spawn_merged(
        std::process::Command::new(&*common::BIN).args(["watch", "r:", "--once", "--server", &url]),
        "baton watch --once",
    );
    let mut observe = common::Proc::spawn_merged(
        std::process::Command::new(&*common::BIN)
            .args(["observe", "r:x", "--once", "--server", &url]),
        "baton observe --once",
    );
    watch.wait_for(" held r:x ");
    observe.wait_for(" current ");
    c.release("r:x", &l.acquisition_id).await.unwrap();
    watch.wait_for(" released ");
    s.restart();
    let (code, rest) = watch.exit();
    assert_eq!(code, Some(1), "{rest}");
    assert!(rest.contains("the server ended the watch"), "{rest}");
    let (code, rest) = observe.exit();
    assert_eq!(code, Some(1), "{rest}");
    assert!(rest.contains("the server ended the observation"), "{rest}");
}
