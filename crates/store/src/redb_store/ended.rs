//! The leases that ended lately ([`Write::LeaseEnded`]), kept so that a
//! table recovered after a restart still answers a late attempt of their
//! requests "ended" (see `repeats.rs` in the core). The ended leases of one
//! write into redb (a fold of a log, most of the time) are kept together,
//! as one value under the wall-clock millisecond of that write: one insert
//! per fold, however many leases ended, and one removal when they are
//! dropped, the first write more than [`KEPT_MS`] later. The wall clock
//! only bounds how long a record is kept: a clock set back keeps them
//! longer; one set forward by more than the table's memory drops them
//! early, and a late attempt of such a request is then served as the table
//! alone judges it.

use std::time::{SystemTime, UNIX_EPOCH};

use baton_core::REPEAT_MEMORY_MS;

use super::*;

/// Ended leases: wall-clock ms when written -> their acquisition digests,
/// 16 bytes each, end to end. Created by the first ended lease.
const ENDED: TableDefinition<u64, &[u8]> = TableDefinition::new("ended_by_write");

/// The table of one row per ended lease that builds between format 5's
/// first landing and this layout wrote; never released, dropped on open.
const ENDED_ONE_PER_ROW: &str = "ended";

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
    if !digests.is_empty() {
        // Two writes in one millisecond share its value.
        let mut bytes = match table.get(now_ms).map_err(storage)? {
            Some(earlier) => earlier.value().to_vec(),
            None => Vec::with_capacity(digests.len() * 16),
        };
        for digest in digests {
            bytes.extend_from_slice(digest.as_bytes());
        }
        table.insert(now_ms, bytes.as_slice()).map_err(storage)?;
    }
    let cutoff = now_ms.saturating_sub(KEPT_MS);
    table.retain_in(..cutoff, |_, _| false).map_err(storage)
}

/// Drops the one-row-per-lease table of unreleased builds (see
/// [`ENDED_ONE_PER_ROW`]), if there is one: at most two minutes of
/// ended leases, whose late attempts the table then judges alone.
pub(super) fn drop_one_per_row_table(db: &Database) -> Result<(), StoreError> {
    let old: TableDefinition<(u64, [u8; 16]), ()> = TableDefinition::new(ENDED_ONE_PER_ROW);
    let exists = match db.begin_read().map_err(storage)?.open_table(old) {
        Ok(_) => true,
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => return Err(storage(e)),
    };
    if exists {
        let txn = begin_write(db)?;
        txn.delete_table(old).map_err(storage)?;
        txn.commit().map_err(storage)?;
    }
    Ok(())
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
    for entry in table.range(cutoff..).map_err(storage)? {
        let (_, digests) = entry.map_err(storage)?;
        for bytes in digests.value().chunks_exact(16) {
            let bytes: [u8; 16] = bytes.try_into().expect("chunks of 16");
            ended.push(AcquisitionDigest::from_bytes(bytes));
        }
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
