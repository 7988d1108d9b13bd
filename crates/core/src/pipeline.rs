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
//! Holder changes are numbered here, when their writes are handed over,
//! and each goes into the same commit as a [`Write::Changed`]: the numbers
//! follow the commit order, and a watcher is told of a change (a release
//! and an expiry too, whose writes are lazy) only once it is durable.
//!
//! The server's engine and committer threads run exactly this
//! (`crates/server/src/engine`), and the simulator (`crates/sim`) steps it
//! itself: the rules of when a write becomes durable and when an answer
//! may go live here and nowhere else.

use std::collections::BTreeMap;

use crate::bad::{self, Variant};
use crate::{Change, Event, LeaseTable, MonoMs, NumberedChange, WaitResult, WaiterId, Write};

/// Lazy writes are handed to the committer at least this often...
pub const LAZY_FLUSH_INTERVAL_MS: u64 = 100;
/// ...or when this many are pending.
pub const LAZY_WRITES_MAX: usize = 8_192;
/// While anyone watches, a holder change waits at most this long for its
/// lazy write to be handed over (a release or an expiry reaches watchers
/// this soon even when no grant follows it). At 5 ms a release's event
/// came 5.5 ms after its answer (0.16 ms before releases waited to be
/// durable; `scripts/bench-release-event`); at 1 ms it costs at most a
/// thousand more commits a second, and only while watched.
pub const WATCHED_FLUSH_INTERVAL_MS: u64 = 1;

/// The writes not yet handed to the committer, and the callers waiting
/// for their turn; `W` is how the caller answers a waiter.
pub struct Pipeline<W> {
    lazy: Vec<Write>,
    /// Holder changes whose writes are among `lazy`, not yet numbered.
    lazy_changes: Vec<Change>,
    /// The last change's number.
    seq: u64,
    /// Someone watches: changes are handed over within
    /// [`WATCHED_FLUSH_INTERVAL_MS`].
    watched: bool,
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
    /// What happened, for metrics and logs.
    pub events: Vec<Event>,
    /// The holder changes whose writes are among `writes`, numbered: for
    /// watchers, once `writes` are durable.
    pub changes: Vec<NumberedChange>,
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
    /// A pipeline for a table (re)started at `now`, whose last change
    /// was numbered `seq`.
    pub fn new(now: MonoMs, seq: u64) -> Self {
        Self {
            lazy: Vec::new(),
            lazy_changes: Vec::new(),
            seq,
            watched: false,
            flush_at: MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS),
            waiting: BTreeMap::new(),
        }
    }

    /// Whether anyone watches (changes are then handed over sooner).
    pub fn set_watched(&mut self, watched: bool) {
        self.watched = watched;
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

    /// The lazy writes not yet handed over, their changes numbered (a
    /// shutdown commits them).
    pub fn take_lazy(&mut self) -> Vec<Write> {
        let mut writes = std::mem::take(&mut self.lazy);
        writes.extend(self.number().into_iter().map(Write::Changed));
        writes
    }

    /// Numbers the changes waiting for their writes' hand-over.
    fn number(&mut self) -> Vec<NumberedChange> {
        let changes = std::mem::take(&mut self.lazy_changes);
        changes
            .into_iter()
            .map(|change| {
                self.seq += 1;
                NumberedChange {
                    seq: self.seq,
                    change,
                }
            })
            .collect()
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
            (!self.lazy.is_empty() || !self.lazy_changes.is_empty()).then_some(self.flush_at),
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
        let changes = Change::all_of(&fx.events);
        if self.watched && !changes.is_empty() {
            let soon = MonoMs(now.0 + WATCHED_FLUSH_INTERVAL_MS);
            self.flush_at = self.flush_at.min(soon);
        }
        self.lazy_changes.extend(changes);
        let pending = !self.lazy.is_empty() || !self.lazy_changes.is_empty();
        let flush =
            pending && (fx.sync || now >= self.flush_at || self.lazy.len() >= LAZY_WRITES_MAX);
        let (writes, changes) = if flush {
            self.flush_at = MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS);
            let changes = self.number();
            let mut writes = std::mem::take(&mut self.lazy);
            writes.extend(changes.iter().cloned().map(Write::Changed));
            (writes, changes)
        } else {
            (Vec::new(), Vec::new())
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
            changes,
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
        let mut p: Pipeline<()> = Pipeline::new(MonoMs(0), 0);
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
        let mut p: Pipeline<()> = Pipeline::new(MonoMs(0), 0);
        acquire(&mut table, 0, "a", 1);
        p.step(&mut table, MonoMs(0));
        table.release(MonoMs(1), &name("a"), &AcquisitionId::from_bytes([1; 16]));
        assert!(p.step(&mut table, MonoMs(1)).writes.is_empty());
        assert!(p.step(&mut table, MonoMs(99)).writes.is_empty());
        // The deletion, the ended lease's digest and the change.
        assert_eq!(p.step(&mut table, MonoMs(100)).writes.len(), 3);
        acquire(&mut table, 101, "c", 3);
        p.step(&mut table, MonoMs(101));
        table.release(MonoMs(102), &name("c"), &AcquisitionId::from_bytes([3; 16]));
        p.flush_next_step(MonoMs(102));
        assert_eq!(p.step(&mut table, MonoMs(102)).writes.len(), 3);
    }

    #[test]
    fn a_change_is_numbered_when_its_write_is_handed_over_and_goes_with_it() {
        let mut table = LeaseTable::new(Limits::default(), Epoch::FIRST, 0);
        let mut p: Pipeline<()> = Pipeline::new(MonoMs(0), 41);
        acquire(&mut table, 0, "a", 1);
        let granted = p.step(&mut table, MonoMs(0));
        assert_eq!(granted.changes.len(), 1);
        assert_eq!(granted.changes[0].seq, 42);
        assert!(granted
            .writes
            .contains(&Write::Changed(granted.changes[0].clone())));
        table.release(MonoMs(1), &name("a"), &AcquisitionId::from_bytes([1; 16]));
        let released = p.step(&mut table, MonoMs(1));
        assert!(
            released.changes.is_empty(),
            "not numbered before its write goes"
        );
        p.set_watched(true);
        acquire(&mut table, 2, "b", 2);
        table.release(MonoMs(2), &name("b"), &AcquisitionId::from_bytes([2; 16]));
        let both = p.step(&mut table, MonoMs(2));
        let seqs: Vec<_> = both.changes.iter().map(|c| c.seq).collect();
        assert_eq!(
            seqs,
            [43, 44, 45],
            "a's release, then b's grant and release"
        );
        assert_eq!(both.changes[0].change.kind, crate::HolderChange::Released);
        table.release(MonoMs(3), &name("b"), &AcquisitionId::from_bytes([2; 16]));
        acquire(&mut table, 3, "c", 3);
        p.step(&mut table, MonoMs(3));
        table.release(MonoMs(4), &name("c"), &AcquisitionId::from_bytes([3; 16]));
        p.step(&mut table, MonoMs(4));
        assert_eq!(
            p.next_wake(&table),
            Some(MonoMs(4 + WATCHED_FLUSH_INTERVAL_MS)),
            "watched: a release waits at most the watched interval"
        );
        let lazy = p.take_lazy();
        assert!(matches!(lazy.last(), Some(Write::Changed(c)) if c.seq == 47));
        assert_eq!(p.seq, 47);
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
