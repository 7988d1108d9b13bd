//! The contract every [`LeaseStore`] keeps, written once: each
//! implementation's tests call [`check`] with a way to open its store
//! (again) on the same storage. The in-memory store, the embedded redb
//! store and the cluster's PostgreSQL store all run it.
//!
//! What it checks, each on names of its own so that the cases share one
//! storage:
//! - a fresh store holds no lease and no session;
//! - what a commit wrote is what a reopened store loads, records whole
//!   (token, TTL, session, holder, shape: a shared holder's and a
//!   permit's under their holder's names; a session's TTL and opener);
//! - the writes of one commit apply in order (a put then a delete leaves
//!   nothing, a delete then a put leaves the put, the last put wins);
//! - a delete in a later commit survives a reopen, and so does the ended
//!   lease written with it ([`LeaseStore::ended`]);
//! - the token position is the last one written, and survives a reopen;
//! - an empty commit changes nothing;
//! - a snapshot ([`LeaseStore::snapshot`], where the store has one) reads
//!   the state as of when it was taken, not the commits after it.
//!
//! The store is dropped before each reopen, as a process that stops
//! would; a store whose file is locked (redb) needs that.

use baton_core::{
    AcquisitionId, Epoch, FencingToken, Holder, LeaseRecord, ResourceName, SessionDigest,
    SessionId, SessionRecord, Shape, Write,
};
use baton_store::{LeaseStore, Stored};

/// Runs every case against the stores `open` returns; each call must open
/// the same storage as the one before.
pub fn check<S: LeaseStore>(mut open: impl FnMut() -> S) {
    let mut store = open();
    fresh(&store);
    let position = first_commit_is_what_a_reopen_loads(&mut store);
    drop(store);
    let mut store = open();
    let loaded = store.load().expect("load after reopen");
    assert_round_trip(&loaded, position);
    writes_in_one_commit_apply_in_order(&mut store);
    a_snapshot_is_the_state_when_taken(&mut store);
    a_later_delete_survives_a_reopen(&mut store);
    drop(store);
    let mut store = open();
    after_the_delete(&store.load().expect("load"));
    changes_come_back_in_number_order(&store);
    assert!(
        store.ended().expect("ended").contains(&ended_digest()),
        "an ended lease is kept across a reopen"
    );
    the_token_position_is_the_last_written(&mut store, position);
    drop(store);
    let store = open();
    let loaded = store.load().expect("load");
    assert_eq!(
        (loaded.epoch, loaded.counter),
        (Epoch::FIRST, position + 20),
        "the last token position written survives a reopen"
    );
    drop(store);
    an_empty_commit_changes_nothing(open());
}

fn name(n: &str) -> ResourceName {
    ResourceName::parse(&format!("contract:{n}")).expect("a valid name")
}

fn digest(n: u8) -> SessionDigest {
    SessionId::from_bytes([n; 16]).digest()
}

fn record(token: u64, session: Option<u8>, holder: Option<&str>) -> LeaseRecord {
    LeaseRecord {
        acquisition_digest: AcquisitionId::from_bytes([token as u8; 16]).digest(),
        token: FencingToken::new(Epoch::FIRST, token).expect("counter in range"),
        ttl_ms: 1_000 + token,
        session: session.map(digest),
        holder: holder.map(|h| Holder::parse(h).expect("a valid holder")),
        shape: Shape::Exclusive,
    }
}

/// A shared holder (`n_permits` `None`) or a permit of `n`'s slot `slot`.
fn holder_put(n: &str, slot: u32, n_permits: Option<u32>, token: u64) -> Write {
    Write::PutLease {
        resource: name(n).slot(slot),
        record: LeaseRecord {
            shape: n_permits.map_or(Shape::Shared, Shape::Permits),
            ..record(token, None, None)
        },
    }
}

fn put(n: &str, r: LeaseRecord) -> Write {
    Write::PutLease {
        resource: name(n),
        record: r,
    }
}

fn lease<'a>(s: &'a Stored, n: &str) -> Option<&'a LeaseRecord> {
    let n = name(n);
    s.leases.iter().find(|(r, _)| *r == n).map(|(_, l)| l)
}

fn fresh(store: &impl LeaseStore) {
    let s = store.load().expect("a fresh store loads");
    assert!(
        s.leases
            .iter()
            .all(|(r, _)| !r.as_str().starts_with("contract:")),
        "a fresh store holds no lease of this suite: {:?}",
        s.leases
    );
    assert!(
        s.sessions.iter().all(|x| x.digest != digest(1)),
        "a fresh store holds no session of this suite"
    );
}

/// Writes two leases (one bound to a session, with a holder), the session
/// and a token position; answers the position.
fn first_commit_is_what_a_reopen_loads(store: &mut impl LeaseStore) -> u64 {
    let position = store.load().expect("load").counter + 10;
    store
        .commit(&[
            Write::PutSession {
                record: SessionRecord {
                    digest: digest(1),
                    ttl_ms: 7_000,
                    opener: Some("alice".into()),
                },
            },
            put("a", record(position - 1, None, None)),
            put("b", record(position, Some(1), Some("worker-7 pid 42"))),
            holder_put("c", 0, None, position - 2),
            holder_put("d", 2, Some(3), position - 3),
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: position,
            },
        ])
        .expect("commit");
    position
}

