//! Repeats of a request carrying a request id (`repeats.rs`): answered
//! with what it got, never with a second grant.

use super::*;
use crate::RequestId;

const REQUEST: RequestId = RequestId::from_bytes([42; 16]);

/// A request for `resources` carrying `REQUEST`'s id.
fn keyed(resources: &[&str], attempt: Attempt, wait_ms: u64, waiter: u64) -> AcquireRequest {
    AcquireRequest {
        claims: resources
            .iter()
            .map(|r| Claim::exclusive(name(r), REQUEST.acquisition_id(&name(r))))
            .collect(),
        term: LeaseTerm::Own { ttl_ms: 5_000 },
        wait_ms,
        waiter: WaiterId(waiter),
        holder: None,
        attempt: Some(attempt),
    }
}

fn repeat(ago_ms: u64) -> Attempt {
    Attempt::Repeat {
        first_sent_ms_ago: ago_ms,
    }
}

fn granted(out: Result<AcquireOutcome, AcquireError>) -> Vec<Grant> {
    match out.unwrap() {
        AcquireOutcome::Granted(g) | AcquireOutcome::Repeated(g) => g,
        other => panic!("not granted: {other:?}"),
    }
}

#[test]
fn a_repeat_gets_the_same_leases_with_the_time_they_have_left() {
    let mut t = table();
    let first = granted(t.acquire(MonoMs(10_000), keyed(&["a", "b"], Attempt::First, 0, 1)));
    let again = t.acquire(MonoMs(11_000), keyed(&["a", "b"], repeat(1_000), 0, 2));
    let Ok(AcquireOutcome::Repeated(again)) = again else {
        panic!("{again:?}");
    };
    assert_eq!(again.len(), 2);
    for (g, a) in first.iter().zip(&again) {
        assert_eq!((g.token, g.acquisition_id), (a.token, a.acquisition_id));
        assert_eq!(a.ttl_ms, 4_000, "5 s from 10 s, asked at 11 s");
    }
    assert_eq!(t.n_leases(), 2, "no second lease");
    assert_eq!(t.issued_through(), first[1].token, "no token issued");
}

#[test]
fn a_repeat_after_the_release_is_answered_ended_and_grants_nothing() {
    let mut t = table();
    let g = granted(t.acquire(MonoMs(10_000), keyed(&["a"], Attempt::First, 0, 1)));
    let released = t.release(MonoMs(10_100), &name("a"), &g[0].acquisition_id);
    assert!(matches!(released, ReleaseOutcome::Released { .. }));
    for attempt in [repeat(500), Attempt::First] {
        let out = t.acquire(MonoMs(10_500), keyed(&["a"], attempt, 1_000, 2));
        assert_eq!(out, Ok(AcquireOutcome::Ended), "{attempt:?}");
    }
    assert_eq!(t.n_leases(), 0);
    assert_eq!(t.n_waiters(), 0);
    // The memory is bounded in time: long after, the id is new again.
    let later = MonoMs(10_000 + REPEAT_MEMORY_MS + 1);
    assert!(!granted(t.acquire(later, keyed(&["a"], Attempt::First, 0, 3))).is_empty());
}

#[test]
fn one_lease_of_a_grant_released_makes_the_repeat_ended() {
    let mut t = table();
    let g = granted(t.acquire(MonoMs(10_000), keyed(&["a", "b"], Attempt::First, 0, 1)));
    t.release(MonoMs(10_001), &name("b"), &g[1].acquisition_id);
    let out = t.acquire(MonoMs(10_002), keyed(&["a", "b"], repeat(2), 0, 2));
    assert_eq!(out, Ok(AcquireOutcome::Ended));
    assert_eq!(t.n_leases(), 1);
}

