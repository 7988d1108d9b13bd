//! The quotas the table counts (`baton_core`'s `table/quotas.rs`): handed
//! to it when the engine starts and again after each reload of the quota
//! file, and read from it by `/metrics`.

use std::sync::Arc;

use baton_core::LeaseTable;

use super::Shared;
use crate::metrics::QuotaUseRead;
use crate::quota::Quotas;

/// The quota file the engine follows, and the reload its table took.
pub(super) struct Followed {
    quotas: Arc<Quotas>,
    generation: u64,
}

impl Followed {
    /// Hands `table` the quotas in force: counted from what it holds, so
    /// exact after a restart or a failover.
    pub(super) fn start(quotas: Arc<Quotas>, table: &mut LeaseTable) -> Self {
        let generation = quotas.generation();
        if quotas.is_on() {
            table.set_quotas((*quotas.rules()).clone());
        }
        Self { quotas, generation }
    }

    /// Hands `table` the quotas of a reload it has not seen (a recount:
    /// O(leases) once per reload), before the next command is applied.
    pub(super) fn catch_up(&mut self, table: &mut LeaseTable) {
        let generation = self.quotas.generation();
        if generation != self.generation {
            self.generation = generation;
            table.set_quotas((*self.quotas.rules()).clone());
        }
    }
}

/// How `/metrics` reads the counts of `shared`'s table, while it lives.
pub(super) fn reader(shared: &Arc<Shared>) -> QuotaUseRead {
    let weak = Arc::downgrade(shared);
    Box::new(move || {
        let shared = weak.upgrade()?;
        let engine = shared.lock();
        let (uses, shared_waiters) = engine.table.quota_use();
        Some((uses, shared_waiters, engine.table.quota_sessions()))
    })
}
