use super::*;
use crate::{AcquisitionDigest, SLOT_SEPARATOR};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

fn id(n: u8) -> AcquisitionId {
    AcquisitionId::from_bytes([n; 16])
}

fn tok(counter: u64) -> FencingToken {
    FencingToken::new(Epoch::FIRST, counter).unwrap()
}

fn table() -> LeaseTable {
    LeaseTable::new(Limits::default(), Epoch::FIRST, 0)
}

fn req(resources: &[&str], first_id: u8, ttl_ms: u64, wait_ms: u64, waiter: u64) -> AcquireRequest {
    AcquireRequest {
        claims: resources
            .iter()
            .enumerate()
            .map(|(i, r)| Claim::exclusive(name(r), id(first_id + i as u8)))
            .collect(),
        term: LeaseTerm::Own { ttl_ms },
        wait_ms,
        waiter: WaiterId(waiter),
        holder: None,
        attempt: None,
    }
}

fn grant(r: &str, n: u8, counter: u64, ttl_ms: u64) -> Grant {
    Grant {
        resource: name(r),
        acquisition_id: id(n),
        token: tok(counter),
        slot: None,
        ttl_ms,
        waited_ms: 0,
    }
}

/// Resource `r` blocking a request: held by the lease of token `counter`
/// (no description, a TTL of its own) for `held_s`, `remaining_ms` left.
fn blocker(r: &str, counter: u64, held_s: u64, remaining_ms: u64) -> Blocker {
    Blocker {
        resource: name(r),
        holders: vec![Held {
            token: tok(counter),
            holder: None,
            held_for: HeldFor {
                held_s,
                recovered: false,
            },
            remaining_ms: Some(remaining_ms),
        }],
        n_holders: 1,
        n_waiters_ahead: 0,
    }
}

/// `g` as granted to a request that waited `waited_ms` in line.
fn after_waiting(g: Grant, waited_ms: u64) -> Grant {
    Grant { waited_ms, ..g }
}

#[test]
fn grant_is_synced_and_carries_its_write() {
    let mut t = table();
    let out = t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    assert_eq!(out, AcquireOutcome::Granted(vec![grant("a", 1, 1, 5_000)]));
    let fx = t.take_effects();
    assert!(fx.sync);
    assert_eq!(
        fx.writes,
        vec![
            Write::PutLease {
                resource: name("a"),
                record: LeaseRecord {
                    acquisition_digest: id(1).digest(),
                    token: tok(1),
                    ttl_ms: 5_000,
                    session: None,
                    holder: None,
                    shape: Shape::Exclusive,
                }
            },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: 1
            },
        ]
    );
}

#[test]
fn held_resource_is_refused_until_expiry_then_granted_higher() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    // Held through its whole TTL (the grant may have come up to a
    // millisecond after the clock read 0), free one tick later.
    let refused = t
        .acquire(MonoMs(5_000), req(&["a"], 2, 5_000, 0, 0))
        .unwrap();
    assert_eq!(
        refused,
        AcquireOutcome::NotAcquired(NotAcquired {
            resource: name("a"),
            holder_token: Some(tok(1)),
            blockers: vec![blocker("a", 1, 5, 0)],
        })
    );
    t.take_effects();
    let later = t
        .acquire(MonoMs(5_001), req(&["a"], 2, 5_000, 0, 0))
        .unwrap();
    assert_eq!(
        later,
        AcquireOutcome::Granted(vec![grant("a", 2, 2, 5_000)])
    );
    let fx = t.take_effects();
    assert_eq!(
        fx.events[0],
        Event::Expired {
            resource: name("a"),
            token: tok(1),
            holder: None,
        }
    );
    assert_eq!(
        fx.writes[0],
        Write::DeleteLease {
            resource: name("a")
        }
    );
}

#[test]
fn release_and_expiry_do_not_demand_sync() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.take_effects();
    assert_eq!(
        t.release(MonoMs(1), &name("a"), &id(1)),
        ReleaseOutcome::Released { token: tok(1) }
    );
    let fx = t.take_effects();
    assert!(!fx.sync);
    assert_eq!(
        fx.writes,
        vec![
            Write::DeleteLease {
                resource: name("a")
            },
            Write::LeaseEnded {
                digest: id(1).digest()
            }
        ]
    );
    assert_eq!(
        t.release(MonoMs(2), &name("a"), &id(1)),
        ReleaseOutcome::NotHeld,
        "second release says so"
    );
}

#[test]
fn renew_extends_from_now_and_fails_after_expiry() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    assert_eq!(
        t.renew(MonoMs(4_000), &name("a"), &id(1)),
        RenewOutcome::Renewed {
            token: tok(1),
            ttl_ms: 5_000
        }
    );
    assert_eq!(t.status(MonoMs(8_999), &name("a")).remaining_ms, 1);
    assert_eq!(t.status(MonoMs(9_000), &name("a")).remaining_ms, 0);
    assert_eq!(
        t.renew(MonoMs(9_001), &name("a"), &id(1)),
        RenewOutcome::NotOwner
    );
    assert_eq!(
        t.status(MonoMs(9_001), &name("a")).holder_token,
        None,
        "renew never recreates"
    );
}

#[test]
fn wrong_id_changes_nothing() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.take_effects();
    assert_eq!(
        t.release(MonoMs(1), &name("a"), &id(9)),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        t.renew(MonoMs(1), &name("a"), &id(9)),
        RenewOutcome::NotOwner
    );
    let fx = t.take_effects();
    assert!(fx.writes.is_empty());
    assert_eq!(t.status(MonoMs(1), &name("a")).holder_token, Some(tok(1)));
}

#[test]
fn renew_after_replacement_is_not_owner() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 1_000, 0, 0)).unwrap();
    t.acquire(MonoMs(1_001), req(&["a"], 2, 1_000, 0, 0))
        .unwrap();
    assert_eq!(
        t.renew(MonoMs(1_002), &name("a"), &id(1)),
        RenewOutcome::NotOwner
    );
    assert_eq!(
        t.release(MonoMs(1_002), &name("a"), &id(1)),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        t.status(MonoMs(1_002), &name("a")).holder_token,
        Some(tok(2))
    );
}

