//! Shared locks and semaphores (`shape.rs`): who may hold a resource
//! beside whom, the line they wait in, the slots their leases take, and
//! the requests of the wrong kind refused with nothing changed.

use super::*;

/// A request for `resources` taken as `shape`, ids from `first_id`.
fn shaped(
    resources: &[&str],
    shape: Shape,
    first_id: u8,
    wait_ms: u64,
    waiter: u64,
) -> AcquireRequest {
    let mut r = req(resources, first_id, 10_000, wait_ms, waiter);
    for c in &mut r.claims {
        c.shape = shape;
    }
    r
}

fn granted(out: Result<AcquireOutcome, AcquireError>) -> Vec<Grant> {
    match out {
        Ok(AcquireOutcome::Granted(g)) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The grants the table woke waiters with, by waiter.
fn woken(t: &mut LeaseTable) -> Vec<(u64, Vec<Grant>)> {
    t.take_effects()
        .woken
        .into_iter()
        .filter_map(|(w, r)| match r {
            WaitResult::Granted(g) => Some((w.0, g)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_semaphore_admits_n_holders_each_in_the_lowest_free_slot() {
    let mut t = table();
    let mut tokens = vec![];
    for i in 0..3 {
        let g = granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(3), i, 0, 0)));
        assert_eq!(g[0].slot, Some(u32::from(i)));
        tokens.push(g[0].token);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]));
    let Ok(AcquireOutcome::NotAcquired(n)) =
        t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(3), 9, 0, 0))
    else {
        panic!("a fourth permit of three")
    };
    assert_eq!(
        n.holder_token,
        Some(tokens[0]),
        "the longest-held permit is shown first"
    );
    let listed: Vec<FencingToken> = n.blockers[0].holders.iter().map(|h| h.token).collect();
    assert_eq!(
        (listed, n.blockers[0].n_holders),
        (tokens.clone(), 3),
        "every permit in the way"
    );
    // The holder of slot 1 leaves: the next permit takes slot 1, above
    // every token before.
    assert!(matches!(
        t.release(MonoMs(1), &name("jobs"), &id(1)),
        ReleaseOutcome::Released { .. }
    ));
    let g = granted(t.acquire(MonoMs(1), shaped(&["jobs"], Shape::Permits(3), 10, 0, 0)));
    assert_eq!(g[0].slot, Some(1));
    assert!(g[0].token > tokens[2]);
    let status = t.status(MonoMs(1), &name("jobs"));
    assert_eq!(status.kind, Some(Kind::Semaphore(3)));
    assert_eq!(status.holder_token, None);
    assert_eq!(
        status
            .slots
            .iter()
            .map(|s| (s.slot, s.token))
            .collect::<Vec<_>>(),
        vec![(0, tokens[0]), (1, g[0].token), (2, tokens[2])]
    );
    assert_eq!(t.n_leases(), 3);
    // Renewing and releasing go by acquisition id, whatever the slot.
    assert!(matches!(
        t.renew(MonoMs(2), &name("jobs"), &id(2)),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        t.release(MonoMs(2), &name("jobs"), &id(1)),
        ReleaseOutcome::NotHeld
    );
    let listed = t.list(MonoMs(2), "", None, 10);
    assert_eq!(
        listed.len(),
        1,
        "one resource, its holders inside: {listed:?}"
    );
}

#[test]
fn permits_are_handed_on_first_come_first_served_as_they_free() {
    let mut t = table();
    for i in 0..2 {
        granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(2), i, 0, 0)));
    }
    for (i, w) in [(10, 100), (11, 101), (12, 102)] {
        assert!(matches!(
            t.acquire(
                MonoMs(0),
                shaped(&["jobs"], Shape::Permits(2), i, 20_000, w)
            ),
            Ok(AcquireOutcome::Queued { .. })
        ));
    }
    t.take_effects();
    t.release(MonoMs(1), &name("jobs"), &id(1));
    let woken_now = woken(&mut t);
    assert_eq!(woken_now.len(), 1);
    assert_eq!((woken_now[0].0, woken_now[0].1[0].slot), (100, Some(1)));
    // Expiries hand permits on too, in line order: both permits held
    // since 0 and 1 end at 10,002.
    t.tick(MonoMs(10_002));
    let woken_now = woken(&mut t);
    assert_eq!(
        woken_now
            .iter()
            .map(|(w, g)| (*w, g[0].slot))
            .collect::<Vec<_>>(),
        vec![(101, Some(0)), (102, Some(1))]
    );
}

