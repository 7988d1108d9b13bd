//! `kill -9` of a process committing to the embedded store, at random
//! moments, 40 times over: with logs of 64 KiB, the kills land in the
//! middle of background folds, log rotations and epoch checkpoints. After
//! each kill the store must hold exactly the commits up to some point at
//! or after the last one acknowledged: none lost, none torn, no key back
//! from an older value.
//!
//! The writer is this test binary run again as a child
//! (`BATON_STORE_CRASH_CHILD`); its commits are a function of their
//! number, so the parent can compute what any prefix of them leaves.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use baton_core::{AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName, Write};
use baton_store::{LeaseStore, RedbStore};
use baton_testkit::process::Proc;

const CHILD: &str = "BATON_STORE_CRASH_CHILD";
const LOG_LEN_BYTES: u64 = 64 << 10;
const KEYS: u64 = 3_000;
const KILLS: usize = 40;
/// Kills go on past [`KILLS`] until one lands during a fold and an epoch
/// checkpoint was crossed, up to this many: a loaded machine can finish
/// every fold between 40 kills, or commit fewer than 2,500 times in them.
const KILLS_MAX: usize = 200;

/// The epoch of commit `i`: a new one every 2,500 commits (a checkpoint).
fn epoch_of(i: u64) -> Epoch {
    Epoch::new(1 + (i / 2_500) as u32).unwrap()
}

/// What commit `i` writes: a put or a delete of one of `KEYS` names, and
/// the token position.
fn commit(i: u64) -> Vec<Write> {
    let resource = ResourceName::parse(&format!("crash:{:05}", (i * 7_919) % KEYS)).unwrap();
    let key = if i.is_multiple_of(6) {
        Write::DeleteLease { resource }
    } else {
        Write::PutLease {
            resource,
            record: LeaseRecord {
                acquisition_digest: AcquisitionId::from_bytes([i as u8; 16]).digest(),
                token: FencingToken::new(epoch_of(i), i).unwrap(),
                ttl_ms: 5_000,
                session: None,
                holder: None,
                shape: baton_core::Shape::Exclusive,
            },
        }
    };
    vec![
        key,
        Write::Tokens {
            epoch: epoch_of(i),
            counter: i,
        },
    ]
}

/// Every lease after commits 1..=n: name to counter.
fn model(n: u64) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for i in 1..=n {
        match &commit(i)[0] {
            Write::PutLease { resource, .. } => {
                m.insert(resource.to_string(), i);
            }
            Write::DeleteLease { resource } => {
                m.remove(resource.as_str());
            }
            _ => unreachable!(),
        }
    }
    m
}

/// The child: opens the store, commits from where it stands, and prints
/// `N BACKLOG` after commit N returned (BACKLOG: keys the background fold
/// had left), until killed.
fn write_until_killed(dir: &Path) {
    let mut store = RedbStore::open_with_log(dir, LOG_LEN_BYTES).expect("open");
    let mut i = store.load().expect("load").counter + 1;
    loop {
        store.commit(&commit(i)).expect("commit");
        println!(
            "{i} {}",
            store.fold_backlog().expect("a log-structured store")
        );
        i += 1;
    }
}

#[test]
fn kill_9_mid_fold_loses_no_acknowledged_commit_and_brings_back_no_key() {
    if let Some(dir) = std::env::var_os(CHILD) {
        write_until_killed(Path::new(&dir));
        return;
    }
    let dir = std::env::temp_dir().join(format!("baton-store-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let seed = baton_testkit::seed_from_env("CRASH_SEED");
    println!("seed {seed} (rerun with CRASH_SEED={seed})");
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let exe = std::env::current_exe().unwrap();
    let (mut acknowledged, mut mid_fold, mut epochs) = (0u64, 0usize, 0u32);
    let mut full_repairs = 0;
    let mut kills = 0;
    while kills < KILLS || ((mid_fold == 0 || epochs <= 1) && kills < KILLS_MAX) {
        let kill = kills;
        kills += 1;
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--exact",
            "crash::kill_9_mid_fold_loses_no_acknowledged_commit_and_brings_back_no_key",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &dir);
        let mut child = Proc::spawn(&mut cmd, "store writer");
        // Run for a random 30 to 330 ms of commits, counted from the first.
        let mut last = (acknowledged, 0usize);
        let until = Duration::from_millis(30 + next() % 300);
        let started = Instant::now();
        while started.elapsed() < until {
            let Some((_, line)) = child.line_within(Duration::from_secs(10)) else {
                panic!("the writer stopped: {:?}", child.lines());
            };
            if let Some((n, backlog)) = parse(&line) {
                last = (n, backlog);
            }
        }
        child.kill9();
        for line in child.lines().to_vec() {
            if let Some(parsed) = parse(&line) {
                last = last.max(parsed);
            }
        }
        mid_fold += usize::from(last.1 > 0);
        full_repairs += usize::from(needs_full_repair(&dir));
        let store = RedbStore::open_with_log(&dir, LOG_LEN_BYTES).expect("reopen after kill");
        let stored = store.load().expect("load after kill");
        assert!(
            stored.counter >= last.0,
            "kill {kill}: commit {} was acknowledged, the store holds {}",
            last.0,
            stored.counter
        );
        assert_eq!(
            stored.epoch,
            epoch_of(stored.counter),
            "kill {kill}: the epoch"
        );
        let got: BTreeMap<String, u64> = stored
            .leases
            .iter()
            .map(|(r, l)| (r.to_string(), l.token.get() & 0xff_ffff_ffff))
            .collect();
        assert!(
            got == model(stored.counter),
            "kill {kill}: the leases are not those of commits 1..={}",
            stored.counter
        );
        acknowledged = stored.counter;
        epochs = stored.epoch.get();
    }
    println!(
        "{kills} kills, {mid_fold} with a background fold under way at the last acknowledged \
         commit, {full_repairs} that left redb a file to walk whole; {acknowledged} commits, \
         {} epochs",
        epochs
    );
    assert_eq!(
        full_repairs, 0,
        "redb had to walk its whole file after a kill: a commit saved no allocator state"
    );
    assert!(
        mid_fold > 0,
        "no kill landed during a fold: the test proved nothing about folds"
    );
    assert!(epochs > 1, "no epoch checkpoint was crossed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether redb, opening the store file as a kill left it, must walk the
/// whole file to rebuild its allocator state (a full repair: about a second
/// at ten million leases, before the first grant) instead of loading the
/// state its last commit saved. Asked of a copy, so that the store itself
/// still opens the file the kill left.
fn needs_full_repair(dir: &Path) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let copy = dir.with_extension("repair-probe.redb");
    std::fs::copy(RedbStore::path_in(dir), &copy).expect("copy the store file");
    let repaired = Arc::new(AtomicBool::new(false));
    let seen = repaired.clone();
    let db = redb::Builder::new()
        .set_repair_callback(move |_| seen.store(true, Ordering::Relaxed))
        .open(&copy)
        .expect("redb opens the store file a kill left");
    drop(db);
    std::fs::remove_file(&copy).expect("remove the copy");
    repaired.load(Ordering::Relaxed)
}

fn parse(line: &str) -> Option<(u64, usize)> {
    let (n, backlog) = line.split_once(' ')?;
    Some((n.parse().ok()?, backlog.parse().ok()?))
}
