//! The engine's commit pipeline as pure state, stepped by its caller.
//!
//! A step ticks the table and takes its effects ([`Pipeline::step`]): the
//! writes it hands to the committer now (all of them when a token was
//! issued; the lazy ones, releases and expiries, at most every
//! [`LAZY_FLUSH_INTERVAL_MS`] or once [`LAZY_WRITES_MAX`] are pending),
//! and the waiting callers it answers. The committer takes every job
//! queued while its last commit was in flight ([`batch`]), commits their
//! writes together (group commit), and only then releases their replies,
//! in order.
//!
//! The server's engine and committer threads run exactly this
//! (`crates/server/src/engine`), and the simulator (`crates/sim`) steps it
//! itself: the rules of when a write becomes durable and when an answer
//! may go live here and nowhere else.

use std::collections::BTreeMap;

use crate::bad::{self, Variant};
use crate::{Event, LeaseTable, MonoMs, WaitResult, WaiterId, Write};

/// Lazy writes are handed to the committer at least this often...
pub const LAZY_FLUSH_INTERVAL_MS: u64 = 100;
/// ...or when this many are pending.
pub const LAZY_WRITES_MAX: usize = 8_192;

/// The writes not yet handed to the committer, and the callers waiting
/// for their turn; `W` is how the caller answers a waiter.
pub struct Pipeline<W> {
    lazy: Vec<Write>,
    flush_at: MonoMs,
    waiting: BTreeMap<WaiterId, W>,
}

/// What one step hands on.
pub struct Step<W> {
    /// Writes for the committer, in order (empty: none this step).
    pub writes: Vec<Write>,
    /// A token was issued: no reply of this step may go before `writes`
    /// (and every earlier step's) are durable.
    pub sync: bool,
    /// What happened, for metrics, logs and watchers.
    pub events: Vec<Event>,
    /// Waiters whose wait ended, with how.
    pub woken: Vec<(W, WaitResult)>,
}

/// One step's share of durable work, handed to the committer in order.
pub struct Job<R> {
    /// The step's writes.
    pub writes: Vec<Write>,
    /// The step issued a token.
    pub sync: bool,
    /// Whatever answers the step's callers, released per [`Batch`].
    pub replies: R,
}

/// What the committer does with the jobs queued while its last commit
/// was in flight: release `before`, commit `commit` (if not empty), then
/// release `after`.
pub struct Batch<R> {
    /// Replies that may go before the commit (none, in a correct build).
    pub before: Vec<R>,
    /// Every job's writes, in order.
    pub commit: Vec<Write>,
    /// Replies that go once `commit` is durable, in job order.
    pub after: Vec<R>,
}