#[test]
fn shared_holders_share_and_a_waiting_writer_holds_back_later_readers() {
    let mut t = table();
    let r1 = granted(t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 1, 0, 0)));
    let r2 = granted(t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 2, 0, 0)));
    assert_eq!((r1[0].slot, r2[0].slot), (Some(0), Some(1)));
    // A writer waits for the readers; a reader after it waits behind it.
    assert!(matches!(
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Exclusive, 3, 5_000, 30)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    assert!(matches!(
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 4, 0, 0)),
        Ok(AcquireOutcome::NotAcquired(_))
    ));
    assert!(matches!(
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 5, 5_000, 50)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    assert!(matches!(
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 6, 5_000, 60)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    t.take_effects();
    t.release(MonoMs(1), &name("doc"), &id(1));
    assert!(woken(&mut t).is_empty(), "one reader still holds it");
    t.release(MonoMs(1), &name("doc"), &id(2));
    let writer = woken(&mut t);
    assert_eq!(writer.len(), 1);
    assert_eq!((writer[0].0, writer[0].1[0].slot), (30, None));
    assert!(writer[0].1[0].token > r2[0].token);
    // The writer leaves: both readers behind it get it together.
    t.release(MonoMs(2), &name("doc"), &id(3));
    let readers = woken(&mut t);
    assert_eq!(
        readers
            .iter()
            .map(|(w, g)| (*w, g[0].slot))
            .collect::<Vec<_>>(),
        vec![(50, Some(0)), (60, Some(1))]
    );
    assert!(readers[0].1[0].token > writer[0].1[0].token);
}

#[test]
fn a_request_of_another_kind_or_n_is_refused_naming_both_and_changes_nothing() {
    let mut t = table();
    granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(3), 1, 0, 0)));
    granted(t.acquire(MonoMs(0), shaped(&["lock"], Shape::Shared, 2, 0, 0)));
    t.take_effects();
    let refused = [
        (
            shaped(&["jobs"], Shape::Permits(4), 3, 0, 0),
            "semaphore of 3 permits",
        ),
        (
            shaped(&["jobs"], Shape::Exclusive, 3, 0, 0),
            "an exclusive lock",
        ),
        (shaped(&["jobs"], Shape::Shared, 3, 0, 0), "a shared lock"),
        (shaped(&["lock"], Shape::Permits(2), 3, 0, 0), "is a lock"),
        (
            shaped(&["new"], Shape::Permits(0), 3, 0, 0),
            "from 1 to 4096",
        ),
        (
            shaped(&["new"], Shape::Permits(PERMITS_MAX + 1), 3, 0, 0),
            "not 4097",
        ),
        // All or nothing: a free name beside a wrong one takes nothing.
        (
            AcquireRequest {
                claims: vec![
                    Claim::exclusive(name("free"), id(3)),
                    Claim {
                        resource: name("jobs"),
                        acquisition_id: id(4),
                        shape: Shape::Permits(2),
                    },
                ],
                ..req(&["x"], 3, 10_000, 0, 0)
            },
            "asks for 2",
        ),
    ];
    for (request, words) in refused {
        let err = t.acquire(MonoMs(1), request).unwrap_err();
        assert!(err.to_string().contains(words), "{err}");
        let fx = t.take_effects();
        assert!(fx.writes.is_empty() && !fx.sync, "nothing changes: {fx:?}");
    }
    assert_eq!(t.n_leases(), 2);
    assert_eq!(t.status(MonoMs(1), &name("free")).kind, None);
    // Once nothing holds or waits on it, a name may be anything again.
    t.release(MonoMs(2), &name("jobs"), &id(1));
    granted(t.acquire(MonoMs(2), shaped(&["jobs"], Shape::Exclusive, 5, 0, 0)));
}

#[test]
fn lowering_n_revokes_nothing_and_raising_it_grants_the_line() {
    let mut t = table();
    for i in 0..3 {
        granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(3), i, 0, 0)));
    }
    assert_eq!(t.set_permits(MonoMs(0), &name("jobs"), 1), Ok(3));
    assert_eq!(t.n_leases(), 3, "no permit is revoked");
    assert!(matches!(
        t.acquire(
            MonoMs(0),
            shaped(&["jobs"], Shape::Permits(1), 5, 5_000, 50)
        ),
        Ok(AcquireOutcome::Queued { .. })
    ));
    t.take_effects();
    t.release(MonoMs(1), &name("jobs"), &id(0));
    t.release(MonoMs(1), &name("jobs"), &id(1));
    assert!(woken(&mut t).is_empty(), "one permit is still held, of one");
    assert_eq!(t.set_permits(MonoMs(2), &name("jobs"), 2), Ok(1));
    let g = woken(&mut t);
    assert_eq!((g[0].0, g[0].1[0].slot), (50, Some(0)));
    assert!(matches!(
        t.set_permits(MonoMs(2), &name("other"), 2),
        Err(SetPermitsError::NotASemaphore { .. })
    ));
    assert!(matches!(
        t.set_permits(MonoMs(2), &name("jobs"), 0),
        Err(SetPermitsError::OutOfRange { .. })
    ));
}