#[test]
fn waiters_are_served_first_come_first_served() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    assert_eq!(
        t.acquire(MonoMs(1), req(&["a"], 2, 5_000, 9_000, 10))
            .unwrap(),
        AcquireOutcome::Queued {
            waiter: WaiterId(10)
        }
    );
    assert_eq!(
        t.acquire(MonoMs(2), req(&["a"], 3, 5_000, 9_000, 11))
            .unwrap(),
        AcquireOutcome::Queued {
            waiter: WaiterId(11)
        }
    );
    // A try-once request does not jump the queue.
    assert!(matches!(
        t.acquire(MonoMs(3), req(&["a"], 4, 5_000, 0, 0)).unwrap(),
        AcquireOutcome::NotAcquired(_)
    ));
    t.take_effects();
    t.release(MonoMs(4), &name("a"), &id(1));
    let fx = t.take_effects();
    assert!(fx.sync);
    assert_eq!(
        fx.woken,
        vec![(
            WaiterId(10),
            // Queued at 1, granted at 4.
            WaitResult::Granted(vec![after_waiting(grant("a", 2, 2, 5_000), 3)])
        )]
    );
    // The second waiter gets it when the first lease expires.
    t.tick(MonoMs(5_005));
    assert_eq!(
        t.take_effects().woken,
        vec![(
            WaiterId(11),
            // Queued at 2, granted at 5 005.
            WaitResult::Granted(vec![after_waiting(grant("a", 3, 3, 5_000), 5_003)])
        )]
    );
}

#[test]
fn wait_deadline_answers_timed_out_and_cancelled_waiter_leaves_queue() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["a"], 2, 5_000, 100, 10))
        .unwrap();
    t.acquire(MonoMs(0), req(&["a"], 3, 5_000, 4_000, 11))
        .unwrap();
    t.cancel_wait(MonoMs(50), WaiterId(11));
    assert_eq!(t.status(MonoMs(50), &name("a")).n_waiters, 1);
    t.take_effects();
    t.tick(MonoMs(100));
    assert_eq!(
        t.take_effects().woken,
        vec![(
            WaiterId(10),
            WaitResult::TimedOut(vec![blocker("a", 1, 0, 4_900)])
        )]
    );
    assert_eq!(t.status(MonoMs(100), &name("a")).n_waiters, 0);
    assert_eq!(t.n_waiters(), 0);
}

#[test]
fn multi_acquire_is_all_or_nothing() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["b"], 1, 5_000, 0, 0)).unwrap();
    t.take_effects();
    let out = t
        .acquire(MonoMs(1), req(&["a", "b", "c"], 2, 5_000, 0, 0))
        .unwrap();
    assert_eq!(
        out,
        AcquireOutcome::NotAcquired(NotAcquired {
            resource: name("b"),
            holder_token: Some(tok(1)),
            blockers: vec![blocker("b", 1, 0, 4_999)],
        })
    );
    assert!(t.take_effects().writes.is_empty());
    assert_eq!(t.status(MonoMs(1), &name("a")).holder_token, None);
    t.release(MonoMs(2), &name("b"), &id(1));
    let out = t
        .acquire(MonoMs(3), req(&["a", "b", "c"], 2, 5_000, 0, 0))
        .unwrap();
    assert_eq!(
        out,
        AcquireOutcome::Granted(vec![
            grant("a", 2, 2, 5_000),
            grant("b", 3, 3, 5_000),
            grant("c", 4, 4, 5_000)
        ])
    );
}

#[test]
fn overlapping_multi_waiters_in_opposite_orders_do_not_deadlock() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["x"], 1, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["y"], 2, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(1), req(&["x", "y"], 10, 5_000, 60_000, 100))
        .unwrap();
    t.acquire(MonoMs(2), req(&["y", "x"], 20, 5_000, 60_000, 200))
        .unwrap();
    t.take_effects();
    t.release(MonoMs(3), &name("y"), &id(2));
    assert!(
        t.take_effects().woken.is_empty(),
        "first waiter still needs x"
    );
    t.release(MonoMs(4), &name("x"), &id(1));
    let woken = t.take_effects().woken;
    assert_eq!(woken.len(), 1);
    assert_eq!(woken[0].0, WaiterId(100));
    t.release(MonoMs(5), &name("x"), &id(10));
    t.release(MonoMs(5), &name("y"), &id(11));
    let woken = t.take_effects().woken;
    assert_eq!(woken.len(), 1);
    assert_eq!(woken[0].0, WaiterId(200));
}

#[test]
fn fence_revokes_and_orders_tokens() {
    let mut t = table();
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.take_effects();
    assert_eq!(
        t.fence(MonoMs(1), &name("a")),
        FenceOutcome {
            token: tok(2),
            revoked: Some(tok(1))
        }
    );
    let fx = t.take_effects();
    assert!(fx.sync, "a fence is durable before it is answered");
    assert_eq!(
        fx.writes[0],
        Write::DeleteLease {
            resource: name("a")
        }
    );
    assert_eq!(
        t.renew(MonoMs(2), &name("a"), &id(1)),
        RenewOutcome::NotOwner
    );
    let AcquireOutcome::Granted(g) = t.acquire(MonoMs(3), req(&["a"], 2, 5_000, 0, 0)).unwrap()
    else {
        panic!()
    };
    assert_eq!(g[0].token, tok(3));
}

#[test]
fn a_big_recovered_table_ends_over_time_never_before_its_full_ttl() {
    const N: usize = 100_000;
    let records = (0..N).map(|i| {
        (
            name(&format!("r:{i:06}")),
            LeaseRecord {
                acquisition_digest: id(1).digest(),
                token: tok(7),
                ttl_ms: 60_000,
                session: None,
                holder: None,
                shape: Shape::Exclusive,
            },
        )
    });
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(100), Epoch::FIRST, 9, records, []);
    // Nothing ends before its full TTL from the restart...
    t.tick(MonoMs(60_100));
    assert_eq!(t.n_leases(), N);
    // ...then at most RECOVERED_ENDS_PER_MS (and a rounding) per millisecond,
    // over N / RECOVERED_ENDS_PER_MS ms (200 here, under a tenth of the TTL).
    let window_ms = (N / RECOVERED_ENDS_PER_MS) as u64;
    let mut left = N;
    for at in 60_101..=60_101 + window_ms {
        t.tick(MonoMs(at));
        let ended = left - t.n_leases();
        assert!(ended <= RECOVERED_ENDS_PER_MS + 1, "{ended} ended at {at}");
        left = t.n_leases();
    }
    assert_eq!(left, 0, "every lease ended within the window");
    // A small table ends exactly at its TTL, as before.
    assert_eq!(recovery_delay_ms(60_000, 498, 499), 0);
    // A short TTL bounds the delay to a tenth of it.
    assert!(recovery_delay_ms(1_000, 999_999, 1_000_000) < 100);
    // A product past 64 bits is still exact (the window is 2^40 / 500 ms).
    assert_eq!(
        recovery_delay_ms(u64::MAX, (1 << 40) - 1, 1 << 40),
        2_199_023_254
    );
}

#[test]
fn recovery_holds_every_lease_for_a_full_ttl_from_restart() {
    let record = LeaseRecord {
        acquisition_digest: id(1).digest(),
        token: tok(7),
        ttl_ms: 5_000,
        session: None,
        holder: None,
        shape: Shape::Exclusive,
    };
    let mut t = LeaseTable::recover(
        Limits::default(),
        MonoMs(100),
        Epoch::FIRST,
        9,
        [(name("a"), record)],
        [],
    );
    assert!(matches!(
        t.acquire(MonoMs(5_100), req(&["a"], 2, 5_000, 0, 0))
            .unwrap(),
        AcquireOutcome::NotAcquired(_)
    ));
    let AcquireOutcome::Granted(g) = t
        .acquire(MonoMs(5_101), req(&["a"], 2, 5_000, 0, 0))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        g[0].token,
        tok(10),
        "tokens continue above the stored position"
    );
}

