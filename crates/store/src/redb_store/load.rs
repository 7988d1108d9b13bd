//! Loading: redb's tables with the log's pending writes laid over them.

use std::{collections::BTreeMap, sync::mpsc};

use super::*;
use crate::Loading;

impl RedbStore {
    /// The state as of now, its leases read as `take` iterates them. A
    /// panic in redb (a damaged file) becomes an error, both while the
    /// state is opened and while each lease is read; one in `take` is not
    /// the store's and is not caught.
    pub(super) fn load_with_inner(
        &self,
        take: &mut dyn FnMut(Loading<'_>),
    ) -> Result<(), StoreError> {
        let path = Self::path_in(&self.data_dir);
        let (txn, overlay) = contain_panics(&path, || self.view())?;
        let table = contain_panics(&path, || txn.open_table(LEASES).map_err(storage))?;
        let (stored, changed, n_max) = contain_panics(&path, || open_head(&txn, &table, &overlay))?;
        // redb's pages are read on a thread of their own, into batches of
        // undecoded records, while `take` decodes and builds from the
        // batches before: a restart's two halves (reading ten million
        // records, building the table) then run side by side on two cores,
        // and every name is allocated where the table is built. At most
        // `BATCHES_AHEAD` batches wait, so the records are never all held
        // beside the table.
        std::thread::scope(|scope| {
            let (batch_tx, batch_rx) = mpsc::sync_channel(BATCHES_AHEAD);
            let path = &path;
            std::thread::Builder::new()
                .name("baton-load".into())
                .spawn_scoped(scope, move || read_ahead(path, &table, batch_tx))
                .map_err(|source| StoreError::Io {
                    path: path.display().to_string(),
                    source,
                })?;
            let read = batch_rx.into_iter().flat_map(RawBatch::into_leases);
            let mut leases = AtMost {
                n_max,
                leases: merge(read, changed),
            };
            take(Loading {
                epoch: stored.epoch,
                counter: stored.counter,
                sessions: stored.sessions,
                leases: &mut leases,
            });
            // Dropping `leases` here stops the reader if `take` left some.
            Ok(())
        })
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

/// The leases of a state being read, with an upper bound on their count.
struct AtMost<I> {
    leases: I,
    n_max: usize,
}

impl<I: Iterator> Iterator for AtMost<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.leases.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.n_max))
    }
}

type LeaseItem = Result<(ResourceName, LeaseRecord), StoreError>;

/// Leases the load's reader hands over at a time.
pub(super) const BATCH_LEN: usize = 4096;
/// Batches read and not yet taken, at most.
const BATCHES_AHEAD: usize = 4;

/// Stored leases as redb gives them, not yet decoded: their names and
/// records one after another in one buffer, and an error that ended the
/// read after them.
struct RawBatch {
    bytes: Vec<u8>,
    /// Where each name ends, and its record after it.
    ends: Vec<(usize, usize)>,
    failed: Option<StoreError>,
}

impl RawBatch {
    /// The batch's leases, decoded in order, then its error.
    fn into_leases(self) -> impl Iterator<Item = LeaseItem> {
        let Self {
            bytes,
            ends,
            failed,
        } = self;
        let mut start = 0;
        let leases = ends.into_iter().map(move |(name_end, end)| {
            let (name, record) = (&bytes[start..name_end], &bytes[name_end..end]);
            start = end;
            // redb checked the name's UTF-8 as it read it.
            let name = std::str::from_utf8(name).map_err(storage)?;
            decode(name, record)
        });
        leases.chain(failed.map(Err))
    }
}

/// The load's reader: the leases of `table` in batches to `batch_tx`,
/// until they end, one fails, or the taker leaves.
fn read_ahead(
    path: &Path,
    table: &redb::ReadOnlyTable<&'static str, &'static [u8]>,
    batch_tx: mpsc::SyncSender<RawBatch>,
) {
    let mut entries = match contain_panics(path, || table.iter().map_err(storage)) {
        Ok(entries) => entries,
        Err(e) => {
            let _ = batch_tx.send(RawBatch {
                bytes: Vec::new(),
                ends: Vec::new(),
                failed: Some(e),
            });
            return;
        }
    };
    loop {
        let mut batch = RawBatch {
            // A name and its record are some tens of bytes.
            bytes: Vec::with_capacity(BATCH_LEN * 64),
            ends: Vec::with_capacity(BATCH_LEN),
            failed: None,
        };
        let read = contain_panics(path, || {
            for entry in entries.by_ref() {
                let (k, v) = entry.map_err(storage)?;
                batch.bytes.extend_from_slice(k.value().as_bytes());
                let name_end = batch.bytes.len();
                batch.bytes.extend_from_slice(v.value());
                batch.ends.push((name_end, batch.bytes.len()));
                if batch.ends.len() == BATCH_LEN {
                    break;
                }
            }
            Ok(())
        });
        batch.failed = read.err();
        let last = batch.ends.len() < BATCH_LEN || batch.failed.is_some();
        if batch_tx.send(batch).is_err() || last {
            return;
        }
    }
}