#[test]
fn a_fence_revokes_every_holder_and_a_restart_keeps_them_all() {
    let mut t = table();
    let mut last = None;
    for i in 0..2 {
        last =
            Some(granted(t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, i, 0, 0)))[0].token);
    }
    for i in 2..4 {
        granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(5), i, 0, 0)));
    }
    // A restart from the leases as stored: the same holders, slots and N.
    let leases: Vec<_> = t.leases().map(|(r, l)| (r.clone(), l)).collect();
    assert_eq!(leases.len(), 4);
    let (epoch, counter) = t.last_token();
    let mut t = LeaseTable::recover(Limits::default(), MonoMs(0), epoch, counter, leases, vec![]);
    let jobs = t.status(MonoMs(0), &name("jobs"));
    assert_eq!((jobs.kind, jobs.slots.len()), (Some(Kind::Semaphore(5)), 2));
    assert_eq!(
        granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(5), 9, 0, 0)))[0].slot,
        Some(2)
    );
    assert!(t
        .acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(4), 10, 0, 0))
        .is_err());
    let fenced = t.fence(MonoMs(1), &name("doc"));
    assert_eq!(fenced.revoked, last, "the highest revoked token");
    assert_eq!(t.status(MonoMs(1), &name("doc")).slots, vec![]);
    assert_eq!(t.n_leases(), 3);
    let g = granted(t.acquire(MonoMs(1), shaped(&["doc"], Shape::Exclusive, 11, 0, 0)));
    assert!(g[0].token > fenced.token);
}

#[test]
fn a_duplicate_of_a_granted_request_never_holds_a_second_slot() {
    let mut t = table();
    let first = granted(t.acquire(MonoMs(0), shaped(&["jobs"], Shape::Permits(3), 1, 0, 0)));
    // The same request again (the network delivered it twice; no request
    // id): it waits as behind its own lease, and is not granted another
    // slot while the first is held.
    assert!(matches!(
        t.acquire(MonoMs(1), shaped(&["jobs"], Shape::Permits(3), 1, 0, 0)),
        Ok(AcquireOutcome::NotAcquired(_))
    ));
    assert!(matches!(
        t.acquire(
            MonoMs(1),
            shaped(&["jobs"], Shape::Permits(3), 1, 5_000, 10)
        ),
        Ok(AcquireOutcome::Queued { .. })
    ));
    t.take_effects();
    assert!(woken(&mut t).is_empty());
    assert_eq!(t.status(MonoMs(2), &name("jobs")).slots.len(), 1);
    // Once the first is gone, the copy gets a lease of its own.
    t.release(MonoMs(3), &name("jobs"), &id(1));
    let copy = woken(&mut t);
    assert_eq!(copy.len(), 1);
    assert!(copy[0].1[0].token > first[0].token);
    assert_eq!(t.status(MonoMs(3), &name("jobs")).slots.len(), 1);
}

#[test]
fn a_refused_writer_is_told_every_reader_up_to_the_listing_limit() {
    let mut t = table();
    let n_readers = BLOCKING_HOLDERS_MAX as u8 + 4;
    let mut tokens = vec![];
    for i in 0..n_readers {
        let g = granted(t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, i, 0, 0)));
        tokens.push(g[0].token);
    }
    let Ok(AcquireOutcome::NotAcquired(n)) =
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Exclusive, 200, 0, 0))
    else {
        panic!("a writer beside readers")
    };
    let b = &n.blockers[0];
    assert_eq!(b.n_holders, u64::from(n_readers));
    let listed: Vec<FencingToken> = b.holders.iter().map(|h| h.token).collect();
    assert_eq!(
        listed,
        tokens[..BLOCKING_HOLDERS_MAX],
        "the longest held first"
    );
    // A reader behind a waiting writer is held back by the line, not by
    // the readers: no holder in its way, one waiter ahead.
    assert!(matches!(
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Exclusive, 201, 5_000, 7)),
        Ok(AcquireOutcome::Queued { .. })
    ));
    let Ok(AcquireOutcome::NotAcquired(n)) =
        t.acquire(MonoMs(0), shaped(&["doc"], Shape::Shared, 202, 0, 0))
    else {
        panic!("a reader behind a waiting writer")
    };
    assert_eq!(
        (n.blockers[0].holders.len(), n.blockers[0].n_waiters_ahead),
        (0, 1)
    );
}