#[test]
fn counter_exhaustion_moves_to_the_next_epoch() {
    let mut t = LeaseTable::new(Limits::default(), Epoch::FIRST, COUNTER_MAX);
    let AcquireOutcome::Granted(g) = t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        g[0].token,
        FencingToken::new(Epoch::new(2).unwrap(), 1).unwrap()
    );
    assert!(g[0].token > tok(COUNTER_MAX));
}

#[test]
fn bad_requests_name_the_rule() {
    let mut t = table();
    let cases: Vec<(AcquireRequest, AcquireError)> = vec![
        (
            req(&["a"], 1, 999, 0, 0),
            AcquireError::TtlOutOfRange {
                ttl_ms: 999,
                ttl_ms_min: 1_000,
                ttl_ms_max: 600_000,
            },
        ),
        (
            req(&["a"], 1, 600_001, 0, 0),
            AcquireError::TtlOutOfRange {
                ttl_ms: 600_001,
                ttl_ms_min: 1_000,
                ttl_ms_max: 600_000,
            },
        ),
        (
            req(&["a"], 1, 1_000, 600_001, 0),
            AcquireError::WaitTooLong {
                wait_ms: 600_001,
                wait_ms_max: 600_000,
            },
        ),
        (req(&[], 1, 1_000, 0, 0), AcquireError::NoResources),
        (
            req(&["a", "a"], 1, 1_000, 0, 0),
            AcquireError::DuplicateResource {
                resource: name("a"),
            },
        ),
    ];
    for (request, expected) in cases {
        assert_eq!(t.acquire(MonoMs(0), request).unwrap_err(), expected);
    }
    assert_eq!(
        t.take_effects(),
        Effects::default(),
        "refused requests change nothing"
    );
}

#[test]
fn waiter_limits_are_enforced() {
    let limits = Limits {
        n_waiters_per_resource_max: 2,
        ..Limits::default()
    };
    let mut t = LeaseTable::new(limits, Epoch::FIRST, 0);
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["a"], 2, 5_000, 1_000, 1))
        .unwrap();
    t.acquire(MonoMs(0), req(&["a"], 3, 5_000, 1_000, 2))
        .unwrap();
    let err = t
        .acquire(MonoMs(0), req(&["a"], 4, 5_000, 1_000, 3))
        .unwrap_err();
    assert_eq!(
        err,
        AcquireError::TooManyWaitersOnResource {
            resource: name("a"),
            n_waiters: 2
        }
    );
}

#[test]
fn list_filters_by_prefix_in_name_order() {
    let mut t = table();
    for (i, r) in ["job:b", "job:a", "other", "job:c"].iter().enumerate() {
        t.acquire(MonoMs(0), req(&[r], i as u8, 5_000, 0, 0))
            .unwrap();
    }
    let names = |v: Vec<LeaseStatus>| {
        v.into_iter()
            .map(|s| s.resource.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(t.list(MonoMs(1), "job:", None, 10)),
        ["job:a", "job:b", "job:c"]
    );
    assert_eq!(
        names(t.list(MonoMs(1), "job:", Some("job:a"), 1)),
        ["job:b"]
    );
    assert_eq!(names(t.list(MonoMs(1), "", None, 10)).len(), 4);
}

// ---- Property test against a reference model -------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        resources: Vec<usize>,
        /// Picks each claim's shape (`shape_of`).
        shapes: Vec<usize>,
        ttl_ms: u64,
        wait_ms: u64,
        on_session: bool,
    },
    Renew {
        resource: usize,
        nth_id: usize,
    },
    Release {
        resource: usize,
        nth_id: usize,
    },
    CancelWait {
        nth: usize,
    },
    Fence {
        resource: usize,
    },
    Advance {
        ms: u64,
    },
    Crash,
    OpenSession {
        ttl_ms: u64,
    },
    KeepAlive,
    CloseSession,
}

const RESOURCES: [&str; 4] = ["r0", "r1", "r2", "r3"];

/// The shapes the model asks for: r0 and r1 are locks taken exclusive or
/// shared, r2 a semaphore of 2 permits, r3 any of an exclusive lock and
/// semaphores of 2 and 3 permits (so that requests of the wrong kind or N
/// meet its holders and waiters).
fn shape_of(resource: usize, pick: usize) -> Shape {
    match resource {
        0 | 1 => [Shape::Exclusive, Shape::Shared][pick % 2],
        2 => Shape::Permits(2),
        _ => [Shape::Exclusive, Shape::Permits(2), Shape::Permits(3)][pick % 3],
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec(0..4usize, 1..3), proptest::collection::vec(0..6usize, 2), 1_000..4_000u64, prop_oneof![Just(0u64), 1..5_000u64], any::<bool>())
            .prop_map(|(resources, shapes, ttl_ms, wait_ms, on_session)| Op::Acquire { resources, shapes, ttl_ms, wait_ms, on_session }),
        3 => (0..4usize, 0..8usize).prop_map(|(resource, nth_id)| Op::Renew { resource, nth_id }),
        3 => (0..4usize, 0..8usize).prop_map(|(resource, nth_id)| Op::Release { resource, nth_id }),
        1 => (0..8usize).prop_map(|nth| Op::CancelWait { nth }),
        1 => (0..4usize).prop_map(|resource| Op::Fence { resource }),
        4 => (1..3_000u64).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Crash),
        1 => (1_000..4_000u64).prop_map(|ttl_ms| Op::OpenSession { ttl_ms }),
        2 => Just(Op::KeepAlive),
        1 => Just(Op::CloseSession),
    ]
}

/// The model's view of one lease: who holds it and until when.
#[derive(Clone, Debug)]
struct ModelLease {
    digest: AcquisitionDigest,
    token: FencingToken,
    ttl_ms: u64,
    /// Unused when the lease is tied to a session.
    expires_at: u64,
    session: Option<AcquisitionDigest>,
    shape: Shape,
}

/// The model's view of a session.
#[derive(Clone, Debug)]
struct ModelSession {
    ttl_ms: u64,
    expires_at: u64,
}

