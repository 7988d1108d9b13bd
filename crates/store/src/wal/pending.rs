//! What the log holds beyond redb, one entry per key: what a load lays
//! over redb and what a fold writes into it.

use super::*;

/// What the log holds beyond redb, one entry per key (the last write wins),
/// so a checkpoint is one redb transaction of at most one write per key.
///
/// B-trees, not hash maps: a hash map doubles its table at once when it
/// fills, and a log's worth of keys (half a million) made the commit that
/// crossed the line take 180-200 ms (moving every entry into freshly
/// faulted pages); a B-tree grows a node at a time. The keys come out in
/// order, which is also the order redb writes best.
#[derive(Default)]
pub(crate) struct Pending {
    leases: std::collections::BTreeMap<ResourceName, Option<LeaseRecord>>,
    sessions: std::collections::BTreeMap<AcquisitionDigest, Option<SessionRecord>>,
    tokens: Option<(Epoch, u64)>,
    /// Leases that ended (their digests are keys of their own), in the
    /// order they ended (a key written twice is written twice, harmlessly):
    /// an append costs nothing where a B-tree of random digests cost a
    /// cache miss a level (about 1.3% of the server's samples at 64
    /// sessions); they are sorted when written out, for redb.
    ended: Vec<AcquisitionDigest>,
    /// Holder changes, in number order (each is a key of its own).
    changes: Vec<NumberedChange>,
}

impl Pending {
    pub(crate) fn absorb(&mut self, writes: &[Write]) {
        for w in writes {
            match w {
                Write::PutLease { resource, record } => {
                    self.leases.insert(resource.clone(), Some(record.clone()));
                }
                Write::DeleteLease { resource } => {
                    self.leases.insert(resource.clone(), None);
                }
                Write::Tokens { epoch, counter } => self.tokens = Some((*epoch, *counter)),
                Write::PutSession { record } => {
                    self.sessions.insert(record.digest, Some(record.clone()));
                }
                Write::DeleteSession { digest } => {
                    self.sessions.insert(*digest, None);
                }
                Write::LeaseEnded { digest } => self.ended.push(*digest),
                Write::Changed(change) => self.changes.push(change.clone()),
            }
        }
    }

    /// Keys pending (leases, sessions, ended leases and changes).
    pub(crate) fn len(&self) -> usize {
        self.leases.len() + self.sessions.len() + self.ended.len() + self.changes.len()
    }

    /// Whether nothing is pending, the token position included.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0 && self.tokens.is_none()
    }

    /// At most `n` pending keys as writes, and the token position, copied
    /// and left pending: a background fold writes them into redb, then
    /// [`Pending::forget`]s them.
    pub(crate) fn peek(&self, n: usize) -> Vec<Write> {
        let leases = self
            .leases
            .iter()
            .take(n)
            .map(|(resource, record)| lease_write(resource.clone(), record.clone()));
        let sessions = self
            .sessions
            .iter()
            .take(n.saturating_sub(self.leases.len()))
            .map(|(digest, record)| session_write(*digest, record.clone()));
        let mut ended: Vec<AcquisitionDigest> = self
            .ended
            .iter()
            .take(n.saturating_sub(self.leases.len() + self.sessions.len()))
            .copied()
            .collect();
        ended.sort_unstable();
        let n_before = self.leases.len() + self.sessions.len() + self.ended.len();
        let changes = self
            .changes
            .iter()
            .take(n.saturating_sub(n_before))
            .cloned()
            .map(Write::Changed);
        let ended = ended.into_iter().map(|digest| Write::LeaseEnded { digest });
        let tokens = self
            .tokens
            .map(|(epoch, counter)| Write::Tokens { epoch, counter });
        leases
            .chain(sessions)
            .chain(ended)
            .chain(changes)
            .chain(tokens)
            .collect()
    }

    /// Drops the keys (and the token position) that `writes` from
    /// [`Pending::peek`] name: they are in redb now. Nothing else may have
    /// been absorbed since the peek (a frozen log's writes do not change).
    pub(crate) fn forget(&mut self, writes: &[Write]) {
        let mut ended = std::collections::HashSet::new();
        let mut changed_to = None;
        for w in writes {
            match w {
                Write::PutLease { resource, .. } | Write::DeleteLease { resource } => {
                    self.leases.remove(resource);
                }
                Write::PutSession { record } => {
                    self.sessions.remove(&record.digest);
                }
                Write::DeleteSession { digest } => {
                    self.sessions.remove(digest);
                }
                Write::Tokens { .. } => self.tokens = None,
                Write::LeaseEnded { digest } => {
                    ended.insert(*digest);
                }
                Write::Changed(c) => changed_to = changed_to.max(Some(c.seq)),
            }
        }
        if let Some(last) = changed_to {
            // The peek took a prefix, in number order.
            self.changes.retain(|c| c.seq > last);
        }
        if !ended.is_empty() {
            self.ended.retain(|d| !ended.contains(d));
        }
    }

    /// At most `n` pending keys as writes, taken out (the token position
    /// stays pending until the full drain).
    pub(crate) fn take(&mut self, n: usize) -> Vec<Write> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        while out.len() < n {
            let Some((resource, record)) = self.leases.pop_first() else {
                break;
            };
            out.push(lease_write(resource, record));
        }
        while out.len() < n {
            let Some((digest, record)) = self.sessions.pop_first() else {
                break;
            };
            out.push(session_write(digest, record));
        }
        let k = n.saturating_sub(out.len()).min(self.ended.len());
        let mut ended: Vec<AcquisitionDigest> = self.ended.drain(..k).collect();
        ended.sort_unstable();
        out.extend(ended.into_iter().map(|digest| Write::LeaseEnded { digest }));
        let k = n.saturating_sub(out.len()).min(self.changes.len());
        out.extend(self.changes.drain(..k).map(Write::Changed));
        out
    }

    /// The ended leases pending (not yet in redb).
    pub(crate) fn ended(&self) -> impl Iterator<Item = AcquisitionDigest> + '_ {
        self.ended.iter().copied()
    }

    /// The holder changes pending (not yet in redb), in number order.
    pub(crate) fn changes(&self) -> impl Iterator<Item = &NumberedChange> + '_ {
        self.changes.iter()
    }

    /// The pending state as writes, left pending: what a load lays over
    /// redb (order does not matter: one per key).
    pub(crate) fn writes(&self) -> Vec<Write> {
        self.peek(usize::MAX)
    }

    /// The pending state as writes (order does not matter: one per key).
    pub(crate) fn drain(&mut self) -> Vec<Write> {
        let mut out = self.take(usize::MAX);
        if let Some((epoch, counter)) = self.tokens.take() {
            out.push(Write::Tokens { epoch, counter });
        }
        out
    }
}

/// A pending lease key as its write: the record, or its deletion.
fn lease_write(resource: ResourceName, record: Option<LeaseRecord>) -> Write {
    match record {
        Some(record) => Write::PutLease { resource, record },
        None => Write::DeleteLease { resource },
    }
}

/// A pending session key as its write: the record, or its deletion.
fn session_write(digest: AcquisitionDigest, record: Option<SessionRecord>) -> Write {
    match record {
        Some(record) => Write::PutSession { record },
        None => Write::DeleteSession { digest },
    }
}
