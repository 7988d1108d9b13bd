use super::*;
use crate::engine::Engine;
use baton_core::{AcquireRequest, AcquisitionId, ResourceName};
use baton_testkit::store::MemStore;

/// An engine on an in-memory store, and its metrics.
fn start() -> (
    Arc<Metrics>,
    crate::engine::EngineHandle,
    std::thread::JoinHandle<Result<(), baton_store::StoreError>>,
) {
    start_on(Box::new(MemStore::default()))
}

fn start_on(
    store: Box<dyn LeaseStore>,
) -> (
    Arc<Metrics>,
    crate::engine::EngineHandle,
    std::thread::JoinHandle<Result<(), baton_store::StoreError>>,
) {
    let metrics = Arc::new(Metrics::default());
    let (handle, thread) = Engine::start(
        store,
        crate::engine::Bounds::with_quotas(Arc::default()),
        metrics.clone(),
        Arc::default(),
    )
    .unwrap();
    (metrics, handle, thread)
}

#[test]
fn ended_leases_drop_slower_while_the_committer_is_behind() {
    let m = Metrics::default();
    assert_eq!(expiry_drops_per_ms(&m), EXPIRY_DROPS_PER_MS);
    m.commit_queue_writes.set(pipeline::LAZY_WRITES_MAX as i64);
    assert_eq!(
        expiry_drops_per_ms(&m),
        EXPIRY_DROPS_PER_MS,
        "one lazy batch in the queue is not behind"
    );
    m.commit_queue_writes.inc();
    assert_eq!(
        expiry_drops_per_ms(&m),
        EXPIRY_DROPS_PER_MS_WHILE_COMMITS_BEHIND
    );
}

