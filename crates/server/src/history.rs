//! The operator page's history of holder changes ([`Change`], the type
//! watchers get too): the last [`HISTORY_TOTAL_MAX`] changes of every
//! resource, of which a reader sees a resource's newest
//! [`HISTORY_PER_RESOURCE_MAX`], kept in
//! memory only (a restart or a new leader starts with none, and the page
//! says so), queued by the committer
//! after each step's commit (so it never shows a grant that is not
//! durable), in the order the engine made the changes, and recorded on a
//! thread of its own: a million expiries are a million records, and the
//! committer's next commit must not wait for them. The recorder wakes when
//! the queue stops being empty and then gathers for
//! [`RECORD_INTERVAL`], so under load it costs one wake per interval, not
//! one per commit. A reader first records whatever is queued, so it sees
//! every change queued before it asked.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use baton_core::Change;

/// Changes kept per resource: the oldest goes first.
pub const HISTORY_PER_RESOURCE_MAX: usize = 32;
/// Changes kept in all: the oldest of any resource goes first.
pub const HISTORY_TOTAL_MAX: usize = 100_000;
/// How long the recorder gathers queued changes before recording them
/// (a reader records what is queued itself, so it never waits for this).
/// Woken once per commit, the recorder took about 9% of the server's CPU
/// at 16 session clients.
pub const RECORD_INTERVAL: Duration = Duration::from_millis(10);

/// One recorded change and when this server recorded it (monotonic).
#[derive(Clone, Debug)]
pub struct Entry {
    /// Numbered in record order across every resource.
    pub seq: u64,
    pub change: Change,
    pub at: Instant,
}

/// One ring of the latest changes, oldest first. A reader picks a
/// resource's out of it (100,000 entries: well under a millisecond, and
/// only the page asks); a map of per-resource queues beside it cost three
/// copies of each name and a queue each, about 330 bytes a change against
/// this ring's 130 (docs/performance.md, 2026-12-08).
#[derive(Default)]
struct Book {
    next_seq: u64,
    recent: VecDeque<Entry>,
}

/// The recent holder changes of every resource.
#[derive(Default)]
pub struct History {
    book: Mutex<Book>,
    /// Changes queued, not yet in the book. Lock order: `book`, then this.
    queued: Mutex<Queued>,
    arrived: Condvar,
}

#[derive(Default)]
struct Queued {
    batches: Vec<(Vec<Change>, Instant)>,
    /// The recorder that runs (each engine starts one: a cluster member
    /// starts a new engine every term it leads); any other one ends.
    recorder: u64,
}

impl History {
    /// Queues a step's holder changes, in order, all at `at`, for the
    /// recorder thread (cheap: the committer calls it after each commit).
    pub fn queue(&self, changes: Vec<Change>, at: Instant) {
        if changes.is_empty() {
            return;
        }
        let mut queued = self.queue_lock();
        queued.batches.push((changes, at));
        if queued.batches.len() == 1 {
            // The recorder waits only on an empty queue.
            self.arrived.notify_one();
        }
    }

    /// A new recorder's number: the one before it, if any, ends. Run it
    /// with [`History::run_recorder`] and end it with [`History::retire`].
    pub fn new_recorder(&self) -> u64 {
        let mut queued = self.queue_lock();
        queued.recorder += 1;
        self.arrived.notify_all();
        queued.recorder
    }

    /// Recorder `me`'s thread: records queued changes until it is retired
    /// or a newer recorder starts (what is left queued then, the next
    /// reader or recorder records).
    pub fn run_recorder(&self, me: u64) {
        loop {
            {
                let mut queued = self.queue_lock();
                while queued.batches.is_empty() && queued.recorder == me {
                    queued = self.arrived.wait(queued).unwrap_or_else(|p| p.into_inner());
                }
                if queued.recorder != me {
                    return;
                }
                // Gather more, unless retired meanwhile.
                let (queued, _) = self
                    .arrived
                    .wait_timeout_while(queued, RECORD_INTERVAL, |q| q.recorder == me)
                    .unwrap_or_else(|p| p.into_inner());
                if queued.recorder != me {
                    return;
                }
            }
            drop(self.catch_up());
        }
    }

    /// Ends recorder `me` (its engine stopped), unless a newer one runs.
    pub fn retire(&self, me: u64) {
        let mut queued = self.queue_lock();
        if queued.recorder == me {
            queued.recorder += 1;
        }
        self.arrived.notify_all();
    }

