//! Quotas (`quotas.rs`): each refusal names its quota and changes nothing,
//! and the running counts always equal a recount from the table.

use super::*;
use crate::quota::{OverQuota, PrefixQuota, QuotaKind, QuotaRules};

fn rules(prefixes: &[(&str, Option<u64>, Option<u64>)], sessions: &[(&str, u64)]) -> QuotaRules {
    QuotaRules::new(
        prefixes
            .iter()
            .map(|(p, leases, waiters)| PrefixQuota {
                prefix: (*p).into(),
                leases_max: *leases,
                waiters_max: *waiters,
                ..PrefixQuota::default()
            })
            .collect(),
        sessions.iter().map(|(p, n)| ((*p).into(), *n)).collect(),
        Limits::default().n_waiters_max as u64,
    )
    .unwrap()
}

fn over(kind: QuotaKind, scope: &str, limit: u64) -> AcquireError {
    AcquireError::OverQuota(OverQuota {
        kind,
        scope: scope.into(),
        limit,
    })
}

/// The running counts, and a fresh recount of the same table.
fn counts(t: &mut LeaseTable) -> ((Vec<QuotaUse>, u64), (Vec<QuotaUse>, u64)) {
    let running = t.quota_use();
    let rules = t.quotas.rules().clone();
    t.set_quotas(rules);
    (running, t.quota_use())
}

#[test]
fn a_lease_quota_bounds_every_name_under_its_prefix_and_frees_as_leases_end() {
    let mut t = table();
    t.set_ends_per_step(1);
    t.set_quotas(rules(
        &[("a:", Some(2), None), ("a:b:", Some(1), None)],
        &[],
    ));
    t.acquire(MonoMs(0), req(&["a:b:1"], 1, 1_000, 0, 0))
        .unwrap();
    assert_eq!(
        t.acquire(MonoMs(0), req(&["a:b:2"], 2, 1_000, 0, 0)),
        Err(over(QuotaKind::Leases, "a:b:", 1)),
        "the sub-prefix's own quota"
    );
    t.take_effects();
    // A multi-acquire over the quota gets nothing, and nothing is written.
    assert_eq!(
        t.acquire(MonoMs(0), req(&["a:x", "a:y"], 3, 1_000, 0, 0)),
        Err(over(QuotaKind::Leases, "a:", 2))
    );
    assert!(t.take_effects().writes.is_empty());
    assert!(t.status(MonoMs(0), &name("a:x")).holder_token.is_none());
    t.acquire(MonoMs(0), req(&["a:x"], 3, 1_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["other"], 4, 1_000, 0, 0))
        .unwrap();
    assert_eq!(
        t.acquire(MonoMs(0), req(&["a:y"], 5, 1_000, 0, 0)),
        Err(over(QuotaKind::Leases, "a:", 2))
    );
    assert_eq!(
        t.release(MonoMs(1), &name("a:x"), &id(3)),
        ReleaseOutcome::Released { token: tok(2) }
    );
    t.acquire(MonoMs(1), req(&["a:y"], 5, 1_000, 0, 0)).unwrap();
    // Both "a:" leases expire; once dropped (one per step here), the quota is free.
    for ms in 1_002..1_010 {
        t.tick(MonoMs(ms));
    }
    let (running, recount) = counts(&mut t);
    assert_eq!(running, recount);
    assert_eq!(running.0[0].n_leases, 0);
    t.acquire(MonoMs(1_010), req(&["a:b:3"], 6, 1_000, 0, 0))
        .unwrap();
}

#[test]
fn a_waiters_quota_and_the_shared_pool_bound_who_may_wait() {
    let limits = Limits {
        n_waiters_max: 4,
        ..Limits::default()
    };
    let mut t = LeaseTable::new(limits, Epoch::FIRST, 0);
    let r = QuotaRules::new(
        vec![PrefixQuota {
            prefix: "t:".into(),
            waiters_max: Some(2),
            ..PrefixQuota::default()
        }],
        vec![],
        4,
    )
    .unwrap();
    t.set_quotas(r);
    for n in ["t:1", "u:1"] {
        t.acquire(MonoMs(0), req(&[n], 1, 1_000, 0, 0)).unwrap();
    }
    let queued = t
        .acquire(MonoMs(0), req(&["t:1"], 2, 1_000, 500, 10))
        .unwrap();
    assert!(matches!(queued, AcquireOutcome::Queued { .. }));
    assert_eq!(
        t.acquire(MonoMs(0), req(&["t:1"], 3, 1_000, 500, 11)),
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(11)
        })
    );
    assert_eq!(
        t.acquire(MonoMs(0), req(&["t:1"], 3, 1_000, 500, 15)),
        Err(over(QuotaKind::Waiters, "t:", 2))
    );
    t.cancel_wait(MonoMs(0), WaiterId(11));
    // Names under no waiters quota share what is left: 4 - 2 = 2.
    for w in [12, 13] {
        let out = t
            .acquire(MonoMs(0), req(&["u:1"], 4, 1_000, 500, w))
            .unwrap();
        assert!(matches!(out, AcquireOutcome::Queued { .. }));
    }
    assert_eq!(
        t.acquire(MonoMs(0), req(&["u:1"], 5, 1_000, 500, 14)),
        Err(over(QuotaKind::SharedWaiters, "", 2))
    );
    let (running, recount) = counts(&mut t);
    assert_eq!(running, recount);
    assert_eq!((running.0[0].n_waiters, running.1), (1, 2));
    // The waits run out: every count is back to 0.
    t.tick(MonoMs(600));
    assert_eq!(t.quota_use().0[0].n_waiters, 0);
    assert_eq!(t.quota_use().1, 0);
}

