//! Expiry in bounded steps (`expiry.rs`): many leases ending in one tick
//! are gone at once and dropped a bounded number per step.

use super::*;

/// Enough that the calls in between (each a step) leave some for later.
const N: usize = 8 * ENDS_PER_STEP + 10;

fn m(i: usize) -> String {
    format!("m:{i:05}")
}

fn deletes(fx: &Effects) -> Vec<ResourceName> {
    fx.writes
        .iter()
        .filter_map(|w| match w {
            Write::DeleteLease { resource } => Some(resource.clone()),
            _ => None,
        })
        .collect()
}

fn deferred(fx: &Effects) -> usize {
    fx.events
        .iter()
        .map(|e| match e {
            Event::ExpiriesDeferred { n_leases } => *n_leases,
            _ => 0,
        })
        .sum()
}

#[test]
fn a_mass_expiry_is_gone_at_once_and_dropped_in_bounded_steps() {
    let mut t = table();
    for i in 0..N {
        let out = t.acquire(MonoMs(0), req(&[&m(i)], 1, 1_000, 0, 0)).unwrap();
        assert!(matches!(out, AcquireOutcome::Granted(_)));
    }
    let queued = t.acquire(MonoMs(0), req(&[&m(N - 1)], 2, 1_000, 5_000, 77));
    assert!(matches!(queued, Ok(AcquireOutcome::Queued { .. })));
    let last = t.issued_through();
    t.take_effects();
    t.tick(MonoMs(1_000));
    assert_eq!(t.n_leases(), N, "nothing ends before its full TTL");
    assert!(deletes(&t.take_effects()).is_empty());

    // Every lease is reached in one tick, a step's worth is dropped, and
    // the waiter's resource (the last in the queue's order) goes to it in
    // that step.
    t.tick(MonoMs(1_001));
    let fx = t.take_effects();
    let mut dropped = deletes(&fx);
    assert_eq!(dropped.len(), ENDS_PER_STEP + 1);
    assert!(dropped.contains(&name(&m(N - 1))));
    assert!(matches!(
        fx.woken[..],
        [(WaiterId(77), WaitResult::Granted(_))]
    ));
    assert_eq!(deferred(&fx), N - ENDS_PER_STEP);
    assert_eq!(t.n_leases(), 1, "gone at once, but for the waiter's grant");
    assert_eq!(
        t.next_deadline(),
        Some(MonoMs(1_002)),
        "stepped again a millisecond later"
    );

    // Every caller finds the rest gone: the waiter holds its resource, a
    // new acquire is granted above every token, and the old holder can
    // neither renew nor release.
    let status = t.status(MonoMs(1_001), &name(&m(N - 1)));
    assert!(status.holder_token.unwrap() > last);
    let out = t.acquire(MonoMs(1_001), req(&[&m(N - 2)], 3, 1_000, 0, 0));
    assert!(matches!(out, Ok(AcquireOutcome::Granted(ref g)) if g[0].token > last));
    assert_eq!(
        t.renew(MonoMs(1_001), &name(&m(N - 3)), &id(1)),
        RenewOutcome::NotOwner
    );
    assert_eq!(
        t.release(MonoMs(1_001), &name(&m(N - 4)), &id(1)),
        ReleaseOutcome::NotHeld
    );
    let listed = t.list(MonoMs(1_001), "m:", None, N);
    assert_eq!(
        listed.iter().filter(|s| s.holder_token.is_some()).count(),
        2,
        "only the two granted since are held"
    );
    assert_eq!(t.n_leases(), 2);
    dropped.extend(deletes(&t.take_effects()));

    // The table asks to be stepped a millisecond later until every one is
    // dropped, each step dropping at most its share; each lease is dropped
    // once.
    let (mut steps, mut now) = (0, 1_001);
    while t.n_overdue() > 0 {
        now += 1;
        assert_eq!(t.next_deadline(), Some(MonoMs(now)));
        t.tick(MonoMs(now));
        let step = deletes(&t.take_effects());
        assert!(step.len() <= ENDS_PER_STEP, "{} in one step", step.len());
        dropped.extend(step);
        steps += 1;
    }
    assert!(steps >= 2, "{steps} steps");
    dropped.sort();
    dropped.dedup();
    assert_eq!(dropped.len(), N, "every old lease dropped exactly once");
    assert_eq!(
        t.next_deadline(),
        Some(MonoMs(2_002)),
        "the new leases' expiry"
    );
}

/// A wait runs out by the order of deadlines, not of steps: a waiter whose
/// resource expired before its deadline is granted although the step that
/// drops that lease has not come, and one whose deadline came first is not.
#[test]
fn a_wait_ends_by_the_deadlines_order_not_the_steps() {
    let mut t = table();
    t.set_ends_per_step(1);
    for (r, ttl_ms) in [("a", 1_000), ("b", 1_000), ("c", 1_000), ("d", 3_000)] {
        t.acquire(MonoMs(0), req(&[r], 1, ttl_ms, 0, 0)).unwrap();
    }
    // Until 2000, after "c" expires at 1001; until 2500, before "d" does.
    t.acquire(MonoMs(0), req(&["c"], 10, 1_000, 2_000, 1))
        .unwrap();
    t.acquire(MonoMs(0), req(&["d"], 11, 1_000, 2_500, 2))
        .unwrap();
    t.take_effects();
    t.tick(MonoMs(4_000));
    let fx = t.take_effects();
    let woken: Vec<_> = fx
        .woken
        .iter()
        .map(|(w, r)| (w.0, matches!(r, WaitResult::Granted(_))))
        .collect();
    assert_eq!(woken, vec![(1, true), (2, false)]);
    assert_eq!(
        deletes(&fx).len(),
        2,
        "c settled for the waiter, a in the step"
    );
    assert_eq!(t.n_leases(), 1, "only the waiter's grant is held");
    assert_eq!(t.status(MonoMs(4_000), &name("d")).holder_token, None);
}