/// A tiny reference model plus a fake disk, checking the table's answers.
struct Harness {
    table: LeaseTable,
    /// An ended session's leases dropped per step (1: every end is partial).
    ends_per_step: usize,
    /// Ended leases (expired or drained) dropped per millisecond.
    drops_per_ms: usize,
    now: u64,
    model: BTreeMap<String, ModelLease>,
    /// Sessions ever opened (ended ones stay, with an expiry in the past).
    sessions: BTreeMap<AcquisitionDigest, ModelSession>,
    /// The id of the session the next session acquire uses.
    session: Option<AcquisitionId>,
    /// Which session each waiter was queued on.
    waiter_sessions: BTreeMap<WaiterId, Option<AcquisitionDigest>>,
    /// What each waiter claims, and how.
    waiter_claims: BTreeMap<WaiterId, Vec<(String, Shape)>>,
    /// Durable state: what a crash leaves.
    disk_leases: BTreeMap<String, LeaseRecord>,
    disk_sessions: BTreeMap<AcquisitionDigest, SessionRecord>,
    disk_tokens: (Epoch, u64),
    /// Lazy writes not yet on disk.
    pending: Vec<Write>,
    /// Each grant: the name its lease is kept under (`model`'s key), its
    /// resource, its id.
    ids: Vec<(String, String, AcquisitionId)>,
    waiters: Vec<WaiterId>,
    last_token: BTreeMap<String, FencingToken>,
    last_token_any: Option<FencingToken>,
    next: u64,
}

impl Harness {
    fn new(ends_per_step: usize, drops_per_ms: usize) -> Self {
        let mut table = table();
        table.set_ends_per_step(ends_per_step);
        table.set_expiry_drops_per_ms(drops_per_ms);
        Self {
            table,
            ends_per_step,
            drops_per_ms,
            now: 0,
            model: BTreeMap::new(),
            sessions: BTreeMap::new(),
            session: None,
            waiter_sessions: BTreeMap::new(),
            waiter_claims: BTreeMap::new(),
            disk_leases: BTreeMap::new(),
            disk_sessions: BTreeMap::new(),
            disk_tokens: (Epoch::FIRST, 0),
            pending: vec![],
            ids: vec![],
            waiters: vec![],
            last_token: BTreeMap::new(),
            last_token_any: None,
            next: 1,
        }
    }

