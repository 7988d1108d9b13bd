//! The thread that owns the store: it commits the steps queued while its
//! last commit was in flight together, and only then releases their
//! replies, in order (the rule is `baton_core::pipeline::batch`). A store
//! that takes a commit while another is in flight
//! ([`LeaseStore::commits_in_flight_max`]) gets the next batch at once;
//! its replies still wait for every commit started before it.

use std::collections::VecDeque;
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
    /// The oldest commit in flight ended so (from the store).
    Committed(Result<(), StoreError>),
}

/// The thread that owns the store: commits queued batches together and
/// releases their replies in order.
pub(super) struct Committer {
    pub(super) store: Box<dyn LeaseStore>,
    pub(super) rx: mpsc::Receiver<ToCommitter>,
    /// Where the store reports its commits' outcomes (so the committer
    /// stops on [`ToCommitter::Flush`], never on its channel's end).
    pub(super) to_self: mpsc::Sender<ToCommitter>,
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

/// Steps started or waiting for the commits before them, in order.
struct Started {
    replies: Vec<Replies>,
    /// When its commit started and how many writes it holds; `None` once
    /// committed, or for steps with nothing to commit.
    commit: Option<(Instant, i64)>,
}

impl Committer {
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        let in_flight_max = self.store.commits_in_flight_max().max(1);
        let mut started: VecDeque<Started> = VecDeque::new();
        let mut queued = Vec::new();
        let mut stop = false;
        while !(stop && queued.is_empty() && started.is_empty()) {
            let Ok(first) = self.rx.recv() else {
                break;
            };
            let messages: Vec<_> = std::iter::once(first).chain(self.rx.try_iter()).collect();
            for message in messages {
                match message {
                    ToCommitter::Job(job) => queued.push(job),
                    ToCommitter::Flush => stop = true,
                    ToCommitter::Committed(outcome) => self.committed(&mut started, outcome)?,
                }
            }
            let in_flight = started.iter().filter(|s| s.commit.is_some()).count();
            if !queued.is_empty() && in_flight < in_flight_max {
                self.start(&mut started, std::mem::take(&mut queued));
            }
        }
        Ok(())
    }

    /// Commits the jobs queued since the last start together; their
    /// replies wait for it and for every commit started before.
    fn start(&mut self, started: &mut VecDeque<Started>, jobs: Vec<pipeline::Job<Replies>>) {
        let batch = pipeline::batch(jobs);
        for replies in batch.before {
            self.release(replies);
        }
        if batch.commit.is_empty() {
            started.push_back(Started {
                replies: batch.after,
                commit: None,
            });
            self.release_committed(started);
            return;
        }
        started.push_back(Started {
            replies: batch.after,
            commit: Some((Instant::now(), batch.commit.len() as i64)),
        });
        let to_self = self.to_self.clone();
        self.store.start_commit(
            &batch.commit,
            Box::new(move |outcome| {
                let _ = to_self.send(ToCommitter::Committed(outcome));
            }),
        );
    }

    /// The oldest commit in flight ended: on success its replies and those
    /// waiting only for it go out; a failure stops the engine, and the
    /// dropped replies tell every caller the outcome is unknown.
    fn committed(
        &mut self,
        started: &mut VecDeque<Started>,
        outcome: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if let Err(e) = outcome {
            self.metrics.store_errors.inc();
            error!(error = %e, "lease store commit failed; stopping");
            let _ = self.timer.send(Wake::Stop);
            return Err(e);
        }
        let (at, n_writes) = started
            .iter_mut()
            .find_map(|s| s.commit.take())
            .expect("an outcome comes only for a commit in flight");
        self.metrics
            .observe_commit_latency_us(at.elapsed().as_micros() as u64);
        self.metrics.commits.inc();
        if let Some(keys) = self.store.fold_backlog() {
            self.metrics.store_fold_backlog.set(keys as i64);
        }
        self.metrics.commit_queue_writes.dec_by(n_writes);
        self.release_committed(started);
        Ok(())
    }

    /// Answers, in order, the steps no commit in flight holds back.
    fn release_committed(&mut self, started: &mut VecDeque<Started>) {
        while started.front().is_some_and(|s| s.commit.is_none()) {
            let Some(step) = started.pop_front() else {
                break;
            };
            for replies in step.replies {
                self.release(replies);
            }
        }
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
mod tests;