#[test]
fn a_principal_opens_at_most_its_sessions_quota() {
    let mut t = table();
    t.set_quotas(rules(&[], &[("batch", 2)]));
    for n in 1..=2 {
        t.open_session(MonoMs(0), id(n).digest(), 3_000, Some("batch".into()))
            .unwrap();
    }
    let refused = t.open_session(MonoMs(0), id(3).digest(), 3_000, Some("batch".into()));
    assert_eq!(
        refused,
        Err(SessionError::OverQuota(OverQuota {
            kind: QuotaKind::Sessions,
            scope: "batch".into(),
            limit: 2
        }))
    );
    t.open_session(MonoMs(0), id(4).digest(), 3_000, Some("other".into()))
        .unwrap();
    t.open_session(MonoMs(0), id(5).digest(), 3_000, None)
        .unwrap();
    assert!(t.close_session(MonoMs(1), id(1).digest()));
    t.open_session(MonoMs(1), id(3).digest(), 3_000, Some("batch".into()))
        .unwrap();
    assert_eq!(t.quota_sessions(), [("batch".to_string(), 2)]);
    // Both expire.
    t.tick(MonoMs(10_000));
    assert!(t.quota_sessions().is_empty());
}

#[test]
fn lowering_a_quota_below_use_keeps_what_is_held_and_refuses_new_grants() {
    let mut t = table();
    t.set_quotas(rules(&[("a:", Some(3), None)], &[]));
    for (i, n) in ["a:1", "a:2", "a:3"].into_iter().enumerate() {
        t.acquire(MonoMs(0), req(&[n], i as u8 + 1, 5_000, 0, 0))
            .unwrap();
    }
    t.set_quotas(rules(&[("a:", Some(1), None)], &[]));
    assert_eq!(t.quota_use().0[0].n_leases, 3);
    assert!(matches!(
        t.renew(MonoMs(1), &name("a:1"), &id(1)),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        t.acquire(MonoMs(1), req(&["a:4"], 9, 5_000, 0, 0)),
        Err(over(QuotaKind::Leases, "a:", 1))
    );
    t.release(MonoMs(2), &name("a:1"), &id(1));
    t.release(MonoMs(2), &name("a:2"), &id(2));
    assert_eq!(
        t.acquire(MonoMs(2), req(&["a:4"], 9, 5_000, 0, 0)),
        Err(over(QuotaKind::Leases, "a:", 1)),
        "still one held: at the quota"
    );
    t.release(MonoMs(2), &name("a:3"), &id(3));
    t.acquire(MonoMs(2), req(&["a:4"], 9, 5_000, 0, 0)).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        names: Vec<u8>,
        wait: bool,
        session: bool,
    },
    Release(u8),
    Fence(u8),
    OpenSession(u8),
    CloseSession(u8),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec(0u8..6, 1..3), any::<bool>(), any::<bool>())
            .prop_map(|(names, wait, session)| Op::Acquire { names, wait, session }),
        2 => (0u8..6).prop_map(Op::Release),
        1 => (0u8..6).prop_map(Op::Fence),
        1 => (0u8..3).prop_map(Op::OpenSession),
        1 => (0u8..3).prop_map(Op::CloseSession),
        2 => (1u64..1_500).prop_map(Op::Advance),
    ]
}

fn resource(n: u8) -> String {
    ["t:a:0", "t:a:1", "t:b:2", "t:3", "u:4", "u:5"][n as usize].to_string()
}

