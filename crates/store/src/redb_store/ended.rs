//! The leases that ended lately ([`Write::LeaseEnded`]), kept so that a
//! table recovered after a restart still answers a late attempt of their
//! requests "ended" (see `repeats.rs` in the core). Each is kept under the
//! wall-clock millisecond at which it was written into redb (its end, or a
//! little later: a log is folded after it filled), and dropped by the
//! first write more than [`KEPT_MS`] later. The wall clock only bounds how
//! long a record is kept: a clock set back keeps them longer; one set
//! forward by more than the table's memory drops them early, and a late
//! attempt of such a request is then served as the table alone judges it.

use std::time::{SystemTime, UNIX_EPOCH};

use baton_core::REPEAT_MEMORY_MS;

use super::*;

/// Ended leases: (wall-clock ms when written, acquisition digest). Created
/// by the first ended lease (format 5); a store without it has none.
const ENDED: TableDefinition<(u64, [u8; 16]), ()> = TableDefinition::new("ended");

/// How long an ended lease is kept: the table's memory, and as much again
/// for the time between its end and its write into redb.
pub(super) const KEPT_MS: u64 = 2 * REPEAT_MEMORY_MS;

/// Now, in milliseconds since the Unix epoch (0 for a clock before it).
pub(super) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `digests` as ended at `now_ms` in `txn`, and drops the ended
/// leases written more than [`KEPT_MS`] before.
pub(super) fn keep(
    txn: &redb::WriteTransaction,
    digests: &[AcquisitionDigest],
    now_ms: u64,
) -> Result<(), StoreError> {
    let mut table = if digests.is_empty() {
        match txn.open_table(ENDED) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(storage(e)),
        }
    } else {
        txn.open_table(ENDED).map_err(storage)?
    };
    for digest in digests {
        table
            .insert((now_ms, *digest.as_bytes()), ())
            .map_err(storage)?;
    }
    let cutoff = now_ms.saturating_sub(KEPT_MS);
    table
        .retain_in(..(cutoff, [0u8; 16]), |_, ()| false)
        .map_err(storage)
}

/// The ended leases in `txn` written at most [`KEPT_MS`] before `now_ms`,
/// after `pending` (those of the logs not yet in redb).
pub(super) fn read(
    txn: &redb::ReadTransaction,
    pending: Vec<AcquisitionDigest>,
    now_ms: u64,
) -> Result<Vec<AcquisitionDigest>, StoreError> {
    let mut ended = pending;
    let table = match txn.open_table(ENDED) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(ended),
        Err(e) => return Err(storage(e)),
    };
    let cutoff = now_ms.saturating_sub(KEPT_MS);
    for entry in table.range((cutoff, [0u8; 16])..).map_err(storage)? {
        let (key, _) = entry.map_err(storage)?;
        ended.push(AcquisitionDigest::from_bytes(key.value().1));
    }
    Ok(ended)
}

impl RedbStore {
    /// The leases that ended lately, as [`crate::LeaseStore::ended`] gives them.
    /// redb's read transaction and the logs' ended leases are taken
    /// together, as [`RedbStore::view`] takes the whole overlay, but only
    /// the ended leases are copied.
    pub(super) fn ended_inner(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        let (txn, pending) = self.folder.with_frozen(|frozen| {
            let txn = self.db.begin_read().map_err(storage)?;
            let pending: Vec<_> = frozen.ended().chain(self.pending.ended()).collect();
            Ok::<_, StoreError>((txn, pending))
        })?;
        read(&txn, pending, wall_ms())
    }
}
