//! The latest holder changes ([`Write::Changed`]), kept so that a watcher
//! resumes across a restart. The changes of one write into redb (a fold
//! of a log, most of the time) are kept together, end to end, as one
//! value under the first one's number: one insert per fold, however many
//! changed, and one removal when all of them are older than the newest
//! [`baton_core::HISTORY_LEN_MAX`] changes. The last change's number is
//! also in the meta table (`seq`), so it survives the history's trimming.

use baton_core::{NumberedChange, HISTORY_LEN_MAX};

use super::*;
use crate::wal::{decode_changes, encode_change};
use crate::History;

/// Changes: the first one's number -> the changes of one write, encoded
/// end to end. Created by the first change.
const CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("changes_by_write");

/// Writes `changes` (in number order) in `txn` with the last one's number
/// in `meta`, and drops the values whose changes are all older than the
/// newest [`HISTORY_LEN_MAX`].
pub(super) fn keep(
    txn: &redb::WriteTransaction,
    meta: &mut redb::Table<&str, u64>,
    changes: &[NumberedChange],
) -> Result<(), StoreError> {
    let (Some(first), Some(last)) = (changes.first(), changes.last()) else {
        return Ok(());
    };
    let mut bytes = Vec::with_capacity(64 * changes.len());
    for c in changes {
        encode_change(&mut bytes, c);
    }
    let mut table = txn.open_table(CHANGES).map_err(storage)?;
    table.insert(first.seq, bytes.as_slice()).map_err(storage)?;
    meta.insert("seq", last.seq).map_err(storage)?;
    // A value is dropped once the next one starts at or below the oldest
    // number kept: all of its changes are older.
    let oldest_kept = (last.seq + 1).saturating_sub(HISTORY_LEN_MAX as u64);
    let mut starts = Vec::new();
    for entry in table.range(..=oldest_kept).map_err(storage)? {
        starts.push(entry.map_err(storage)?.0.value());
    }
    if let Some((_, older)) = starts.split_last() {
        for start in older {
            table.remove(*start).map_err(storage)?;
        }
    }
    Ok(())
}

/// The last `n_max` kept changes in `txn` and the last number, with
/// `pending` (those of the logs not yet in redb, in number order) after
/// them. Only the values that hold one of the last `n_max` are decoded.
pub(super) fn read(
    txn: &redb::ReadTransaction,
    pending: Vec<NumberedChange>,
    n_max: usize,
) -> Result<History, StoreError> {
    let meta = txn.open_table(META).map_err(storage)?;
    let mut seq = meta.get("seq").map_err(storage)?.map_or(0, |v| v.value());
    let mut changes = Vec::new();
    match txn.open_table(CHANGES) {
        Ok(table) => {
            // Newest value first, until those read hold the last n_max
            // changes in redb (a value holds its first number up to the
            // last one redb has, `seq` in the meta table, or to the next
            // value's first).
            let mut values = Vec::new();
            for entry in table.iter().map_err(storage)?.rev() {
                let (start, value) = entry.map_err(storage)?;
                values.push(value.value().to_vec());
                if (seq + 1).saturating_sub(start.value()) >= n_max as u64 {
                    break;
                }
            }
            for value in values.iter().rev() {
                let decoded = decode_changes(value)
                    .map_err(|e| StoreError::Corrupt(format!("the kept changes: {e}")))?;
                changes.extend(decoded);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage(e)),
    }
    // A fold under way may have written some of the pending ones already.
    let written = changes.last().map_or(0, |c| c.seq);
    changes.extend(pending.into_iter().filter(|c| c.seq > written));
    if let Some(last) = changes.last() {
        seq = seq.max(last.seq);
    }
    let excess = changes.len().saturating_sub(n_max.min(HISTORY_LEN_MAX));
    changes.drain(..excess);
    Ok(History { seq, changes })
}

impl RedbStore {
    /// The kept changes, as [`crate::LeaseStore::history`] gives them:
    /// redb's read transaction and the logs' changes taken together.
    pub(super) fn history_inner(&self, n_max: usize) -> Result<History, StoreError> {
        let (txn, pending) = self.folder.with_frozen(|frozen| {
            let txn = self.db.begin_read().map_err(storage)?;
            let pending: Vec<_> = frozen
                .changes()
                .chain(self.pending.changes())
                .cloned()
                .collect();
            Ok::<_, StoreError>((txn, pending))
        })?;
        read(&txn, pending, n_max)
    }
}