proptest! {
    /// Whatever happens (grants, waits, hand-offs, releases, fences,
    /// session ends, expiries dropped one per step), the running counts
    /// equal a recount of the table, and no leases quota is exceeded by a
    /// grant made at once.
    #[test]
    fn running_counts_always_equal_a_recount(ops in proptest::collection::vec(op(), 1..80)) {
        let mut t = table();
        t.set_ends_per_step(1);
        t.set_quotas(rules(
            &[("t:", Some(3), Some(4)), ("t:a:", Some(1), Some(2)), ("u:", None, Some(1))],
            &[("p", 2)],
        ));
        let mut now = 0;
        let mut held: Vec<(u8, AcquisitionId)> = Vec::new();
        let mut waiter = 0;
        let mut n_id = 0u8;
        for op in ops {
            match op {
                Op::Acquire { names, wait, session } => {
                    let mut names = names;
                    names.sort_unstable();
                    names.dedup();
                    waiter += 1;
                    // Ids first..first+len: unique (at most 160 in a run).
                    let first = n_id;
                    n_id += names.len() as u8;
                    let mut r = req(
                        &names.iter().map(|n| resource(*n)).collect::<Vec<_>>().iter().map(String::as_str).collect::<Vec<_>>(),
                        first, 1_000, if wait { 700 } else { 0 }, waiter,
                    );
                    if session {
                        r.term = LeaseTerm::Session(id(200).digest());
                    }
                    match t.acquire(MonoMs(now), r.clone()) {
                        Ok(AcquireOutcome::Granted(_)) => {
                            for (i, c) in r.claims.iter().enumerate() {
                                held.push((names[i], c.acquisition_id));
                            }
                        }
                        Err(AcquireError::OverQuota(_)) => {
                            // Nothing was granted under the request's ids (the
                            // counts may have moved: the call's own step drops
                            // ended leases and hands resources on; they are
                            // checked against a recount below).
                            for Claim { resource: res, acquisition_id: id, .. } in &r.claims {
                                prop_assert_eq!(
                                    t.release(MonoMs(now), res, id),
                                    ReleaseOutcome::NotHeld,
                                    "a refused request holds {}", res
                                );
                            }
                        }
                        _ => {}
                    }
                }
                Op::Release(n) => {
                    if let Some(i) = held.iter().position(|(m, _)| *m == n) {
                        let (_, id) = held.remove(i);
                        t.release(MonoMs(now), &name(&resource(n)), &id);
                    }
                }
                Op::Fence(n) => { t.fence(MonoMs(now), &name(&resource(n))); }
                Op::OpenSession(n) => {
                    let _ = t.open_session(MonoMs(now), id(200 + n).digest(), 1_000, Some("p".into()));
                }
                Op::CloseSession(n) => { t.close_session(MonoMs(now), id(200 + n).digest()); }
                Op::Advance(ms) => { now += ms; t.tick(MonoMs(now)); }
            }
            let uses = t.quota_use();
            for (u, max) in uses.0.iter().zip([3, 1]) {
                prop_assert!(u.n_leases <= max, "{} holds {} leases over {}", u.prefix, u.n_leases, max);
            }
            let sessions = t.quota_sessions();
            let (running, recount) = counts(&mut t);
            prop_assert_eq!(running, recount);
            prop_assert_eq!(sessions, t.quota_sessions());
            t.take_effects();
        }
    }
}

#[test]
fn a_waiter_whose_grant_would_pass_a_leases_quota_is_refused_at_its_turn_and_the_next_served() {
    let mut t = table();
    t.set_quotas(rules(&[("a:", Some(2), None)], &[]));
    t.acquire(MonoMs(0), req(&["a:1"], 1, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["a:2"], 2, 5_000, 0, 0)).unwrap();
    // Waits for a:1 and a:3 (free): its grant would add one lease.
    let queued = t.acquire(MonoMs(0), req(&["a:1", "a:3"], 3, 5_000, 1_000, 30));
    assert_eq!(
        queued,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(30)
        })
    );
    let next = t.acquire(MonoMs(0), req(&["a:1"], 5, 5_000, 1_000, 31));
    assert_eq!(
        next,
        Ok(AcquireOutcome::Queued {
            waiter: WaiterId(31)
        })
    );
    t.take_effects();
    t.release(MonoMs(1), &name("a:1"), &id(1));
    let woken = t.take_effects().woken;
    let of = |w: u64| {
        &woken
            .iter()
            .find(|(x, _)| *x == WaiterId(w))
            .expect("woken")
            .1
    };
    assert_eq!(
        of(30),
        &WaitResult::OverQuota(OverQuota {
            kind: QuotaKind::Leases,
            scope: "a:".into(),
            limit: 2
        })
    );
    let WaitResult::Granted(g) = of(31) else {
        panic!("the next in line is served: {woken:?}")
    };
    assert_eq!(g[0].resource.as_str(), "a:1");
    assert_eq!(t.quota_use().0[0].n_leases, 2);
}
