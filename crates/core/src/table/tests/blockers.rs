//! Why an acquire was refused or its wait ran out (`query.rs`): every
//! requested resource that stood in the way, with its holder, how long it
//! has held it, its TTL left (or its session) and the waiters ahead.

use super::*;

fn holder(s: &str) -> Option<Holder> {
    Some(Holder::parse(s).unwrap())
}

#[test]
fn a_refusal_names_every_blocker_in_request_order_with_its_holder_and_line() {
    let mut t = table();
    let s = id(90).digest();
    t.open_session(MonoMs(0), s, 3_000, None).unwrap();
    let with_holder = |names: &[&str], first: u8, h: &str| AcquireRequest {
        holder: holder(h),
        ..req(names, first, 10_000, 0, 0)
    };
    t.acquire(MonoMs(0), with_holder(&["a"], 1, "w1 @ host-a"))
        .unwrap();
    let on_session = AcquireRequest {
        term: LeaseTerm::Session(s),
        ..with_holder(&["b"], 2, "w2 @ host-b")
    };
    t.acquire(MonoMs(500), on_session).unwrap();
    t.acquire(MonoMs(1_000), req(&["c"], 3, 10_000, 0, 0))
        .unwrap();
    t.acquire(MonoMs(1_000), req(&["c"], 4, 10_000, 9_000, 40))
        .unwrap();
    t.acquire(MonoMs(1_000), req(&["c"], 5, 10_000, 8_000, 41))
        .unwrap();
    t.keep_alive(MonoMs(2_000), s);
    let AcquireOutcome::NotAcquired(n) = t
        .acquire(
            MonoMs(2_500),
            req(&["free", "c", "a", "b"], 6, 10_000, 0, 0),
        )
        .unwrap()
    else {
        panic!("held")
    };
    assert_eq!((n.resource.as_str(), n.holder_token), ("c", Some(tok(3))));
    let held = |counter, h: Option<Holder>, held_s, remaining_ms| Held {
        token: tok(counter),
        holder: h,
        held_for: HeldFor {
            held_s,
            recovered: false,
        },
        remaining_ms,
    };
    assert_eq!(
        n.blockers,
        vec![
            Blocker {
                resource: name("c"),
                holders: vec![held(3, None, 1, Some(8_500))],
                n_holders: 1,
                n_waiters_ahead: 2,
            },
            Blocker {
                resource: name("a"),
                holders: vec![held(1, holder("w1 @ host-a"), 2, Some(7_500))],
                n_holders: 1,
                n_waiters_ahead: 0,
            },
            Blocker {
                resource: name("b"),
                holders: vec![held(2, holder("w2 @ host-b"), 2, None)],
                n_holders: 1,
                n_waiters_ahead: 0,
            },
        ]
    );
    // The second waiter's wait runs out first, behind the first: one ahead.
    t.take_effects();
    t.tick(MonoMs(9_000));
    let woken = t.take_effects().woken;
    let [(WaiterId(41), WaitResult::TimedOut(blockers))] = &woken[..] else {
        panic!("{woken:?}")
    };
    assert_eq!(blockers[0].n_waiters_ahead, 1);
    assert_eq!(blockers[0].holders[0].held_for.held_s, 8);
}

#[test]
fn a_recovered_lease_is_held_since_the_recovery_and_says_so() {
    let record = LeaseRecord {
        acquisition_digest: id(1).digest(),
        token: tok(7),
        ttl_ms: 60_000,
        session: None,
        holder: None,
        shape: Shape::Exclusive,
    };
    let mut t = LeaseTable::recover(
        Limits::default(),
        MonoMs(3_000),
        Epoch::FIRST,
        9,
        [(name("r"), record)],
        [],
    );
    let AcquireOutcome::NotAcquired(n) = t
        .acquire(MonoMs(7_900), req(&["r"], 2, 5_000, 0, 0))
        .unwrap()
    else {
        panic!("held")
    };
    let held = &n.blockers[0].holders[0];
    assert_eq!(
        held.held_for,
        HeldFor {
            held_s: 4,
            recovered: true
        }
    );
}

#[test]
fn a_lease_keeps_its_grant_time_in_48_bytes_and_ttls_above_32_bits_are_refused() {
    assert_eq!(TTL_MS_MAX, u64::from(u32::MAX));
    let limits = Limits {
        ttl_ms_max: TTL_MS_MAX + 1,
        ..Limits::default()
    };
    let made = std::panic::catch_unwind(|| LeaseTable::new(limits, Epoch::FIRST, 0));
    assert!(made.is_err(), "the shell must refuse such limits first");
}
