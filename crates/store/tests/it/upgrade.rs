//! A data directory written by the previous release (store format 2, log
//! records without holders or openers) opens with this build, keeps every
//! lease, session and token, and then stores holders and openers.

use std::path::{Path, PathBuf};

use baton_core::{
    AcquisitionId, Epoch, FencingToken, Holder, LeaseRecord, ResourceName, SessionRecord, Write,
};
use baton_store::{LeaseStore, RedbStore};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format2");

/// The fixture: five leases granted by `baton acquire` and `baton hold`
/// (one tied to a session), then the server killed with SIGKILL, so part of
/// the state is in the log only. Its log is kept cut to its first block;
/// the rest of a log is zeros.
fn copy_fixture(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("baton-upgrade-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for name in ["baton.redb", "baton.identity", "baton.wal"] {
        std::fs::copy(Path::new(FIXTURE).join(name), d.join(name)).unwrap();
    }
    let wal = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("baton.wal"))
        .unwrap();
    wal.set_len(16 << 20).unwrap();
    d
}

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

#[test]
fn a_format_2_directory_upgrades_in_place_and_keeps_everything() {
    let d = copy_fixture("keeps");
    let stored = {
        let store = RedbStore::open(&d).unwrap();
        store.load().unwrap()
    };
    let first = FencingToken::new(Epoch::FIRST, 1).unwrap().get();
    assert_eq!((stored.epoch, stored.counter), (Epoch::FIRST, 5));
    let leases: Vec<(String, u64, bool)> = stored
        .leases
        .iter()
        .map(|(r, l)| (r.to_string(), l.token.get() - first, l.session.is_some()))
        .collect();
    assert_eq!(
        leases,
        vec![
            ("held/x".to_string(), 4, true),
            ("jobs/a".to_string(), 0, false),
            ("jobs/b".to_string(), 1, false),
            ("jobs/c".to_string(), 2, false),
            ("reports/ünï".to_string(), 3, false),
        ]
    );
    assert!(stored.leases.iter().all(|(_, l)| l.holder.is_none()));
    assert!(stored.leases.iter().all(|(_, l)| l.ttl_ms == 600_000));
    assert_eq!(stored.sessions.len(), 1);
    assert_eq!(stored.sessions[0].opener, None);
    assert_eq!(stored.leases[0].1.session, Some(stored.sessions[0].digest));

    // The upgraded store takes the new fields, and a reopen (after the
    // upgrade, so from format 3) reads old and new records together.
    let session = AcquisitionId::from_bytes([5; 16]).digest();
    let record = LeaseRecord {
        acquisition_digest: AcquisitionId::from_bytes([6; 16]).digest(),
        token: FencingToken::new(Epoch::FIRST, 6).unwrap(),
        ttl_ms: 30_000,
        session: Some(session),
        holder: Some(Holder::parse("alice@build-3 pid 42").unwrap()),
        shape: baton_core::Shape::Exclusive,
    };
    {
        let mut store = RedbStore::open(&d).unwrap();
        store
            .commit(&[
                Write::PutSession {
                    record: SessionRecord {
                        digest: session,
                        ttl_ms: 30_000,
                        opener: Some("ops".into()),
                    },
                },
                Write::PutLease {
                    resource: name("jobs/new"),
                    record: record.clone(),
                },
                Write::Tokens {
                    epoch: Epoch::FIRST,
                    counter: 6,
                },
            ])
            .unwrap();
    }
    let again = RedbStore::open(&d).unwrap().load().unwrap();
    assert_eq!(again.counter, 6);
    assert_eq!(again.leases.len(), 6);
    let new = again.leases.iter().find(|(r, _)| r.as_str() == "jobs/new");
    assert_eq!(new.map(|(_, l)| l), Some(&record));
    let opener = again.sessions.iter().find(|s| s.digest == session);
    assert_eq!(opener.and_then(|s| s.opener.as_deref()), Some("ops"));
    std::fs::remove_dir_all(&d).unwrap();
}