#[test]
fn a_repeat_the_table_cannot_place_is_ended_unless_its_leases_are_held() {
    // A table that started (a restart, a new leader) after the first
    // attempt was sent cannot tell a lease that ended from none: "ended",
    // and nothing held. One whose lease is still held finds it.
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(50_000), Epoch::FIRST, 5, [], []);
    let out = t.acquire(MonoMs(50_000), keyed(&["a"], repeat(3_000), 0, 1));
    assert_eq!(out, Ok(AcquireOutcome::Ended));
    assert_eq!(t.n_leases(), 0);
    // Sent after the table started (by more than the slack): new.
    let out = t.acquire(MonoMs(60_000), keyed(&["a"], repeat(3_000), 0, 2));
    assert!(!granted(out).is_empty());
    // A first attempt is always new; and a table of a store that never
    // issued a token (nothing was ever granted) places every repeat.
    let mut fresh = LeaseTable::recover(Limits::default(), MonoMs(50_000), Epoch::FIRST, 0, [], []);
    let out = fresh.acquire(MonoMs(50_000), keyed(&["a"], repeat(3_000), 0, 1));
    assert!(!granted(out).is_empty());
    let mut t = table();
    let out = t.acquire(MonoMs(50_000), keyed(&["b"], Attempt::First, 0, 1));
    assert!(!granted(out).is_empty());
}

#[test]
fn a_repeat_of_a_waiting_request_takes_its_place_in_line() {
    let mut t = table();
    t.acquire(MonoMs(10_000), req(&["a"], 1, 5_000, 0, 1))
        .unwrap();
    let queued = t.acquire(MonoMs(10_000), req(&["a"], 2, 5_000, 60_000, 2));
    assert!(matches!(queued, Ok(AcquireOutcome::Queued { .. })));
    let first = t.acquire(MonoMs(10_001), keyed(&["a"], Attempt::First, 60_000, 3));
    assert_eq!(
        first,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(3)
        })
    );
    t.take_effects();
    let again = t.acquire(MonoMs(10_500), keyed(&["a"], repeat(499), 60_000, 4));
    assert_eq!(
        again,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(4)
        })
    );
    assert_eq!(t.n_waiters(), 2, "the repeat replaced its first attempt");
    let fx = t.take_effects();
    assert_eq!(
        fx.woken,
        vec![(WaiterId(3), WaitResult::TimedOut(Vec::new()))]
    );
    // Still behind waiter 2: the first release hands over to 2, not to us.
    t.release(MonoMs(11_000), &name("a"), &id(1));
    let fx = t.take_effects();
    assert!(matches!(
        &fx.woken[..],
        [(WaiterId(2), WaitResult::Granted(_))]
    ));
    t.release(MonoMs(11_001), &name("a"), &id(2));
    let fx = t.take_effects();
    let [(WaiterId(4), WaitResult::Granted(g))] = &fx.woken[..] else {
        panic!("{:?}", fx.woken);
    };
    assert_eq!(g[0].acquisition_id, REQUEST.acquisition_id(&name("a")));
    // Granted once: a third attempt finds the lease.
    let third = t.acquire(MonoMs(11_002), keyed(&["a"], repeat(1_001), 0, 5));
    assert!(matches!(third, Ok(AcquireOutcome::Repeated(_))));
}

#[test]
fn a_try_once_repeat_of_a_waiting_request_withdraws_it() {
    let mut t = table();
    t.acquire(MonoMs(10_000), req(&["a"], 1, 5_000, 0, 1))
        .unwrap();
    t.acquire(MonoMs(10_001), keyed(&["a"], Attempt::First, 60_000, 3))
        .unwrap();
    let again = t.acquire(MonoMs(10_500), keyed(&["a"], repeat(499), 0, 4));
    assert!(
        matches!(again, Ok(AcquireOutcome::NotAcquired(_))),
        "{again:?}"
    );
    assert_eq!(t.n_waiters(), 0);
    t.release(MonoMs(11_000), &name("a"), &id(1));
    assert_eq!(t.n_leases(), 0, "nobody is left in line to be granted");
}

#[test]
fn requests_without_an_id_are_served_as_new_every_time() {
    let mut t = table();
    granted(t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 1)));
    t.release(MonoMs(1), &name("a"), &id(1));
    granted(t.acquire(MonoMs(2), req(&["a"], 1, 5_000, 0, 2)));
}