    /// Records every queued change, under the book's lock (so a reader
    /// never misses a batch the recorder took but has not written yet).
    fn catch_up(&self) -> std::sync::MutexGuard<'_, Book> {
        let mut book = self.lock();
        let batches = std::mem::take(&mut self.queue_lock().batches);
        for (changes, at) in batches {
            book.record(&changes, at);
        }
        book
    }

    /// Records a step's holder changes, in order, all at `at`, now.
    #[cfg(test)]
    pub fn record(&self, changes: &[Change], at: Instant) {
        self.catch_up().record(changes, at);
    }

    /// A resource's recorded changes, newest first: at most
    /// [`HISTORY_PER_RESOURCE_MAX`] of the last [`HISTORY_TOTAL_MAX`].
    pub fn of(&self, resource: &str) -> Vec<Entry> {
        (self.catch_up().recent.iter().rev())
            .filter(|e| e.change.resource == resource)
            .take(HISTORY_PER_RESOURCE_MAX)
            .cloned()
            .collect()
    }

    /// Changes held in all.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.catch_up().recent.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn queue_lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Book {
    fn record(&mut self, changes: &[Change], at: Instant) {
        for change in changes {
            self.next_seq += 1;
            if self.recent.len() == HISTORY_TOTAL_MAX {
                self.recent.pop_front();
            }
            self.recent.push_back(Entry {
                seq: self.next_seq,
                change: change.clone(),
                at,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_core::{FencingToken, HolderChange};

    use super::*;

    fn change(resource: &str, n: u64) -> Change {
        Change {
            kind: HolderChange::Granted,
            resource: resource.into(),
            token: FencingToken::from_u64((1 << 40) | n).unwrap(),
            revoked: None,
            holder: None,
            slot: None,
        }
    }

    #[test]
    fn a_resource_keeps_its_newest_changes_newest_first() {
        let h = History::default();
        let now = Instant::now();
        let changes: Vec<Change> = (1..=40).map(|n| change("r", n)).collect();
        h.record(&changes, now);
        h.record(&[change("s", 99)], now);
        let r = h.of("r");
        assert_eq!(r.len(), HISTORY_PER_RESOURCE_MAX);
        assert_eq!(r[0].change.token.get() & 0xff, 40, "newest first");
        assert_eq!(r[31].change.token.get() & 0xff, 9, "the 8 oldest went");
        assert_eq!(h.of("s").len(), 1);
        assert!(h.of("t").is_empty());
    }

    #[test]
    fn queued_changes_are_seen_by_a_reader_and_recorded_by_the_recorder() {
        let h = std::sync::Arc::new(History::default());
        let now = Instant::now();
        h.queue(vec![change("r", 1), change("r", 2)], now);
        let seen = h.of("r");
        assert_eq!(seen.len(), 2, "a reader records what is queued first");
        assert_eq!(seen[0].change.token.get() & 0xff, 2);
        let spawn = |me: u64| {
            let h = h.clone();
            std::thread::spawn(move || h.run_recorder(me))
        };
        // Whether a recorder took the queue within 10 s.
        let drained = || {
            let until = Instant::now() + std::time::Duration::from_secs(10);
            while !h.queue_lock().batches.is_empty() && Instant::now() < until {
                std::thread::yield_now();
            }
            h.queue_lock().batches.is_empty()
        };
        // A cluster member's first term: its recorder records, then its
        // engine stops.
        let first = h.new_recorder();
        let first_thread = spawn(first);
        h.queue(vec![change("s", 3)], now);
        assert!(drained(), "the first recorder records");
        h.retire(first);
        first_thread.join().expect("a retired recorder ends");
        // Its next term: a new recorder records again, and the old one's
        // late retirement does not stop it.
        let second = h.new_recorder();
        let second_thread = spawn(second);
        h.retire(first);
        h.queue(vec![change("t", 4)], now);
        assert!(drained(), "the next term's recorder records");
        assert_eq!(h.lock().recent.len(), 4, "recorded by the thread");
        // A third engine's recorder ends the second.
        let third = h.new_recorder();
        second_thread
            .join()
            .expect("a newer recorder ends the older");
        h.retire(third);
        assert_eq!(h.of("s").len(), 1);
    }

    #[test]
    fn the_total_is_bounded_by_evicting_the_oldest_of_any_resource() {
        let h = History::default();
        let now = Instant::now();
        // One busy resource (bounded by itself) and many quiet ones.
        let busy: Vec<Change> = (0..1_000).map(|n| change("busy", n)).collect();
        h.record(&busy, now);
        let quiet: Vec<Change> = (0..HISTORY_TOTAL_MAX as u64)
            .map(|n| change(&format!("q{n}"), n))
            .collect();
        h.record(&quiet, now);
        assert!(h.len() <= HISTORY_TOTAL_MAX, "{}", h.len());
        assert!(h.of("busy").is_empty(), "the oldest resource went first");
        assert_eq!(h.of(&format!("q{}", HISTORY_TOTAL_MAX - 1)).len(), 1);
        assert_eq!(h.len(), HISTORY_TOTAL_MAX);
    }

    /// A resource busy beyond its bound shows its newest changes only,
    /// and its older ones still count in the total (they age out in turn).
    #[test]
    fn a_busy_resource_shows_its_newest_and_its_older_ones_still_count() {
        let h = History::default();
        let now = Instant::now();
        let busy: Vec<Change> = (0..100).map(|n| change("busy", n)).collect();
        h.record(&busy, now);
        h.record(&[change("quiet", 1)], now);
        assert_eq!(h.of("busy").len(), HISTORY_PER_RESOURCE_MAX);
        assert_eq!(h.len(), 101);
        let quiet: Vec<Change> = (0..HISTORY_TOTAL_MAX as u64 - 2)
            .map(|n| change(&format!("q{n}"), n))
            .collect();
        h.record(&quiet, now);
        let busy = h.of("busy");
        assert_eq!(busy.len(), 1, "only the newest is left in the last changes");
        assert_eq!(busy[0].change.token.get() & 0xff, 99);
        assert_eq!(h.of("quiet").len(), 1);
        assert_eq!(h.len(), HISTORY_TOTAL_MAX);
    }
}