/// A state opened for reading: everything but the leases read, and the
/// leases to come.
struct Opened<'t> {
    stored: Stored,
    leases: Box<dyn Iterator<Item = LeaseItem> + 't>,
    n_max: usize,
}

/// The state in `txn` with `overlay` (the log's writes not yet folded)
/// laid over it, read whole.
fn read(txn: &redb::ReadTransaction, overlay: &[Write]) -> Result<Stored, StoreError> {
    let table = txn.open_table(LEASES).map_err(storage)?;
    let opened = open(txn, &table, overlay)?;
    let mut leases = AtMost {
        leases: opened.leases,
        n_max: opened.n_max,
    };
    Loading {
        epoch: opened.stored.epoch,
        counter: opened.stored.counter,
        sessions: opened.stored.sessions,
        leases: &mut leases,
    }
    .read_all()
}

/// The state in `txn` with `overlay` laid over it: the meta and sessions
/// read, the leases of `table` merged with the overlay's as they are read.
fn open<'t>(
    txn: &redb::ReadTransaction,
    table: &'t redb::ReadOnlyTable<&'static str, &'static [u8]>,
    overlay: &'t [Write],
) -> Result<Opened<'t>, StoreError> {
    let (stored, changed, n_max) = open_head(txn, table, overlay)?;
    let leases = table.iter().map_err(storage)?.map(|entry| {
        let (k, v) = entry.map_err(storage)?;
        decode(k.value(), v.value())
    });
    Ok(Opened {
        stored,
        leases: Box::new(merge(leases, changed)),
        n_max,
    })
}

/// The state in `txn` with `overlay` laid over it but for the leases: the
/// meta and sessions read, the overlay's lease writes to merge with the
/// stored leases, and how many leases there are at most.
fn open_head<'t>(
    txn: &redb::ReadTransaction,
    table: &redb::ReadOnlyTable<&'static str, &'static [u8]>,
    overlay: &'t [Write],
) -> Result<(Stored, Changed<'t>, usize), StoreError> {
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
    // that ten million leases are read once, into whatever takes them.
    let changed = apply_except_leases(&mut stored, overlay);
    let n_max = table.len().map_err(storage)? as usize + changed.len();
    Ok((stored, changed, n_max))
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
    let merged = merge(base.into_iter().map(Ok), changed);
    stored.leases = merged
        .map(|lease| lease.unwrap_or_else(|never: std::convert::Infallible| match never {}))
        .collect();
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
            // Not part of the state a load gives (see `ended.rs` and
            // `history.rs`).
            Write::LeaseEnded { .. } | Write::Changed(_) => {}
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

/// `base` (in strictly rising name order) with each changed name put or
/// deleted, in name order, as `base` is read.
fn merge<'c, E>(
    base: impl Iterator<Item = Result<(ResourceName, LeaseRecord), E>> + 'c,
    changed: Changed<'c>,
) -> impl Iterator<Item = Result<(ResourceName, LeaseRecord), E>> + 'c {
    let mut base = base.peekable();
    let mut changes = changed.into_iter().peekable();
    std::iter::from_fn(move || loop {
        use std::cmp::Ordering;
        // Which comes first: the next stored lease or the next change
        // (`Less`: the change); a change of the same name replaces it.
        let first = match (base.peek(), changes.peek()) {
            (Some(Err(_)), _) => return base.next(),
            (None, None) => return None,
            (Some(Ok(_)), None) => Ordering::Greater,
            (None, Some(_)) => Ordering::Less,
            (Some(Ok((name, _))), Some((c, _))) => (*c).cmp(name),
        };
        if first == Ordering::Greater {
            return base.next();
        }
        if first == Ordering::Equal {
            base.next();
        }
        let (name, record) = changes.next().expect("peeked");
        if let Some(record) = record {
            return Some(Ok((name.clone(), record.clone())));
        }
    })
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
            shape: baton_core::Shape::Exclusive,
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