#[test]
fn a_repeat_of_an_attempt_seen_and_not_granted_is_served_as_new() {
    // Just started: a repeat it knows nothing of would be "ended"; one
    // whose first attempt it saw withdrawn (its connection broke while it
    // waited) or refused is new.
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(10_000), Epoch::FIRST, 5, [], []);
    t.acquire(MonoMs(10_000), req(&["a"], 1, 5_000, 0, 1))
        .unwrap();
    let first = t.acquire(MonoMs(10_001), keyed(&["a"], Attempt::First, 60_000, 2));
    assert_eq!(
        first,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(2)
        })
    );
    t.cancel_wait(MonoMs(10_002), WaiterId(2));
    let again = t.acquire(MonoMs(10_003), keyed(&["a"], repeat(2), 60_000, 3));
    assert_eq!(
        again,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(3)
        })
    );
    assert_eq!(t.n_waiters(), 1);
    // Refused try-once, then repeated: refused again, not "ended".
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(10_000), Epoch::FIRST, 5, [], []);
    t.acquire(MonoMs(10_000), req(&["b"], 1, 5_000, 0, 1))
        .unwrap();
    let refused = t.acquire(MonoMs(10_001), keyed(&["b"], Attempt::First, 0, 2));
    assert!(matches!(refused, Ok(AcquireOutcome::NotAcquired(_))));
    let again = t.acquire(MonoMs(10_002), keyed(&["b"], repeat(1), 0, 3));
    assert!(
        matches!(again, Ok(AcquireOutcome::NotAcquired(_))),
        "{again:?}"
    );
}

#[test]
fn every_lease_that_ends_is_written_with_its_digest() {
    let mut t = table();
    let g = granted(t.acquire(MonoMs(10_000), keyed(&["a", "b"], Attempt::First, 0, 1)));
    t.take_effects();
    t.release(MonoMs(10_001), &name("a"), &g[0].acquisition_id);
    let ended = |t: &mut LeaseTable| {
        let writes = t.take_effects().writes;
        writes
            .into_iter()
            .filter_map(|w| match w {
                Write::LeaseEnded { digest } => Some(digest),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(ended(&mut t), [g[0].acquisition_id.digest()], "released");
    t.tick(MonoMs(20_000));
    assert_eq!(ended(&mut t), [g[1].acquisition_id.digest()], "expired");
}

#[test]
fn a_table_given_the_ended_leases_answers_their_late_attempts_ended() {
    // Granted and released before a restart; the store kept the digest.
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(50_000), Epoch::FIRST, 5, [], []);
    t.remember_ended([REQUEST.acquisition_id(&name("a")).digest()]);
    for (at, attempt) in [(50_000, Attempt::First), (50_010, repeat(1_000))] {
        let out = t.acquire(MonoMs(at), keyed(&["a"], attempt, 0, at));
        assert_eq!(out, Ok(AcquireOutcome::Ended), "{attempt:?}");
    }
    assert_eq!((t.n_leases(), t.last_token()), (0, (Epoch::FIRST, 5)));
    // Another request is new; and once the memory ran out, so is this one.
    granted(t.acquire(MonoMs(50_020), req(&["b"], 7, 5_000, 0, 9)));
    let later = MonoMs(50_000 + REPEAT_MEMORY_MS + 1);
    granted(t.acquire(later, keyed(&["a"], Attempt::First, 0, 10)));
}

#[test]
fn a_late_first_attempt_of_a_lease_held_across_a_restart_is_ended() {
    let id = REQUEST.acquisition_id(&name("a"));
    let record = LeaseRecord {
        acquisition_digest: id.digest(),
        token: FencingToken::new(Epoch::FIRST, 5).unwrap(),
        ttl_ms: 5_000,
        session: None,
        holder: None,
        shape: Shape::Exclusive,
    };
    let leases = [(name("a"), record)];
    let mut t = LeaseTable::recover(
        Limits::default(),
        MonoMs(50_000),
        Epoch::FIRST,
        5,
        leases,
        [],
    );
    let out = t.acquire(MonoMs(50_001), keyed(&["a"], Attempt::First, 60_000, 1));
    assert_eq!(out, Ok(AcquireOutcome::Ended));
    assert_eq!(
        (t.n_leases(), t.n_waiters()),
        (1, 0),
        "not in line behind itself"
    );
    let again = granted(t.acquire(MonoMs(50_002), keyed(&["a"], repeat(2), 0, 2)));
    assert_eq!(again[0].acquisition_id, id, "a repeat finds its lease");
}
