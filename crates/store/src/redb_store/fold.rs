//! The background fold: a thread that writes a full log's keys into redb
//! in bounded transactions while commits go on in the other log.
//!
//! Before it, the log was folded on the committer's thread: a part of its
//! keys every few commits once it was half full, and the rest when it was
//! full, each a redb transaction and an fsync in front of the commits
//! waiting behind it. With a million live leases a fold of 4,096 keys
//! writes about as many B-tree pages; the commit path waited 80 to 350 ms.
//! Now the committer only appends, and waits here only if the active log
//! fills before the frozen one is folded (the log sizes make that rare;
//! `wait_idle` counts how long it waited).
//!
//! The handover that keeps every view consistent: the thread copies a
//! batch of the frozen keys, commits it to redb, and only then takes those
//! keys out of the frozen set, under the lock. A reader that takes redb's
//! read transaction and a copy of the frozen set under the same lock sees
//! every key either in redb or in the copy (or both, which is harmless:
//! the copy holds the same value).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::Database;

use super::write_to_redb;
use crate::wal::Pending;
use crate::StoreError;

/// Keys per background redb transaction: big enough that the fsync per
/// transaction is paid rarely, small enough that a checkpoint waiting for
/// the thread waits for one transaction at most.
/// (Tests fold in small batches, so that a fold is mid-way more often.)
const FOLD_BATCH_KEYS: usize = if cfg!(test) { 64 } else { 8_192 };

/// The fold thread and what it shares with the store.
pub(super) struct Folder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// A fold failed (`State::failed` says why): read on every commit
    /// without the lock, which the thread holds while it copies a batch.
    failed: AtomicBool,
    /// `State::frozen`'s length, set under the lock whenever it changes,
    /// read without it (a gauge after every commit).
    backlog: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// The frozen log's writes not yet in redb, one per key.
    frozen: Pending,
    stop: bool,
    /// Why the last fold failed: the store stops trusting itself.
    failed: Option<String>,
    /// Transactions folded (for tests).
    folds: u64,
}

impl Folder {
    /// Starts the thread, with `frozen` (the older log's writes, replayed
    /// at open) to fold first.
    pub(super) fn start(db: Arc<Database>, frozen: Pending) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared::default());
        {
            let mut state = shared.lock();
            state.frozen = frozen;
            shared.counted(&state);
        }
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("baton-fold".into())
            .spawn(move || run(&db, &for_thread))
            .map_err(|source| StoreError::Io {
                path: "the fold thread".into(),
                source,
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits until the frozen log is wholly in redb; how long it waited.
    pub(super) fn wait_idle(&self) -> Result<Duration, StoreError> {
        let started = Instant::now();
        let mut state = self.shared.lock();
        loop {
            if let Some(why) = &state.failed {
                return Err(fold_failed(why));
            }
            if state.frozen.is_empty() {
                return Ok(started.elapsed());
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Hands the thread a full log's writes to fold; the last ones must be
    /// folded ([`Folder::wait_idle`]).
    pub(super) fn hand_over(&self, frozen: Pending) {
        let mut state = self.shared.lock();
        assert!(
            state.frozen.is_empty(),
            "the last frozen log is folded first"
        );
        state.frozen = frozen;
        self.shared.counted(&state);
        self.shared.changed.notify_all();
    }

    /// Keys of the frozen log not yet folded, read without the lock.
    pub(super) fn backlog(&self) -> usize {
        self.shared.backlog.load(Ordering::Relaxed)
    }

    /// Runs `read` with the frozen writes, while no fold can take any of
    /// them out (see the module docs).
    pub(super) fn with_frozen<R>(&self, read: impl FnOnce(&Pending) -> R) -> R {
        read(&self.shared.lock().frozen)
    }

    /// Why a fold failed, if one did.
    pub(super) fn failure(&self) -> Option<StoreError> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        let state = self.shared.lock();
        state.failed.as_ref().map(|why| fold_failed(why))
    }

    /// Transactions folded so far.
    #[cfg(test)]
    pub(super) fn folds(&self) -> u64 {
        self.shared.lock().folds
    }
}

/// The error every later commit answers after a fold failed.
fn fold_failed(why: &str) -> StoreError {
    StoreError::Storage(format!("a background fold failed: {why}"))
}

impl Drop for Folder {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            // What it had not folded is still in the frozen log on disk.
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the frozen set's length (called with the lock held).
    fn counted(&self, state: &State) {
        self.backlog.store(state.frozen.len(), Ordering::Relaxed);
    }
}

/// The thread: folds a batch at a time until the frozen set is empty, then
/// waits for the next.
fn run(db: &Database, shared: &Shared) {
    lower_priority();
    loop {
        let batch = {
            let mut state = shared.lock();
            while state.frozen.is_empty() && !state.stop {
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.frozen.peek(FOLD_BATCH_KEYS)
        };
        let outcome = write_to_redb(db, &batch);
        let mut state = shared.lock();
        match outcome {
            Ok(()) => {
                state.frozen.forget(&batch);
                state.folds += 1;
                shared.counted(&state);
            }
            Err(e) => {
                state.failed = Some(e.to_string());
                shared.failed.store(true, Ordering::Release);
                shared.changed.notify_all();
                return;
            }
        }
        shared.changed.notify_all();
    }
}

/// The fold yields the CPU to the lease path: on two cores it competes
/// with the committer and the callers (Linux's nice is per thread).
fn lower_priority() {
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
}
