//! The store's two write-ahead logs: which is active, opening both, and
//! starting them again in the order that keeps a crash safe.
//!
//! **Invariant:** a log is started again only when every one of its writes
//! is in redb, and the older log always before the newer one. A log
//! replayed at open is therefore never older than a write already folded
//! into redb from a log that no longer counts, so replaying both, the older
//! generation first, over redb gives every key its last committed value.

use std::path::Path;

use baton_core::Write;

use crate::wal::Wal;
use crate::{StoreError, StoreId};

pub(super) struct Logs {
    wals: [Wal; 2],
    /// Where commits are appended: the log with the higher generation.
    active: usize,
}

/// Both logs as opened: the writes of the older one (to fold again) and of
/// the newer one (the active log's), each in order.
pub(super) struct Opened {
    pub(super) logs: Logs,
    pub(super) older: Vec<Write>,
    pub(super) newer: Vec<Write>,
}

impl Logs {
    /// Opens both logs of `data_dir`, creating any that is missing (a store
    /// from before logs, or from before the second log) below the other's
    /// generation when it is the second, above it when it is the first.
    pub(super) fn open(
        data_dir: &Path,
        store_id: StoreId,
        len_bytes: u64,
    ) -> Result<Opened, StoreError> {
        let first = match Wal::path_of(data_dir, 0).exists() {
            true => Wal::open(data_dir, 0, store_id, len_bytes)?,
            false => (
                Wal::create(data_dir, 0, store_id, len_bytes, 1)?,
                Vec::new(),
            ),
        };
        let second = match Wal::path_of(data_dir, 1).exists() {
            true => Wal::open(data_dir, 1, store_id, len_bytes)?,
            false => (
                Wal::create(data_dir, 1, store_id, len_bytes, 0)?,
                Vec::new(),
            ),
        };
        let (g0, g1) = (first.0.generation(), second.0.generation());
        if g0 == g1 {
            return Err(StoreError::Corrupt(format!(
                "both write-ahead logs of {} carry generation {g0}",
                data_dir.display()
            )));
        }
        let active = usize::from(g1 > g0);
        let [(w0, r0), (w1, r1)] = [first, second];
        let (older, newer) = if active == 1 { (r0, r1) } else { (r1, r0) };
        Ok(Opened {
            logs: Self {
                wals: [w0, w1],
                active,
            },
            older,
            newer,
        })
    }

    /// New empty logs for a new store: the first active.
    pub(super) fn create(
        data_dir: &Path,
        store_id: StoreId,
        len_bytes: u64,
    ) -> Result<Self, StoreError> {
        // The second first: the first's file is what marks a store as
        // having logs at all.
        let second = Wal::create(data_dir, 1, store_id, len_bytes, 0)?;
        let first = Wal::create(data_dir, 0, store_id, len_bytes, 1)?;
        Ok(Self {
            wals: [first, second],
            active: 0,
        })
    }

    pub(super) fn active(&mut self) -> &mut Wal {
        &mut self.wals[self.active]
    }

    fn top_generation(&self) -> u64 {
        self.wals[0].generation().max(self.wals[1].generation())
    }

    /// The other log, every write of which is in redb, starts again above
    /// the active one's generation and becomes the active log.
    pub(super) fn rotate(&mut self) -> Result<(), StoreError> {
        let other = 1 - self.active;
        let generation = self.top_generation() + 1;
        self.wals[other].restart(generation)?;
        self.active = other;
        Ok(())
    }

    /// Both logs start again, every write of both being in redb: the older
    /// first (see the module docs).
    pub(super) fn restart_both(&mut self) -> Result<(), StoreError> {
        let older = 1 - self.active;
        if !self.wals[older].is_empty() || !self.wals[self.active].is_empty() {
            let generation = self.top_generation() + 1;
            self.wals[older].restart(generation)?;
            self.wals[self.active].restart(generation + 1)?;
        }
        Ok(())
    }
}
