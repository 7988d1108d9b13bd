//! Loading: redb's tables with the log's pending writes laid over them.

use std::collections::BTreeMap;

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
        leases: Vec::new(),
        sessions,
    };
    // The log's writes not yet folded, replayed at open or committed
    // since: a load sees every commit, before or after a reopen. The
    // leases are merged with them as redb gives them, in name order, so
    // that ten million leases are read into one vector, not two.
    let changed = apply_except_leases(&mut stored, overlay);
    let table = txn.open_table(LEASES).map_err(storage)?;
    let n_leases = table.len().map_err(storage)? as usize;
    let leases = table.iter().map_err(storage)?.map(|entry| {
        let (k, v) = entry.map_err(storage)?;
        decode(k.value(), v.value())
    });
    stored.leases = merge(leases, n_leases, changed)?;
    Ok(stored)
}

/// Applies `writes` in order to a loaded state (the log over redb). The
/// leases stay in name order. The log holds far fewer writes than redb
/// holds leases, so the writes are folded into a small map (the last
/// write of a name wins) and merged into the sorted leases in one pass:
/// a restart or backup with ten million leases does not rebuild them
/// into a tree and back.
pub fn apply(stored: &mut Stored, writes: &[Write]) {
    if writes.is_empty() {
        return;
    }
    let changed = apply_except_leases(stored, writes);
    if changed.is_empty() {
        return;
    }
    let mut base = std::mem::take(&mut stored.leases);
    if !base.windows(2).all(|w| w[0].0 < w[1].0) {
        // Not as a store reads them: sorted, the last of a name kept.
        base = base
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
    }
    let n_base = base.len();
    let merged = merge(base.into_iter().map(Ok), n_base, changed);
    stored.leases = merged.unwrap_or_else(|never: std::convert::Infallible| match never {});
}

/// The lease writes of `writes`, the last of each name (`None`: deleted).
type Changed<'w> = BTreeMap<&'w ResourceName, Option<&'w LeaseRecord>>;

/// Applies every write but the leases' to `stored`, in order, and
/// returns the lease writes for [`merge`].
fn apply_except_leases<'w>(stored: &mut Stored, writes: &'w [Write]) -> Changed<'w> {
    let mut changed = Changed::new();
    let mut sessions: Option<BTreeMap<AcquisitionDigest, SessionRecord>> = None;
    for w in writes {
        match w {
            Write::PutLease { resource, record } => {
                changed.insert(resource, Some(record));
            }
            Write::DeleteLease { resource } => {
                changed.insert(resource, None);
            }
            Write::Tokens { epoch, counter } => {
                stored.epoch = *epoch;
                stored.counter = *counter;
            }
            Write::PutSession { record } => {
                let sessions = sessions.get_or_insert_with(|| sessions_by_digest(stored));
                sessions.insert(record.digest, record.clone());
            }
            Write::DeleteSession { digest } => {
                let sessions = sessions.get_or_insert_with(|| sessions_by_digest(stored));
                sessions.remove(digest);
            }
        }
    }
    if let Some(sessions) = sessions {
        stored.sessions = sessions.into_values().collect();
    }
    changed
}

fn sessions_by_digest(stored: &mut Stored) -> BTreeMap<AcquisitionDigest, SessionRecord> {
    std::mem::take(&mut stored.sessions)
        .into_iter()
        .map(|s| (s.digest, s))
        .collect()
}

/// `base` (in strictly rising name order, about `n_base` of them) with
/// each changed name put or deleted, in name order.
fn merge<E>(
    base: impl Iterator<Item = Result<(ResourceName, LeaseRecord), E>>,
    n_base: usize,
    changed: Changed<'_>,
) -> Result<Vec<(ResourceName, LeaseRecord)>, E> {
    let mut out = Vec::with_capacity(n_base + changed.len());
    let mut changes = changed.into_iter().peekable();
    let put = |out: &mut Vec<_>, name: &ResourceName, record: Option<&LeaseRecord>| {
        if let Some(record) = record {
            out.push((name.clone(), record.clone()));
        }
    };
    for item in base {
        let (name, record) = item?;
        while let Some((c, v)) = changes.next_if(|(c, _)| **c < name) {
            put(&mut out, c, v);
        }
        match changes.next_if(|(c, _)| **c == name) {
            Some((c, v)) => put(&mut out, c, v),
            None => out.push((name, record)),
        }
    }
    for (c, v) in changes {
        put(&mut out, c, v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use baton_core::{AcquisitionId, Epoch, FencingToken};

    use super::*;

    fn record(n: u64) -> LeaseRecord {
        LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([n as u8; 16]).digest(),
            token: FencingToken::new(Epoch::FIRST, n + 1).unwrap(),
            ttl_ms: 5_000,
            session: None,
            holder: None,
        }
    }

    fn name(n: u64) -> ResourceName {
        ResourceName::parse(&format!("r{n:03}")).unwrap()
    }

    /// What `apply` did before the merge: every lease into a tree, each
    /// write in order, and back out in name order (no lease write: the
    /// leases as they were).
    fn reference(
        base: &[(ResourceName, LeaseRecord)],
        writes: &[Write],
    ) -> Vec<(ResourceName, LeaseRecord)> {
        if writes.is_empty() {
            return base.to_vec();
        }
        let mut leases: BTreeMap<_, _> = base.iter().cloned().collect();
        for w in writes {
            match w {
                Write::PutLease { resource, record } => {
                    leases.insert(resource.clone(), record.clone());
                }
                Write::DeleteLease { resource } => {
                    leases.remove(resource);
                }
                _ => {}
            }
        }
        leases.into_iter().collect()
    }

    #[test]
    fn the_merge_matches_writing_every_lease_into_a_tree() {
        // A small linear congruential sequence: deterministic, no RNG crate.
        let mut x: u64 = 7;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for case in 0..300 {
            let n_base = next(40);
            let mut base: Vec<_> = (0..n_base)
                .map(|_| next(60))
                .map(|n| (name(n), record(n)))
                .collect();
            if case % 3 != 0 {
                // Most bases come sorted and unique, as redb reads them.
                base.sort_by(|a, b| a.0.cmp(&b.0));
                base.dedup_by(|a, b| a.0 == b.0);
            }
            let writes: Vec<_> = (0..next(20))
                .map(|i| {
                    let n = next(70);
                    if next(3) == 0 {
                        Write::DeleteLease { resource: name(n) }
                    } else {
                        Write::PutLease {
                            resource: name(n),
                            record: record(n + 100 * i),
                        }
                    }
                })
                .collect();
            let mut stored = Stored {
                epoch: Epoch::FIRST,
                counter: 0,
                leases: base.clone(),
                sessions: Vec::new(),
            };
            apply(&mut stored, &writes);
            assert_eq!(
                stored.leases,
                reference(&base, &writes),
                "case {case}: base {base:?}, writes {writes:?}"
            );
        }
    }
}