/// Paced, the drops of a mass expiry keep to their rate per millisecond
/// however many calls tick the table in between; the leases are gone for
/// every caller all the same.
#[test]
fn paced_drops_keep_to_their_rate_per_millisecond() {
    let mut t = table();
    t.set_expiry_drops_per_ms(10);
    for i in 0..100 {
        t.acquire(MonoMs(0), req(&[&m(i)], 1, 1_000, 0, 0)).unwrap();
    }
    t.take_effects();
    let mut per_ms = Vec::new();
    for now in 1_001..1_011 {
        let mut dropped = 0;
        for _ in 0..5 {
            t.tick(MonoMs(now));
            dropped += deletes(&t.take_effects()).len();
            assert_eq!(t.n_leases(), 0, "gone at once");
        }
        per_ms.push(dropped);
    }
    assert_eq!(per_ms, vec![10; 10]);
    assert_eq!(t.n_overdue(), 0);
}

/// Paced, an ended session's drain keeps to the expiry's rate and shares
/// it: together they drop no more a millisecond than the pace, however
/// many calls tick the table, and the session's leases are gone at once.
#[test]
fn a_paced_drain_shares_the_rate_with_the_expiry() {
    let mut t = table();
    t.set_expiry_drops_per_ms(10);
    let s = id(90).digest();
    t.open_session(MonoMs(0), s, 60_000, None).unwrap();
    for i in 0..30 {
        let bound = AcquireRequest {
            term: LeaseTerm::Session(s),
            ..req(&[&m(i)], 1, 1, 0, 0)
        };
        let out = t.acquire(MonoMs(0), bound).unwrap();
        assert!(matches!(out, AcquireOutcome::Granted(_)));
    }
    for i in 30..45 {
        t.acquire(MonoMs(0), req(&[&m(i)], 1, 1_000, 0, 0)).unwrap();
    }
    t.take_effects();
    t.tick(MonoMs(1_001));
    assert!(t.close_session(MonoMs(1_001), s));
    assert_eq!(
        t.n_leases(),
        0,
        "expired and drained leases are gone at once"
    );
    let mut per_ms = vec![deletes(&t.take_effects()).len()];
    for now in 1_002..1_007 {
        let mut dropped = 0;
        for _ in 0..3 {
            t.tick(MonoMs(now));
            dropped += deletes(&t.take_effects()).len();
        }
        per_ms.push(dropped);
    }
    assert_eq!(per_ms, vec![10, 10, 10, 10, 5, 0]);
    assert_eq!((t.n_overdue(), t.n_draining()), (0, 0));
}

/// Behind a backlog of reached leases, the resources with waiters that a
/// step reaches go to their waiters in that step, whichever side (the
/// reached piece or the wait queues) is the smaller one to search.
#[test]
fn reached_leases_with_waiters_are_handed_over_ahead_of_the_backlog() {
    let mut t = table();
    t.set_expiry_drops_per_ms(10);
    // A backlog: 40 leases ending at 1,001, dropped 10 a millisecond.
    for i in 0..40 {
        t.acquire(MonoMs(0), req(&[&m(i)], 1, 1_000, 0, 0)).unwrap();
    }
    // Three ending at 1,003 with a waiter each, and five held for long
    // with a waiter each: more queues than the piece that 1,003 reaches.
    for i in 100..103 {
        t.acquire(MonoMs(2), req(&[&m(i)], 2, 1_000, 0, 0)).unwrap();
    }
    for i in 200..205 {
        t.acquire(MonoMs(2), req(&[&m(i)], 3, 60_000, 0, 0))
            .unwrap();
    }
    for (k, i) in (100..103).chain(200..205).enumerate() {
        let out = t.acquire(MonoMs(2), req(&[&m(i)], 4, 1_000, 30_000, 500 + k as u64));
        assert!(matches!(out, Ok(AcquireOutcome::Queued { .. })));
    }
    t.take_effects();
    t.tick(MonoMs(1_001));
    assert_eq!(deletes(&t.take_effects()).len(), 10);
    t.tick(MonoMs(1_002));
    assert_eq!(deletes(&t.take_effects()).len(), 10);
    t.tick(MonoMs(1_003));
    let fx = t.take_effects();
    let mut woken: Vec<u64> = fx
        .woken
        .iter()
        .filter(|(_, r)| matches!(r, WaitResult::Granted(_)))
        .map(|(w, _)| w.0)
        .collect();
    woken.sort();
    assert_eq!(
        woken,
        vec![500, 501, 502],
        "handed over in the step that reached them"
    );
    assert_eq!(deletes(&fx).len(), 10 + 3);
    assert!(t.n_overdue() > 0, "the backlog is still there");
}
