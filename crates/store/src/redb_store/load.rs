//! Loading: redb's tables with the log's pending writes laid over them.

use super::*;

impl RedbStore {
    pub(super) fn load_inner(&self) -> Result<Stored, StoreError> {
        let (txn, overlay) = self.view()?;
        read(&txn, &overlay)
    }

    /// redb's read transaction (a consistent view of its file) and the
    /// logs' writes not yet in redb as of now: no read of the table yet.
    pub(super) fn snapshot_inner(&self) -> Result<crate::SnapshotRead, StoreError> {
        let (txn, overlay) = self.view()?;
        Ok(Box::new(move || read(&txn, &overlay)))
    }

    /// redb's read transaction and, taken with it while no background fold
    /// can take a key out, the frozen log's writes and then the active
    /// log's: laid over redb in that order they give every key its last
    /// committed value (see `fold.rs`).
    fn view(&self) -> Result<(redb::ReadTransaction, Vec<Write>), StoreError> {
        self.folder.with_frozen(|frozen| {
            let txn = self.db.begin_read().map_err(storage)?;
            let mut overlay = frozen.writes();
            overlay.extend(self.pending.writes());
            Ok((txn, overlay))
        })
    }
}

/// The state in `txn` with `overlay` (the log's writes not yet folded)
/// laid over it.
fn read(txn: &redb::ReadTransaction, overlay: &[Write]) -> Result<Stored, StoreError> {
    let meta = read_meta_in(txn)?;
    let table = txn.open_table(LEASES).map_err(storage)?;
    let mut leases = Vec::with_capacity(table.len().map_err(storage)? as usize);
    for entry in table.iter().map_err(storage)? {
        let (k, v) = entry.map_err(storage)?;
        leases.push(decode(k.value(), v.value())?);
    }
    let mut openers = std::collections::HashMap::new();
    match txn.open_table(SESSION_OPENERS) {
        Ok(table) => {
            for entry in table.iter().map_err(storage)? {
                let (k, v) = entry.map_err(storage)?;
                openers.insert(k.value().to_vec(), v.value().to_string());
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage(e)),
    }
    let mut sessions = Vec::new();
    match txn.open_table(SESSIONS) {
        Ok(table) => {
            for entry in table.iter().map_err(storage)? {
                let (k, v) = entry.map_err(storage)?;
                let digest = <[u8; 16]>::try_from(k.value()).map_err(|_| {
                    StoreError::Corrupt(format!(
                        "a session key is {} bytes, expected 16",
                        k.value().len()
                    ))
                })?;
                sessions.push(SessionRecord {
                    digest: AcquisitionDigest::from_bytes(digest),
                    ttl_ms: v.value(),
                    opener: openers.remove(&digest[..]),
                });
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage(e)),
    }
    let mut stored = Stored {
        epoch: meta.epoch,
        counter: meta.counter,
        leases,
        sessions,
    };
    // The log's writes not yet folded, replayed at open or committed
    // since: a load sees every commit, before or after a reopen.
    apply(&mut stored, overlay);
    Ok(stored)
}

/// Applies `writes` in order to a loaded state (the log over redb).
pub fn apply(stored: &mut Stored, writes: &[Write]) {
    if writes.is_empty() {
        return;
    }
    let mut leases: std::collections::BTreeMap<ResourceName, LeaseRecord> =
        std::mem::take(&mut stored.leases).into_iter().collect();
    let mut sessions: std::collections::BTreeMap<AcquisitionDigest, SessionRecord> =
        std::mem::take(&mut stored.sessions)
            .into_iter()
            .map(|s| (s.digest, s))
            .collect();
    for w in writes {
        match w {
            Write::PutLease { resource, record } => {
                leases.insert(resource.clone(), record.clone());
            }
            Write::DeleteLease { resource } => {
                leases.remove(resource);
            }
            Write::Tokens { epoch, counter } => {
                stored.epoch = *epoch;
                stored.counter = *counter;
            }
            Write::PutSession { record } => {
                sessions.insert(record.digest, record.clone());
            }
            Write::DeleteSession { digest } => {
                sessions.remove(digest);
            }
        }
    }
    stored.leases = leases.into_iter().collect();
    stored.sessions = sessions.into_values().collect();
}