fn assert_round_trip(s: &Stored, position: u64) {
    assert_eq!(lease(s, "a"), Some(&record(position - 1, None, None)));
    assert_eq!(
        lease(s, "b"),
        Some(&record(position, Some(1), Some("worker-7 pid 42"))),
        "a bound lease keeps its session and its holder"
    );
    for w in [
        holder_put("c", 0, None, position - 2),
        holder_put("d", 2, Some(3), position - 3),
    ] {
        let Write::PutLease { resource, record } = w else {
            unreachable!("a put")
        };
        let loaded = s.leases.iter().find(|(r, _)| *r == resource);
        assert_eq!(
            loaded.map(|(_, l)| l),
            Some(&record),
            "a shared holder and a permit keep their names and shapes"
        );
    }
    let session = s.sessions.iter().find(|x| x.digest == digest(1));
    assert_eq!(
        session.map(|x| (x.ttl_ms, x.opener.as_deref())),
        Some((7_000, Some("alice"))),
        "a session keeps its TTL and its opener"
    );
    assert_eq!((s.epoch, s.counter), (Epoch::FIRST, position));
}

fn writes_in_one_commit_apply_in_order(store: &mut impl LeaseStore) {
    let base = store.load().expect("load").counter;
    store
        .commit(&[
            put("gone", record(base + 1, None, None)),
            Write::DeleteLease {
                resource: name("gone"),
            },
            Write::DeleteLease {
                resource: name("back"),
            },
            put("back", record(base + 2, None, None)),
            put("twice", record(base + 3, None, None)),
            put("twice", record(base + 4, None, Some("second"))),
        ])
        .expect("commit");
    let s = store.load().expect("load");
    assert_eq!(
        lease(&s, "gone"),
        None,
        "a put then a delete leaves nothing"
    );
    assert_eq!(lease(&s, "back"), Some(&record(base + 2, None, None)));
    assert_eq!(
        lease(&s, "twice"),
        Some(&record(base + 4, None, Some("second"))),
        "the last put of one commit wins"
    );
}

fn a_snapshot_is_the_state_when_taken(store: &mut impl LeaseStore) {
    let before = store.load().expect("load");
    let Some(snapshot) = store.snapshot() else {
        return; // The store has none: the engine copies its table.
    };
    let snapshot = snapshot.expect("a snapshot is taken");
    let next = before.counter + 1;
    store
        .commit(&[
            put("after-snapshot", record(next, None, None)),
            Write::DeleteLease {
                resource: name("back"),
            },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: next,
            },
        ])
        .expect("commit");
    let read = snapshot().expect("the snapshot reads");
    assert_eq!(
        sorted(&read),
        sorted(&before),
        "a snapshot reads the state when it was taken"
    );
    let now = store.load().expect("load");
    assert!(lease(&now, "after-snapshot").is_some() && lease(&now, "back").is_none());
}

fn sorted(s: &Stored) -> (Epoch, u64, Vec<(ResourceName, LeaseRecord)>) {
    let mut l = s.leases.clone();
    l.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    (s.epoch, s.counter, l)
}

fn a_later_delete_survives_a_reopen(store: &mut impl LeaseStore) {
    store
        .commit(&[
            Write::DeleteLease {
                resource: name("a"),
            },
            Write::LeaseEnded {
                digest: ended_digest(),
            },
            Write::Changed(changes()[0].clone()),
            Write::DeleteSession { digest: digest(9) },
            Write::Changed(changes()[1].clone()),
        ])
        .expect("commit");
}

/// The holder change the later delete records, and a granted one with a
/// slot and a holder.
fn changes() -> [baton_core::NumberedChange; 2] {
    let token = FencingToken::of(7).expect("token");
    let change = |seq, kind, slot, holder: Option<&str>| baton_core::NumberedChange {
        seq,
        change: baton_core::Change {
            kind,
            resource: "a".into(),
            slot,
            token,
            revoked: None,
            holder: holder.map(|h| Holder::parse(h).expect("holder")),
        },
    };
    [
        change(41, baton_core::HolderChange::Granted, Some(2), Some("w-1")),
        change(42, baton_core::HolderChange::Released, None, None),
    ]
}

/// The changes committed come back after a reopen, in number order, with
/// the last number.
fn changes_come_back_in_number_order(store: &impl LeaseStore) {
    let history = store.history(10).expect("history");
    assert_eq!(history.seq, 42, "the last change's number");
    assert_eq!(history.changes, changes().to_vec());
    let last = store.history(1).expect("history");
    assert_eq!((last.seq, last.changes), (42, changes()[1..].to_vec()));
}

/// The acquisition digest of the lease on "a" that the later delete ends.
fn ended_digest() -> baton_core::AcquisitionDigest {
    AcquisitionId::from_bytes([0xe0; 16]).digest()
}

fn after_the_delete(s: &Stored) {
    assert_eq!(lease(s, "a"), None, "a deleted lease stays deleted");
    assert!(lease(s, "b").is_some(), "a delete touches only its name");
}

fn the_token_position_is_the_last_written(store: &mut impl LeaseStore, position: u64) {
    store
        .commit(&[
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: position + 15,
            },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: position + 20,
            },
        ])
        .expect("commit");
    let s = store.load().expect("load");
    assert_eq!((s.epoch, s.counter), (Epoch::FIRST, position + 20));
}

fn an_empty_commit_changes_nothing(mut store: impl LeaseStore) {
    let before = store.load().expect("load");
    store.commit(&[]).expect("an empty commit");
    let after = store.load().expect("load");
    assert_eq!(sorted(&before), sorted(&after));
}

#[cfg(test)]
mod tests {
    use crate::store::MemStore;

    #[test]
    fn the_in_memory_store_keeps_the_contract() {
        let shared = MemStore::default();
        super::check(|| shared.clone());
    }
}