    fn fresh_id(&mut self) -> AcquisitionId {
        self.next += 1;
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next.to_le_bytes());
        AcquisitionId::from_bytes(bytes)
    }

    fn model_free(&self, r: &str) -> bool {
        self.model.get(r).is_none_or(|l| !self.live(l))
    }

    fn expiry(&self, l: &ModelLease) -> u64 {
        match l.session {
            Some(d) => self.sessions[&d].expires_at,
            None => l.expires_at,
        }
    }

    fn live(&self, l: &ModelLease) -> bool {
        self.now < self.expiry(l)
    }

    /// The token of the model's live exclusive lease on `r`, if any.
    fn model_holder(&self, r: &str) -> Option<FencingToken> {
        self.model.get(r).filter(|l| self.live(l)).map(|l| l.token)
    }

    /// The model's live leases on resource `r`: its exclusive one and its
    /// shared holders or permits (kept under holders' names).
    fn holders_of(&self, r: &str) -> Vec<&ModelLease> {
        let slots = format!("{r}{SLOT_SEPARATOR}");
        self.model
            .iter()
            .filter(|(k, l)| (k.as_str() == r || k.starts_with(&slots)) && self.live(l))
            .map(|(_, l)| l)
            .collect()
    }

    /// The tokens of `r`'s live shared holders or permits, in slot order.
    fn slot_tokens(&self, r: &str) -> Vec<FencingToken> {
        let mut slots: Vec<(u32, FencingToken)> = self
            .model
            .iter()
            .filter(|(_, l)| self.live(l))
            .filter_map(|(k, l)| {
                let (owner, slot) = k.rsplit_once(SLOT_SEPARATOR)?;
                (owner == r).then(|| (slot.parse().unwrap(), l.token))
            })
            .collect();
        slots.sort();
        slots.into_iter().map(|(_, t)| t).collect()
    }

    /// Whether the model would make a new request on `asked` wait or be
    /// refused: one of its claims does not fit beside the live holders,
    /// or has a request waiting before it.
    fn model_blocked(&self, asked: &[(String, Shape)]) -> bool {
        asked.iter().any(|(r, shape)| {
            let holders = self.holders_of(r);
            let fits = match shape {
                Shape::Exclusive => holders.is_empty(),
                Shape::Shared => holders.iter().all(|l| l.shape == Shape::Shared),
                Shape::Permits(n) => holders.len() < *n as usize,
            };
            let waited = self.waiter_claims.values().flatten().any(|(c, _)| c == r);
            !fits || waited
        })
    }

    /// What `r` is to the model: its live holders' kind, else its
    /// waiters'.
    fn model_kind(&self, r: &str) -> Option<Kind> {
        let kind = |shape: Shape| match shape {
            Shape::Permits(n) => Kind::Semaphore(n),
            Shape::Exclusive | Shape::Shared => Kind::Lock,
        };
        if let Some(l) = self.holders_of(r).first() {
            return Some(kind(l.shape));
        }
        self.waiter_claims
            .values()
            .flatten()
            .find(|(c, _)| c == r)
            .map(|(_, shape)| kind(*shape))
    }

    fn session_live(&self, d: &AcquisitionDigest) -> bool {
        self.sessions
            .get(d)
            .is_some_and(|s| self.now < s.expires_at)
    }

    fn on_grant(&mut self, g: &Grant, shape: Shape, session: Option<AcquisitionDigest>) {
        if let Some(d) = session {
            assert!(self.session_live(&d), "granted on an ended session");
            assert_eq!(
                g.ttl_ms, self.sessions[&d].ttl_ms,
                "a bound lease carries the session TTL"
            );
        }
        let r = g.resource.as_str().to_string();
        let key = match (shape, g.slot) {
            (Shape::Exclusive, None) => r.clone(),
            (Shape::Shared | Shape::Permits(_), Some(slot)) => {
                g.resource.slot(slot).as_str().to_string()
            }
            other => panic!("{r}: a {shape:?} grant with slot {other:?}"),
        };
        assert!(
            self.model_free(&key),
            "{key:?} granted at {} while the model holds it: {:?}",
            self.now,
            self.model.get(&key)
        );
        // The exclusion rule, against every live holder of the resource.
        let holders = self.holders_of(&r);
        match shape {
            Shape::Exclusive => assert!(holders.is_empty(), "{r}: exclusive beside {holders:?}"),
            Shape::Shared => assert!(
                holders.iter().all(|l| l.shape == Shape::Shared),
                "{r}: shared beside {holders:?}"
            ),
            Shape::Permits(n) => {
                assert!(
                    holders.iter().all(|l| l.shape == shape),
                    "{r}: a permit beside {holders:?}"
                );
                assert!(
                    holders.len() < n as usize,
                    "{r}: permit {} of {n}",
                    holders.len() + 1
                );
                assert!(
                    g.slot.is_some_and(|k| k < n),
                    "{r}: slot {:?} of {n}",
                    g.slot
                );
            }
        }
        if let Some(prev) = self.last_token.get(&r) {
            assert!(
                g.token > *prev,
                "token for {r} did not increase: {} after {}",
                g.token,
                prev
            );
        }
        if let Some(prev) = self.last_token_any {
            assert!(g.token > prev);
        }
        self.last_token.insert(r.clone(), g.token);
        self.last_token_any = Some(g.token);
        self.model.insert(
            key.clone(),
            ModelLease {
                digest: g.acquisition_id.digest(),
                token: g.token,
                ttl_ms: g.ttl_ms,
                expires_at: self.now + g.ttl_ms + 1,
                session,
                shape,
            },
        );
        self.ids.push((key, r, g.acquisition_id));
    }

    /// The shell's job: persist, and check the table never releases a grant without sync.
    fn drain(&mut self) {
        let fx = self.table.take_effects();
        let issued = fx
            .woken
            .iter()
            .any(|(_, w)| matches!(w, WaitResult::Granted(_)))
            || fx
                .events
                .iter()
                .any(|e| matches!(e, Event::Granted { .. } | Event::Fenced { .. }));
        assert!(!issued || fx.sync, "a token was issued without a sync");
        self.pending.extend(fx.writes);
        if fx.sync {
            for w in std::mem::take(&mut self.pending) {
                match w {
                    Write::PutLease { resource, record } => {
                        self.disk_leases.insert(resource.to_string(), record);
                    }
                    Write::DeleteLease { resource } => {
                        self.disk_leases.remove(resource.as_str());
                    }
                    Write::Tokens { epoch, counter } => self.disk_tokens = (epoch, counter),
                    Write::PutSession { record } => {
                        self.disk_sessions.insert(record.digest, record);
                    }
                    Write::DeleteSession { digest } => {
                        self.disk_sessions.remove(&digest);
                    }
                    // This model sends no request ids.
                    Write::LeaseEnded { .. } | Write::Changed(_) => {}
                }
            }
        }
        for (w, result) in fx.woken {
            self.waiters.retain(|x| *x != w);
            let session = self.waiter_sessions.remove(&w).flatten();
            let claims = self.waiter_claims.remove(&w).unwrap_or_default();
            match result {
                WaitResult::Granted(grants) => {
                    for (g, (_, shape)) in grants.iter().zip(&claims) {
                        self.on_grant(g, *shape, session);
                    }
                }
                WaitResult::SessionEnded => {
                    let d = session.expect("only a session's waiter ends with it");
                    assert!(
                        !self.session_live(&d),
                        "waiter withdrawn from a live session"
                    );
                }
                WaitResult::TimedOut(_) => {}
                WaitResult::OverQuota(_) => panic!("the model sets no quota"),
            }
        }
    }

    fn step(&mut self, op: Op) {
        let now = MonoMs(self.now);
        match op {
            Op::Acquire {
                resources,
                shapes,
                ttl_ms,
                wait_ms,
                on_session,
            } => {
                let session = self.session.filter(|_| on_session).map(|id| id.digest());
                let mut claims: Vec<Claim> = vec![];
                for (i, r) in resources.into_iter().enumerate() {
                    let n = name(RESOURCES[r]);
                    if !claims.iter().any(|c| c.resource == n) {
                        let id = self.fresh_id();
                        let shape = shape_of(r, shapes[i % shapes.len()]);
                        claims.push(Claim {
                            resource: n,
                            acquisition_id: id,
                            shape,
                        });
                    }
                }
                let asked: Vec<(String, Shape)> = claims
                    .iter()
                    .map(|c| (c.resource.as_str().to_string(), c.shape))
                    .collect();
                // A claim of another kind or N than its resource's holders
                // or waiters is refused, before anything else is judged.
                let wrong_kind = asked.iter().any(|(r, shape)| {
                    let kind = match shape {
                        Shape::Permits(n) => Kind::Semaphore(*n),
                        Shape::Exclusive | Shape::Shared => Kind::Lock,
                    };
                    self.model_kind(r).is_some_and(|k| k != kind)
                });
                let waiter = WaiterId(self.next);
                let out = self.table.acquire(
                    now,
                    AcquireRequest {
                        claims,
                        term: session.map_or(LeaseTerm::Own { ttl_ms }, LeaseTerm::Session),
                        wait_ms,
                        waiter,
                        holder: None,
                        attempt: None,
                    },
                );
                if wrong_kind {
                    assert!(
                        matches!(
                            out,
                            Err(AcquireError::KindDiffers { .. }
                                | AcquireError::PermitsDiffer { .. })
                        ),
                        "{asked:?} at {}: {out:?}",
                        self.now
                    );
                    self.drain();
                    return;
                }
                assert!(
                    !matches!(
                        out,
                        Err(AcquireError::KindDiffers { .. } | AcquireError::PermitsDiffer { .. })
                    ),
                    "{asked:?} at {}: {out:?}",
                    self.now
                );
                if let Some(d) = session.filter(|d| !self.session_live(d)) {
                    assert_eq!(out, Err(AcquireError::SessionNotOpen), "{d:?}");
                    self.drain();
                    return;
                }
                if let Some(d) = session.filter(|_| out.is_ok()) {
                    // An acquire on a session is also its heartbeat.
                    let s = self.sessions.get_mut(&d).unwrap();
                    s.expires_at = self.now + s.ttl_ms + 1;
                }
                // Hand-offs this call made before judging the request come
                // first.
                self.drain();
                let blocked = self.model_blocked(&asked);
                match out.unwrap() {
                    AcquireOutcome::Granted(grants) => {
                        assert!(!blocked, "{asked:?} granted at {} past the model", self.now);
                        for (g, (_, shape)) in grants.iter().zip(&asked) {
                            self.on_grant(g, *shape, session);
                        }
                    }
                    AcquireOutcome::Queued { waiter } => {
                        assert!(blocked, "{asked:?} queued at {} though free", self.now);
                        self.waiters.push(waiter);
                        self.waiter_sessions.insert(waiter, session);
                        self.waiter_claims.insert(waiter, asked);
                    }
                    AcquireOutcome::NotAcquired(n) => {
                        // Refused only if held per the model (a hand-off to
                        // a waiter in this same call counts), or someone
                        // queues there.
                        assert!(
                            blocked,
                            "{asked:?} refused at {} though free: {n:?}",
                            self.now
                        );
                        if let Some(token) = n.holder_token {
                            let holders = self.holders_of(n.resource.as_str());
                            assert!(
                                holders.iter().any(|l| l.token == token),
                                "refused: {n:?}, the model holds {holders:?}"
                            );
                        }
                    }
                    other @ (AcquireOutcome::Repeated(_) | AcquireOutcome::Ended) => {
                        panic!("a request without an id answered as a repeat: {other:?}")
                    }
                }
            }
            Op::Renew { resource, nth_id } => {
                let Some((key, r, id)) = self.ids.get(nth_id % self.ids.len().max(1)).cloned()
                else {
                    return;
                };
                let _ = resource;
                let expect = self
                    .model
                    .get(&key)
                    .is_some_and(|l| l.digest.matches(&id) && self.live(l));
                let out = self.table.renew(now, &name(&r), &id);
                assert_eq!(
                    matches!(out, RenewOutcome::Renewed { .. }),
                    expect,
                    "renew of {r} at {}",
                    self.now
                );
                if expect {
                    let now = self.now;
                    let l = self.model.get_mut(&key).unwrap();
                    match l.session {
                        // Renewing a bound lease keeps its whole session alive.
                        Some(d) => {
                            let s = self.sessions.get_mut(&d).unwrap();
                            s.expires_at = now + s.ttl_ms + 1;
                        }
                        None => l.expires_at = now + l.ttl_ms + 1,
                    }
                }
                self.drain();
            }
            Op::Release { resource, nth_id } => {
                let Some((key, r, id)) = self.ids.get(nth_id % self.ids.len().max(1)).cloned()
                else {
                    return;
                };
                let _ = resource;
                let expect = self
                    .model
                    .get(&key)
                    .is_some_and(|l| l.digest.matches(&id) && self.live(l));
                let out = self.table.release(now, &name(&r), &id);
                assert_eq!(
                    matches!(out, ReleaseOutcome::Released { .. }),
                    expect,
                    "release of {r}"
                );
                if expect {
                    self.model.remove(&key);
                }
                self.drain();
            }
            Op::CancelWait { nth } => {
                if let Some(w) = self.waiters.get(nth % self.waiters.len().max(1)).copied() {
                    self.table.cancel_wait(now, w);
                    self.waiters.retain(|x| *x != w);
                    self.waiter_claims.remove(&w);
                    self.drain();
                }
            }
            Op::Fence { resource } => {
                let r = RESOURCES[resource];
                let out = self.table.fence(now, &name(r));
                if let Some(prev) = self.last_token_any {
                    assert!(out.token > prev);
                }
                self.last_token_any = Some(out.token);
                self.last_token.insert(r.to_string(), out.token);
                // Every holder goes: the exclusive one, or every shared
                // holder or permit.
                let slots = format!("{r}{SLOT_SEPARATOR}");
                self.model.retain(|k, _| k != r && !k.starts_with(&slots));
                self.drain();
            }
            Op::Advance { ms } => {
                self.now += ms;
                self.table.tick(MonoMs(self.now));
                self.drain();
            }
            Op::Crash => {
                // Lazy writes are lost; waiters are gone with their connections.
                self.pending.clear();
                self.waiters.clear();
                self.waiter_sessions.clear();
                self.waiter_claims.clear();
                let leases: Vec<_> = self
                    .disk_leases
                    .iter()
                    .map(|(r, rec)| (ResourceName::parse_stored(r).unwrap(), rec.clone()))
                    .collect();
                // Every stored session gets its full TTL again; the others are over.
                for s in self.sessions.values_mut() {
                    s.expires_at = s.expires_at.min(self.now);
                }
                for (d, rec) in &self.disk_sessions {
                    self.sessions.insert(
                        *d,
                        ModelSession {
                            ttl_ms: rec.ttl_ms,
                            expires_at: self.now + rec.ttl_ms + 1,
                        },
                    );
                }
                let disk_sessions = &self.disk_sessions;
                self.model = self
                    .disk_leases
                    .iter()
                    .map(|(r, rec)| {
                        (
                            r.clone(),
                            ModelLease {
                                digest: rec.acquisition_digest,
                                token: rec.token,
                                ttl_ms: rec.ttl_ms,
                                expires_at: self.now + rec.ttl_ms + 1,
                                session: rec.session.filter(|d| disk_sessions.contains_key(d)),
                                shape: rec.shape,
                            },
                        )
                    })
                    .collect();
                let (epoch, counter) = self.disk_tokens;
                self.table = LeaseTable::recover(
                    Limits::default(),
                    MonoMs(self.now),
                    epoch,
                    counter,
                    leases,
                    self.disk_sessions.values().cloned().collect::<Vec<_>>(),
                );
                self.table.set_ends_per_step(self.ends_per_step);
                self.table.set_expiry_drops_per_ms(self.drops_per_ms);
            }
            Op::OpenSession { ttl_ms } => {
                let id = self.fresh_id();
                self.table
                    .open_session(now, id.digest(), ttl_ms, None)
                    .unwrap();
                self.drain();
                assert!(
                    self.disk_sessions.contains_key(&id.digest()),
                    "a session is durable before it is answered"
                );
                self.sessions.insert(
                    id.digest(),
                    ModelSession {
                        ttl_ms,
                        expires_at: self.now + ttl_ms + 1,
                    },
                );
                self.session = Some(id);
            }
            Op::KeepAlive => {
                let Some(id) = self.session else { return };
                let d = id.digest();
                let expect = self.session_live(&d);
                let out = self.table.keep_alive(now, d).map(|k| k.ttl_ms);
                assert_eq!(out.is_some(), expect, "keep-alive at {}", self.now);
                if expect {
                    let s = self.sessions.get_mut(&d).unwrap();
                    s.expires_at = self.now + s.ttl_ms + 1;
                    assert_eq!(out, Some(s.ttl_ms));
                }
                self.drain();
            }
            Op::CloseSession => {
                let Some(id) = self.session else { return };
                let d = id.digest();
                let expect = self.session_live(&d);
                assert_eq!(self.table.close_session(now, d), expect);
                if expect {
                    self.sessions.get_mut(&d).unwrap().expires_at = self.now;
                }
                self.drain();
            }
        }
        let live = self.model.values().filter(|l| self.live(l)).count();
        assert_eq!(self.table.n_leases(), live, "lease count");
        // At most one unexpired lease per resource, and the table agrees
        // with the model. A listing changes nothing, so an ended lease still
        // to be dropped stays for the next operation to meet; a status of
        // one resource (in turn) drops it first.
        let listed = self.table.list(MonoMs(self.now), "", None, RESOURCES.len());
        self.drain();
        assert!(
            listed.iter().all(|s| s.resource.split_slot().is_none()),
            "a holder's name is never listed"
        );
        for r in RESOURCES {
            let status = listed.iter().find(|s| s.resource.as_str() == r);
            assert_eq!(
                status.and_then(|s| s.holder_token),
                self.model_holder(r),
                "listed holder of {r} at {}",
                self.now
            );
            let slots: Vec<_> = status
                .map(|s| s.slots.iter().map(|x| x.token).collect())
                .unwrap_or_default();
            assert_eq!(
                slots,
                self.slot_tokens(r),
                "listed slots of {r} at {}",
                self.now
            );
        }
        let asked = RESOURCES[self.next as usize % RESOURCES.len()];
        let status = self.table.status(MonoMs(self.now), &name(asked));
        // Asking may hand the resource to a waiter, if an ended lease on it
        // was still to be dropped: take that grant in first.
        self.drain();
        let model = self.model_holder(asked);
        assert_eq!(
            status.holder_token, model,
            "holder of {asked} at {}",
            self.now
        );
        let slots: Vec<_> = status.slots.iter().map(|x| x.token).collect();
        assert_eq!(
            slots,
            self.slot_tokens(asked),
            "slots of {asked} at {}",
            self.now
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn table_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut h = Harness::new(crate::ENDS_PER_STEP, crate::ENDS_PER_STEP);
        for op in ops {
            h.step(op);
        }
    }

    /// The same model, with an ended session's leases and the expired ones
    /// dropped one per step: every call in between must find them gone
    /// already, and a crash between steps must lose nothing acknowledged.
    #[test]
    fn table_matches_model_when_ends_take_many_steps(ops in proptest::collection::vec(op(), 1..120)) {
        let mut h = Harness::new(1, crate::ENDS_PER_STEP);
        for op in ops {
            h.step(op);
        }
    }

    /// The same again with the drops paced below a step's size, as while
    /// the store is behind: expiry and session drains share two drops a
    /// millisecond, so some steps drop nothing and the drains wait.
    #[test]
    fn table_matches_model_when_drops_are_paced(ops in proptest::collection::vec(op(), 1..120)) {
        let mut h = Harness::new(4, 2);
        for op in ops {
            h.step(op);
        }
    }
}

