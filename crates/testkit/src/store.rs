//! Lease stores for testing the code above the store seam.
//!
//! [`MemStore`] keeps its durable image in memory, shared through a handle,
//! so a test can "crash" the server and start another on exactly what was
//! committed. [`FailingStore`] wraps any store and fails its commits once
//! told to, as a disk that stops answering would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_core::{AcquisitionDigest, Epoch, Write};
use baton_store::{History, LeaseStore, StoreError, Stored};

/// An in-memory store: what it holds is what a crash would leave.
#[derive(Clone)]
pub struct MemStore {
    durable: Arc<Mutex<Stored>>,
    ended: Arc<Mutex<Vec<AcquisitionDigest>>>,
    history: Arc<Mutex<History>>,
}

impl Default for MemStore {
    fn default() -> Self {
        Self {
            durable: Arc::new(Mutex::new(Stored {
                epoch: Epoch::FIRST,
                counter: 0,
                leases: Vec::new(),
                sessions: Vec::new(),
            })),
            ended: Arc::default(),
            history: Arc::default(),
        }
    }
}

impl MemStore {
    /// The committed state, as a restart would load it.
    pub fn durable(&self) -> Stored {
        self.durable.lock().expect("mem store lock").clone()
    }
}

impl LeaseStore for MemStore {
    fn load(&self) -> Result<Stored, StoreError> {
        Ok(self.durable())
    }

    fn ended(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        Ok(self.ended.lock().expect("mem store lock").clone())
    }

    fn history(&self, n_max: usize) -> Result<History, StoreError> {
        let mut history = self.history.lock().expect("mem store lock").clone();
        let excess = history.changes.len().saturating_sub(n_max);
        history.changes.drain(..excess);
        Ok(history)
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let mut d = self.durable.lock().expect("mem store lock");
        for write in writes {
            match write {
                Write::PutLease { resource, record } => {
                    d.leases.retain(|(r, _)| r != resource);
                    d.leases.push((resource.clone(), record.clone()));
                }
                Write::DeleteLease { resource } => d.leases.retain(|(r, _)| r != resource),
                Write::PutSession { record } => {
                    d.sessions.retain(|s| s.digest != record.digest);
                    d.sessions.push(record.clone());
                }
                Write::DeleteSession { digest } => d.sessions.retain(|s| s.digest != *digest),
                Write::Tokens { epoch, counter } => {
                    d.epoch = *epoch;
                    d.counter = *counter;
                }
                // Kept for ever: no test lives as long as the memory.
                Write::LeaseEnded { digest } => {
                    self.ended.lock().expect("mem store lock").push(*digest);
                }
                // Kept for ever too.
                Write::Changed(change) => {
                    let mut history = self.history.lock().expect("mem store lock");
                    history.seq = history.seq.max(change.seq);
                    history.changes.push(change.clone());
                }
            }
        }
        Ok(())
    }
}

/// Wraps a store; once [`FailingStore::fail_commits`] is set every commit
/// fails (and writes nothing) and the number of failures is counted.
pub struct FailingStore<S> {
    inner: S,
    fail: Arc<AtomicBool>,
    failures: Arc<std::sync::atomic::AtomicU64>,
}

/// The switch and the counter of a [`FailingStore`], kept by the test.
#[derive(Clone)]
pub struct FailSwitch {
    fail: Arc<AtomicBool>,
    failures: Arc<std::sync::atomic::AtomicU64>,
}

impl FailSwitch {
    /// From now on every commit fails.
    pub fn fail_commits(&self) {
        self.fail.store(true, Ordering::SeqCst);
    }

    /// How many commits failed.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }
}

impl<S: LeaseStore> FailingStore<S> {
    /// Wraps `inner`; the returned switch makes its commits fail.
    pub fn new(inner: S) -> (Self, FailSwitch) {
        let switch = FailSwitch {
            fail: Arc::new(AtomicBool::new(false)),
            failures: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        let store = Self {
            inner,
            fail: switch.fail.clone(),
            failures: switch.failures.clone(),
        };
        (store, switch)
    }
}

impl<S: LeaseStore> LeaseStore for FailingStore<S> {
    fn load(&self) -> Result<Stored, StoreError> {
        self.inner.load()
    }

    fn ended(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        self.inner.ended()
    }

    fn history(&self, n_max: usize) -> Result<History, StoreError> {
        self.inner.history(n_max)
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Storage(
                "injected: the disk stopped answering".into(),
            ));
        }
        self.inner.commit(writes)
    }
}