/// A big session's end drains at the expiry's pace: slowly while
/// commits are behind, and `baton_leases_ending` counts what is left.
#[test]
fn a_closed_session_drains_at_the_pace_and_the_gauge_counts_down() {
    const LEASES: usize = 10_000;
    let (metrics, handle, thread) = start();
    let digest = AcquisitionId::from_bytes([7; 16]).digest();
    let (reply, rx) = oneshot::channel();
    assert!(handle.send(Command::OpenSession {
        digest,
        ttl_ms: 60_000,
        opener: None,
        reply,
    }));
    rx.blocking_recv().unwrap().unwrap();
    for chunk in 0..LEASES.div_ceil(64) {
        let claims = (chunk * 64..((chunk + 1) * 64).min(LEASES))
            .map(|i| {
                let resource = ResourceName::parse(&format!("drain-{i:05}")).unwrap();
                let mut id = [1; 16];
                id[..8].copy_from_slice(&(i as u64).to_be_bytes());
                baton_core::Claim::exclusive(resource, AcquisitionId::from_bytes(id))
            })
            .collect();
        let request = AcquireRequest {
            claims,
            term: baton_core::LeaseTerm::Session(digest),
            ..AcquireRequest::single(
                ResourceName::parse("unused").unwrap(),
                AcquisitionId::from_bytes([0; 16]),
                60_000,
            )
        };
        let (reply, rx) = oneshot::channel();
        assert!(handle.send(Command::Acquire { request, reply }));
        assert!(matches!(
            rx.blocking_recv().unwrap(),
            Ok(AcquireReply::Granted { .. })
        ));
    }
    // As if commits were far behind: 32 drops a millisecond.
    metrics.commit_queue_writes.set(1_000_000);
    let (reply, rx) = oneshot::channel();
    let sent = std::time::Instant::now();
    assert!(handle.send(Command::CloseSession {
        digest,
        check: baton_core::SessionCheck::anyone(),
        reply,
    }));
    assert_eq!(rx.blocking_recv().unwrap(), Some(true));
    assert_eq!(metrics.leases.get(), 0, "gone for every caller at once");
    let left = metrics.leases_ending.get();
    assert!(
        left > (LEASES / 2) as i64,
        "{left} of {LEASES} left to drop after the close, at 32 a millisecond"
    );
    while metrics.leases_ending.get() > 0 {
        assert!(
            sent.elapsed() < std::time::Duration::from_secs(30),
            "the drain stalled at {}",
            metrics.leases_ending.get()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // A bound, not a speed: at most 32 a millisecond, 10,000 drops
    // span at least 312 milliseconds of the engine's clock.
    let took = sent.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(300),
        "drained in {took:?}: faster than the pace allows"
    );
    assert!(handle.send(Command::Shutdown));
    thread.join().unwrap().unwrap();
}

#[test]
fn the_commit_queue_gauge_is_back_to_zero_once_every_write_is_committed() {
    let (metrics, handle, thread) = start();
    for i in 0..20u8 {
        let resource = ResourceName::parse(&format!("queue-{i}")).unwrap();
        let request = AcquireRequest::single(resource, AcquisitionId::from_bytes([i; 16]), 60_000);
        let (reply, rx) = oneshot::channel();
        assert!(handle.send(Command::Acquire { request, reply }));
        // A grant is answered once its commit is durable.
        assert!(matches!(
            rx.blocking_recv().unwrap(),
            Ok(AcquireReply::Granted { .. })
        ));
        assert_eq!(metrics.commit_queue_writes.get(), 0, "after grant {i}");
    }
    let (reply, _rx) = oneshot::channel();
    let id = AcquisitionId::from_bytes([0; 16]);
    let resource = ResourceName::parse("queue-0").unwrap();
    handle.send(Command::Release {
        resource,
        id,
        reply,
    });
    assert!(handle.send(Command::Shutdown));
    thread.join().unwrap().unwrap();
    assert_eq!(
        metrics.commit_queue_writes.get(),
        0,
        "the lazy release, flushed at the stop"
    );
}

/// A store that keeps two commits in flight and finishes each when the
/// test says so (applying its writes at once).
struct HeldStore {
    inner: MemStore,
    held: Held,
}

/// The outcomes a [`HeldStore`] waits to report, oldest first.
#[derive(Clone, Default)]
struct Held(
    Arc<(
        std::sync::Mutex<std::collections::VecDeque<baton_store::CommitDone>>,
        std::sync::Condvar,
    )>,
);

impl Held {
    /// Waits until `n` commits are in flight.
    fn wait_for(&self, n: usize) {
        let (queue, started) = &*self.0;
        let queue = queue.lock().unwrap();
        let _queue = started.wait_while(queue, |q| q.len() < n).unwrap();
    }

    fn in_flight(&self) -> usize {
        self.0 .0.lock().unwrap().len()
    }

    /// Reports the oldest commit's outcome.
    fn finish(&self, outcome: Result<(), StoreError>) {
        let done = self
            .0
             .0
            .lock()
            .unwrap()
            .pop_front()
            .expect("a commit in flight");
        done(outcome);
    }
}

impl LeaseStore for HeldStore {
    fn load(&self) -> Result<baton_store::Stored, StoreError> {
        self.inner.load()
    }

    fn commit(&mut self, writes: &[baton_core::Write]) -> Result<(), StoreError> {
        self.inner.commit(writes)
    }

    fn commits_in_flight_max(&self) -> usize {
        2
    }

    fn start_commit(&mut self, writes: &[baton_core::Write], done: baton_store::CommitDone) {
        self.inner.commit(writes).unwrap();
        let (queue, started) = &*self.held.0;
        queue.lock().unwrap().push_back(done);
        started.notify_all();
    }
}

/// With commits in flight together, a grant is answered only once its own
/// commit and every earlier one are durable; a third waits for a free
/// place; a failed commit leaves the callers behind it without an answer.
#[test]
fn replies_wait_for_every_commit_started_before_theirs() {
    let held = Held::default();
    let store = HeldStore {
        inner: MemStore::default(),
        held: held.clone(),
    };
    let (metrics, handle, thread) = start_on(Box::new(store));
    let acquire = |i: u8| {
        let resource = ResourceName::parse(&format!("held-{i}")).unwrap();
        let request = AcquireRequest::single(resource, AcquisitionId::from_bytes([i; 16]), 60_000);
        let (reply, rx) = oneshot::channel();
        assert!(handle.send(Command::Acquire { request, reply }));
        rx
    };
    let mut first = acquire(1);
    held.wait_for(1);
    let mut second = acquire(2);
    held.wait_for(2);
    let third = acquire(3);
    let fourth = acquire(4);
    assert!(first.try_recv().is_err() && second.try_recv().is_err());
    // The first commit: its grant goes out, the second's still waits,
    // and the third and fourth start together in the freed place.
    held.finish(Ok(()));
    assert!(matches!(
        first.blocking_recv(),
        Ok(Ok(AcquireReply::Granted { .. }))
    ));
    held.wait_for(2);
    assert!(second.try_recv().is_err(), "its commit is still in flight");
    assert_eq!(held.in_flight(), 2, "at most two in flight");
    held.finish(Ok(()));
    assert!(matches!(
        second.blocking_recv(),
        Ok(Ok(AcquireReply::Granted { .. }))
    ));
    // The third and fourth were one commit; it fails: no answer, and the
    // engine stops.
    held.finish(Err(StoreError::Storage("the disk went away".into())));
    assert!(third.blocking_recv().is_err(), "outcome unknown: no answer");
    assert!(
        fourth.blocking_recv().is_err(),
        "outcome unknown: no answer"
    );
    assert_eq!(metrics.commits.get(), 2);
    assert!(thread.join().unwrap().is_err());
}