impl<W> Pipeline<W> {
    /// A pipeline for a table (re)started at `now`.
    pub fn new(now: MonoMs) -> Self {
        Self {
            lazy: Vec::new(),
            flush_at: MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS),
            waiting: BTreeMap::new(),
        }
    }

    /// `waiter` was queued by the table: it is answered by `reply` when
    /// its wait ends.
    pub fn wait(&mut self, waiter: WaiterId, reply: W) {
        self.waiting.insert(waiter, reply);
    }

    /// The caller of `waiter` left: its answer, if it was still waiting.
    pub fn cancel(&mut self, waiter: WaiterId) -> Option<W> {
        self.waiting.remove(&waiter)
    }

    /// Hands every lazy write over in the next step (a backup's view must
    /// hold every change so far).
    pub fn flush_next_step(&mut self, now: MonoMs) {
        self.flush_at = now;
    }

    /// The lazy writes not yet handed over (a shutdown commits them).
    pub fn take_lazy(&mut self) -> Vec<Write> {
        std::mem::take(&mut self.lazy)
    }

    /// Every waiter still owed an answer, in waiter order (the engine
    /// stopped).
    pub fn into_waiting(self) -> impl Iterator<Item = W> {
        self.waiting.into_values()
    }

    /// When `table` next needs a step without a command: its next
    /// deadline, or the lazy flush.
    pub fn next_wake(&self, table: &LeaseTable) -> Option<MonoMs> {
        [
            table.next_deadline(),
            (!self.lazy.is_empty()).then_some(self.flush_at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Ticks `table` to `now` and takes the step's effects.
    pub fn step(&mut self, table: &mut LeaseTable, now: MonoMs) -> Step<W> {
        table.tick(now);
        let fx = table.take_effects();
        self.lazy.extend(fx.writes);
        let flush = !self.lazy.is_empty()
            && (fx.sync || now >= self.flush_at || self.lazy.len() >= LAZY_WRITES_MAX);
        let writes = if flush {
            self.flush_at = MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS);
            std::mem::take(&mut self.lazy)
        } else {
            Vec::new()
        };
        let woken = fx
            .woken
            .into_iter()
            .filter_map(|(waiter, result)| Some((self.waiting.remove(&waiter)?, result)))
            .collect();
        Step {
            writes,
            sync: fx.sync,
            events: fx.events,
            woken,
        }
    }
}

/// The committer's rule for the jobs queued while its last commit was in
/// flight: their writes are committed together, and every reply waits for
/// that commit. (A job without writes waits too: its answer may depend on
/// an earlier job's.)
pub fn batch<R>(jobs: impl IntoIterator<Item = Job<R>>) -> Batch<R> {
    let mut commit = Vec::new();
    let mut after = Vec::new();
    let mut sync = false;
    for job in jobs {
        sync |= job.sync;
        commit.extend(job.writes);
        after.push(job.replies);
    }
    // Invariant: a job that issued a token is answered only after a
    // commit that holds its writes and every earlier job's.
    assert!(
        !sync || !commit.is_empty(),
        "a batch that issued a token must commit before replying"
    );
    if bad::on(Variant::AnswerBeforeDurable) {
        return Batch {
            before: after,
            commit,
            after: Vec::new(),
        };
    }
    Batch {
        before: Vec::new(),
        commit,
        after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireOutcome, AcquireRequest, AcquisitionId, Epoch, Limits, ResourceName};

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap()
    }

    fn acquire(table: &mut LeaseTable, now: u64, r: &str, id: u8) -> AcquireOutcome {
        let req = AcquireRequest::single(name(r), AcquisitionId::from_bytes([id; 16]), 1_000);
        table.acquire(MonoMs(now), req).unwrap()
    }

    #[test]
    fn a_grant_hands_over_every_lazy_write_before_it() {
        let mut table = LeaseTable::new(Limits::default(), Epoch::FIRST, 0);
        let mut p: Pipeline<()> = Pipeline::new(MonoMs(0));
        acquire(&mut table, 0, "a", 1);
        assert!(!p.step(&mut table, MonoMs(0)).writes.is_empty());
        let id = AcquisitionId::from_bytes([1; 16]);
        table.release(MonoMs(1), &name("a"), &id);
        let released = p.step(&mut table, MonoMs(1));
        assert!(
            released.writes.is_empty() && !released.sync,
            "a release is lazy"
        );
        assert_eq!(p.next_wake(&table), Some(MonoMs(LAZY_FLUSH_INTERVAL_MS)));
        acquire(&mut table, 2, "b", 2);
        let granted = p.step(&mut table, MonoMs(2));
        assert!(granted.sync);
        assert!(
            matches!(&granted.writes[0], Write::DeleteLease { resource } if *resource == name("a")),
            "the release goes first, with the grant"
        );
    }

    #[test]
    fn lazy_writes_go_at_the_flush_deadline_or_on_request() {
        let mut table = LeaseTable::new(Limits::default(), Epoch::FIRST, 0);
        let mut p: Pipeline<()> = Pipeline::new(MonoMs(0));
        acquire(&mut table, 0, "a", 1);
        p.step(&mut table, MonoMs(0));
        table.release(MonoMs(1), &name("a"), &AcquisitionId::from_bytes([1; 16]));
        assert!(p.step(&mut table, MonoMs(1)).writes.is_empty());
        assert!(p.step(&mut table, MonoMs(99)).writes.is_empty());
        // The deletion and the ended lease's digest.
        assert_eq!(p.step(&mut table, MonoMs(100)).writes.len(), 2);
        acquire(&mut table, 101, "c", 3);
        p.step(&mut table, MonoMs(101));
        table.release(MonoMs(102), &name("c"), &AcquisitionId::from_bytes([3; 16]));
        p.flush_next_step(MonoMs(102));
        assert_eq!(p.step(&mut table, MonoMs(102)).writes.len(), 2);
    }

    #[test]
    fn a_batch_commits_every_write_before_any_reply() {
        let jobs = [
            Job {
                writes: Vec::new(),
                sync: false,
                replies: "status",
            },
            Job {
                writes: vec![Write::DeleteLease {
                    resource: name("a"),
                }],
                sync: false,
                replies: "fence",
            },
        ];
        let b = batch(jobs);
        assert!(b.before.is_empty());
        assert_eq!(b.commit.len(), 1);
        assert_eq!(b.after, ["status", "fence"]);
    }

    #[test]
    #[should_panic(expected = "must commit before replying")]
    fn a_token_without_its_writes_is_refused() {
        batch([Job {
            writes: Vec::new(),
            sync: true,
            replies: (),
        }]);
    }
}