#[test]
fn session_leases_live_by_heartbeat_and_end_together() {
    let mut t = table();
    let s = id(90).digest();
    t.open_session(MonoMs(0), s, 3_000, None).unwrap();
    let bound = |names: &[&str], first: u8, wait_ms: u64, waiter: u64| AcquireRequest {
        term: LeaseTerm::Session(s),
        ..req(names, first, 1, wait_ms, waiter)
    };
    let AcquireOutcome::Granted(g) = t.acquire(MonoMs(0), bound(&["a", "b"], 1, 0, 0)).unwrap()
    else {
        panic!("free resources must be granted")
    };
    assert!(
        g.iter().all(|g| g.ttl_ms == 3_000),
        "bound leases carry the session TTL"
    );
    // A second client waits for "a"; the session itself waits for "c".
    assert!(matches!(
        t.acquire(MonoMs(0), req(&["a"], 5, 5_000, 60_000, 7)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    t.acquire(MonoMs(0), req(&["c"], 6, 60_000, 0, 0)).unwrap();
    assert!(matches!(
        t.acquire(MonoMs(0), bound(&["c"], 8, 60_000, 8)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    // Heartbeats keep every bound lease, with no renewal of its own.
    for at in [2_000, 4_000, 6_000] {
        assert_eq!(t.keep_alive(MonoMs(at), s).map(|k| k.ttl_ms), Some(3_000));
    }
    assert_eq!(t.status(MonoMs(7_000), &name("a")).remaining_ms, 2_000);
    // A fenced bound lease is reported once, on the next heartbeat.
    let fenced = t.fence(MonoMs(7_000), &name("b"));
    let kept = t.keep_alive(MonoMs(7_000), s).unwrap();
    assert_eq!(kept.revoked, vec![(name("b"), fenced.revoked.unwrap())]);
    assert!(t.keep_alive(MonoMs(7_000), s).unwrap().revoked.is_empty());
    t.take_effects();
    // Silence: the session ends one tick past 10_000, its waiter first, then its leases.
    t.tick(MonoMs(10_001));
    let fx = t.take_effects();
    assert!(fx.woken.contains(&(WaiterId(8), WaitResult::SessionEnded)));
    assert!(fx
        .woken
        .iter()
        .any(|(w, r)| *w == WaiterId(7) && matches!(r, WaitResult::Granted(_))));
    assert!(fx.writes.contains(&Write::DeleteSession { digest: s }));
    assert_eq!(t.keep_alive(MonoMs(10_001), s), None);
    assert_eq!(
        t.acquire(MonoMs(10_001), bound(&["d"], 9, 0, 0)),
        Err(AcquireError::SessionNotOpen)
    );
    assert_eq!(
        t.status(MonoMs(10_001), &name("a"))
            .holder_token
            .map(|t| t > fenced.token),
        Some(true),
        "the waiter got a"
    );
}

#[test]
fn a_big_session_ends_at_once_for_callers_and_in_bounded_steps_for_the_table() {
    let mut t = table();
    t.set_ends_per_step(10);
    let s = id(92).digest();
    t.open_session(MonoMs(0), s, 3_000, None).unwrap();
    let names: Vec<String> = (0..25).map(|i| format!("big:{i:02}")).collect();
    for (i, chunk) in names.chunks(5).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let bound = AcquireRequest {
            term: LeaseTerm::Session(s),
            ..req(&refs, 10 * i as u8 + 1, 1, 0, 0)
        };
        assert!(matches!(
            t.acquire(MonoMs(0), bound),
            Ok(AcquireOutcome::Granted(_))
        ));
    }
    // A waiter on the last lease the drain would reach in name order.
    assert!(matches!(
        t.acquire(MonoMs(0), req(&["big:24"], 200, 5_000, 60_000, 3)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    t.take_effects();
    assert!(t.close_session(MonoMs(100), s));
    let fx = t.take_effects();
    let dropped = |fx: &Effects| {
        fx.writes
            .iter()
            .filter(|w| matches!(w, Write::DeleteLease { .. }))
            .count()
    };
    assert_eq!(
        dropped(&fx),
        10 + 1,
        "the first step drops one batch, and the waited resource ahead of it"
    );
    assert!(fx.writes.contains(&Write::DeleteSession { digest: s }));
    assert!(
        fx.woken
            .iter()
            .any(|(w, r)| *w == WaiterId(3) && matches!(r, WaitResult::Granted(_))),
        "a resource with a waiter is handed over in the first step"
    );
    assert_eq!(
        t.n_leases(),
        1,
        "every lease of the session is gone at once (one granted to the waiter)"
    );
    assert_eq!(t.n_draining(), 14);
    assert_eq!(
        t.next_deadline(),
        Some(MonoMs(101)),
        "the next batch a step later"
    );
    // Before its batch, a lease of the session is free to anyone.
    assert_eq!(t.status(MonoMs(100), &name("big:20")).holder_token, None);
    assert!(matches!(
        t.acquire(MonoMs(100), req(&["big:20"], 201, 5_000, 0, 0)),
        Ok(AcquireOutcome::Granted(_))
    ));
    assert_eq!(t.n_draining(), 13);
    assert_eq!(dropped(&t.take_effects()), 1, "dropped by the acquire");
    t.tick(MonoMs(101));
    assert_eq!(dropped(&t.take_effects()), 10);
    t.tick(MonoMs(102));
    assert_eq!(dropped(&t.take_effects()), 3);
    assert_eq!(t.n_draining(), 0);
    assert_eq!(t.next_deadline().map(|d| d > MonoMs(102)), Some(true));
    assert_eq!(t.n_leases(), 2, "the two granted since");
}

#[test]
fn a_session_resumes_and_closes_only_for_who_may_hold_all_it_holds() {
    let mut t = table();
    let s = id(91).digest();
    t.open_session(MonoMs(0), s, 3_000, None).unwrap();
    let bound = AcquireRequest {
        term: LeaseTerm::Session(s),
        ..req(&["x:1", "y:1"], 1, 1, 0, 0)
    };
    assert!(matches!(
        t.acquire(MonoMs(0), bound),
        Ok(AcquireOutcome::Granted(_))
    ));
    let fenced = t.fence(MonoMs(0), &name("y:1"));
    let only_x = &holding("x:");
    // "y:1" is no longer held but still to be reported: it counts.
    assert_eq!(t.resume(MonoMs(2_000), s, only_x), Resumed::Refused);
    // The refusal changed nothing: the TTL still runs from 0, and the
    // revoked lease is still reported to the session's own holder.
    assert_eq!(t.status(MonoMs(2_000), &name("x:1")).remaining_ms, 1_000);
    let Resumed::Kept(kept) = t.resume(MonoMs(2_500), s, &SessionCheck::anyone()) else {
        panic!("an unrestricted resume keeps the session")
    };
    assert_eq!(kept.revoked, vec![(name("y:1"), fenced.revoked.unwrap())]);
    assert_eq!(t.status(MonoMs(2_500), &name("x:1")).remaining_ms, 3_000);
    // Now only "x:1" is held.
    assert!(matches!(
        t.resume(MonoMs(2_500), s, only_x),
        Resumed::Kept(_)
    ));
    assert_eq!(t.resume(MonoMs(2_500), s, &holding("y:")), Resumed::Refused);
    // Closing releases what the session holds: judged the same way.
    let only_y = &holding("y:");
    assert_eq!(t.close_session_as(MonoMs(2_500), s, only_y), None);
    assert!(t.status(MonoMs(2_500), &name("x:1")).holder_token.is_some());
    assert_eq!(t.close_session_as(MonoMs(2_500), s, only_x), Some(true));
    assert_eq!(t.status(MonoMs(2_500), &name("x:1")).holder_token, None);
    assert_eq!(t.close_session_as(MonoMs(2_500), s, only_y), Some(false));
    assert_eq!(
        t.resume(MonoMs(6_000), s, &SessionCheck::anyone()),
        Resumed::NotOpen
    );
}

fn holding(prefix: &'static str) -> SessionCheck {
    SessionCheck {
        may_act_for: Box::new(|_| true),
        may_hold: Box::new(move |r: &ResourceName| r.as_str().starts_with(prefix)),
    }
}

#[test]
fn only_the_opener_may_resume_or_close_a_session() {
    let mut t = table();
    let s = id(92).digest();
    t.open_session(MonoMs(0), s, 3_000, Some("alice".into()))
        .unwrap();
    let as_who = |who: &'static str| SessionCheck {
        may_act_for: Box::new(move |opener| opener.is_none_or(|o| o == who)),
        may_hold: Box::new(|_| true),
    };
    // An empty session: nothing to hold, so only the opener rule decides.
    assert_eq!(t.resume(MonoMs(1_000), s, &as_who("bob")), Resumed::Refused);
    assert_eq!(t.close_session_as(MonoMs(1_000), s, &as_who("bob")), None);
    assert!(matches!(
        t.resume(MonoMs(1_000), s, &as_who("alice")),
        Resumed::Kept(_)
    ));
    // The opener is durable: a snapshot carries it.
    let stored: Vec<_> = t.sessions().collect();
    assert_eq!(stored[0].opener.as_deref(), Some("alice"));
    assert_eq!(
        t.close_session_as(MonoMs(1_000), s, &as_who("alice")),
        Some(true)
    );
}

#[test]
fn a_holder_description_travels_with_its_lease() {
    let mut t = table();
    let holder = Holder::parse("alice@build-3 pid 42").unwrap();
    let first = AcquireRequest {
        holder: Some(holder.clone()),
        ..req(&["a"], 1, 5_000, 0, 0)
    };
    t.acquire(MonoMs(0), first).unwrap();
    let fx = t.take_effects();
    let Write::PutLease { record, .. } = &fx.writes[0] else {
        panic!("a grant writes its lease first")
    };
    assert_eq!(record.holder.as_ref(), Some(&holder));
    assert_eq!(t.status(MonoMs(1), &name("a")).holder, Some(holder.clone()));
    assert_eq!(
        t.list(MonoMs(1), "", None, 10)[0].holder,
        Some(holder.clone())
    );
    // A waiter's description reaches its grant; the ending lease's is on
    // the release event.
    let second = AcquireRequest {
        holder: Some(Holder::parse("bob").unwrap()),
        ..req(&["a"], 2, 5_000, 10_000, 7)
    };
    t.acquire(MonoMs(2), second).unwrap();
    t.release(MonoMs(3), &name("a"), &id(1));
    let fx = t.take_effects();
    let changes: Vec<_> = fx
        .events
        .iter()
        .filter_map(HolderChange::of)
        .map(|c| (c.kind, c.holder.map(|h| h.to_string())))
        .collect();
    assert_eq!(
        changes,
        vec![
            (HolderChange::Released, Some("alice@build-3 pid 42".into())),
            (HolderChange::HandedOff, Some("bob".into())),
        ]
    );
    // Recovery keeps it.
    let leases: Vec<_> = t.leases().map(|(r, l)| (r.clone(), l)).collect();
    let mut back = LeaseTable::recover(
        Limits::default(),
        MonoMs(0),
        Epoch::FIRST,
        10,
        leases,
        Vec::new(),
    );
    assert_eq!(
        back.status(MonoMs(0), &name("a"))
            .holder
            .map(|h| h.to_string()),
        Some("bob".into())
    );
}

#[test]
fn status_says_the_last_token_issued_to_any_resource() {
    let mut t = table();
    assert_eq!(t.status(MonoMs(0), &name("x")).issued_through, tok(0));
    t.acquire(MonoMs(0), req(&["a"], 1, 5_000, 0, 0)).unwrap();
    t.acquire(MonoMs(0), req(&["b"], 2, 5_000, 0, 1)).unwrap();
    t.fence(MonoMs(0), &name("c"));
    let free = t.status(MonoMs(0), &name("x"));
    assert_eq!(free.holder_token, None);
    assert_eq!(
        free.issued_through,
        tok(3),
        "two grants and a fence elsewhere"
    );
    assert_eq!(t.status(MonoMs(0), &name("a")).issued_through, tok(3));
}

mod blockers;
mod expiry;
mod quotas;
mod repeats;
mod shapes;
