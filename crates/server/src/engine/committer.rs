//! The thread that owns the store: it commits the steps queued while its
//! last commit was in flight together, and only then releases their
//! replies, in order (the rule is `baton_core::pipeline::batch`).

use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::time::Instant;

use baton_core::pipeline;
use baton_store::{LeaseStore, StoreError};
use tokio::sync::oneshot;
use tracing::error;

use super::{AcquireAnswer, AcquireReply, Command, Deferred, Reply, Shared, SnapshotReply, Wake};
use crate::metrics::Metrics;

/// What answers one step's callers, released once the step's commit
/// (per `baton_core::pipeline::batch`) is durable.
#[derive(Default)]
pub(super) struct Replies {
    pub(super) replies: Vec<Deferred>,
    /// Waiters granted or timed out; a grant whose caller left is handed back.
    pub(super) woken: Vec<(Reply<AcquireAnswer>, AcquireAnswer)>,
    /// Backups: each gets a view of the store taken after this job's
    /// commit (cheap; the backup reads it on a thread of its own).
    pub(super) snapshots: Vec<SnapshotReply>,
}

pub(super) enum ToCommitter {
    Job(pipeline::Job<Replies>),
    /// Commit whatever is pending, then stop.
    Flush,
}

/// The thread that owns the store: commits queued batches together and
/// releases their replies in order.
pub(super) struct Committer {
    pub(super) store: Box<dyn LeaseStore>,
    pub(super) rx: mpsc::Receiver<ToCommitter>,
    /// For handing back grants whose waiter left before its answer (weak:
    /// it must not keep the engine alive).
    pub(super) engine: Weak<Shared>,
    /// To stop the engine when a commit fails.
    pub(super) timer: mpsc::Sender<Wake>,
    pub(super) metrics: Arc<Metrics>,
}

/// Ended leases (expired, or of an ended session) the engine drops per
/// millisecond. Every drop is a deletion for the next commit, and the
/// clients' grants share those commits. At 1,024 a millisecond a session
/// of 100,000 leases drained in 0.1 s, but the clients cycling beside it
/// fell to a fifth of their rate and their slowest acquire took 5.7-10.1
/// ms; at 256 it drains in 0.4 s, they keep two thirds of their rate and
/// the slowest took 2.4-2.6 ms (`scripts/bench-events`, 2026-12-04). It is
/// also the pace that keeps a mass expiry's deletions (a million leases
/// whose holders died with the server, ending 500 a millisecond) from
/// outrunning the store's background fold, which otherwise made every
/// commit wait (1.0 s in one run of `scripts/bench-restart`). Ended leases
/// are gone for every caller whenever their drop comes, so only the
/// writes, the watch events and the hand-offs nobody asks about wait.
const EXPIRY_DROPS_PER_MS: usize = 256;

/// Expired leases the engine drops per millisecond while more than one
/// lazy batch of writes waits for the committer. The committer takes
/// every queued job in one commit, and a commit of 25,000 deletions took
/// 23-35 ms in `scripts/bench-restart`: every acquire queued behind it
/// waited that long. Nearly pausing the drops until the queue is down to
/// one batch keeps a commit near one batch's size.
const EXPIRY_DROPS_PER_MS_WHILE_COMMITS_BEHIND: usize = 32;

/// How many ended leases the engine may drop per millisecond: fewer while
/// the committer is behind (its queue's gauge).
pub(super) fn expiry_drops_per_ms(metrics: &Metrics) -> usize {
    let queued = usize::try_from(metrics.commit_queue_writes.get()).unwrap_or(0);
    if queued > pipeline::LAZY_WRITES_MAX {
        EXPIRY_DROPS_PER_MS_WHILE_COMMITS_BEHIND
    } else {
        EXPIRY_DROPS_PER_MS
    }
}

impl Committer {
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        loop {
            let Ok(first) = self.rx.recv() else {
                break;
            };
            let mut jobs = Vec::new();
            let mut stop = false;
            for message in std::iter::once(first).chain(self.rx.try_iter()) {
                match message {
                    ToCommitter::Job(job) => jobs.push(job),
                    ToCommitter::Flush => stop = true,
                }
            }
            let batch = pipeline::batch(jobs);
            let n_writes = batch.commit.len() as i64;
            for replies in batch.before {
                self.release(replies);
            }
            if !batch.commit.is_empty() {
                let started = Instant::now();
                if let Err(e) = self.store.commit(&batch.commit) {
                    // Dropping the replies tells every caller the outcome is unknown.
                    self.metrics.store_errors.inc();
                    error!(error = %e, "lease store commit failed; stopping");
                    // Stop the engine too.
                    let _ = self.timer.send(Wake::Stop);
                    return Err(e);
                }
                self.metrics
                    .observe_commit_latency_us(started.elapsed().as_micros() as u64);
                self.metrics.commits.inc();
                if let Some(keys) = self.store.fold_backlog() {
                    self.metrics.store_fold_backlog.set(keys as i64);
                }
                self.metrics.commit_queue_writes.dec_by(n_writes);
            }
            for replies in batch.after {
                self.release(replies);
            }
            if stop {
                break;
            }
        }
        Ok(())
    }

    /// Answers one job's callers, in order.
    fn release(&mut self, job: Replies) {
        for reply in job.replies {
            reply();
        }
        for reply in job.snapshots {
            let _ = reply.send(self.store.snapshot());
        }
        for (reply, answer) in job.woken {
            if let Err(Ok(AcquireReply::Granted { grants, .. })) = reply.send(answer) {
                // The caller left just as its turn came: give the leases back.
                let Some(engine) = self.engine.upgrade() else {
                    continue;
                };
                for g in grants {
                    let (tx, _) = oneshot::channel();
                    engine.submit(Command::Release {
                        resource: g.resource,
                        id: g.acquisition_id,
                        reply: tx,
                    });
                }
            }
        }
    }
}

/// The table as `store` holds it, built as the store reads its leases (at
/// ten million, the stored records are never all held beside the table),
/// every lease held a full TTL from `MonoMs(0)`; with the ended leases.
pub(super) fn recover(
    store: &dyn LeaseStore,
    limits: baton_core::Limits,
) -> Result<baton_core::LeaseTable, StoreError> {
    let ended = store.ended()?;
    let mut recovered = None;
    store.load_with(&mut |loading| {
        let mut failed = None;
        let leases = loading
            .leases
            .map_while(|lease| lease.map_err(|e| failed = Some(e)).ok());
        let table = baton_core::LeaseTable::recover(
            limits.clone(),
            baton_core::MonoMs(0),
            loading.epoch,
            loading.counter,
            leases,
            loading.sessions,
        );
        recovered = Some(match failed {
            None => Ok(table),
            Some(e) => Err(e),
        });
    })?;
    let mut table = recovered.expect("load_with hands the state over")?;
    table.remember_ended(ended);
    Ok(table)
}

#[cfg(test)]
mod tests {
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
        let metrics = Arc::new(Metrics::default());
        let (handle, thread) = Engine::start(
            Box::new(MemStore::default()),
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
            let request =
                AcquireRequest::single(resource, AcquisitionId::from_bytes([i; 16]), 60_000);
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
}
