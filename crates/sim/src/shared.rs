//! The cluster's shared store, modelled on what the PostgreSQL store
//! promises: one leadership row whose takeover bumps the term, and
//! commits that apply all their writes or none and only while the
//! committer's term is the row's (`UPDATE ... WHERE term = $1` in one
//! transaction). Every request is applied at the instant it arrives, in
//! arrival order, and answered over the network.

use baton_core::{Epoch, Write};
use baton_store::{image, Stored};
use baton_store_pg::leader::LeaderRow;

/// What a node asks the store.
#[derive(Clone, Debug, Hash)]
pub enum StoreReq {
    Read,
    /// Take over from the row as read, sent at `sent_ms` (the taker's
    /// clock): refused if the row changed since (term, holder or beats),
    /// as `leader::take_over` refuses it under `FOR UPDATE`.
    TakeOver {
        seen: LeaderRowKey,
        sent_ms: u64,
    },
    /// The leader of `term` renews, sent at `sent_ms`.
    Beat {
        term: u64,
        sent_ms: u64,
    },
    /// Commit `writes` for the leader of `term`; `seq` names the commit.
    Commit {
        term: u64,
        seq: u64,
        writes: Vec<WriteKey>,
    },
    StepDown {
        term: u64,
    },
}

/// A write, carried by value (`Write` is not `Hash`).
#[derive(Clone, Debug)]
pub struct WriteKey(pub Write);

impl std::hash::Hash for WriteKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match &self.0 {
            Write::PutLease { resource, record } => {
                (0u8, resource.as_str(), record.token.get()).hash(h)
            }
            Write::DeleteLease { resource } => (1u8, resource.as_str()).hash(h),
            Write::Tokens { epoch, counter } => (2u8, epoch.get(), *counter).hash(h),
            Write::PutSession { record } => (3u8, record.ttl_ms).hash(h),
            Write::DeleteSession { .. } => 4u8.hash(h),
            Write::LeaseEnded { .. } => 5u8.hash(h),
            Write::Changed(c) => (6u8, c.seq).hash(h),
        }
    }
}

/// What the store answers.
#[derive(Clone, Debug, Hash)]
pub enum StoreAns {
    Row(LeaderRowKey),
    /// The takeover won `term`: the state to lead from.
    Won {
        term: u64,
        sent_ms: u64,
        state: StoredKey,
    },
    /// The row moved on before the takeover.
    Lost,
    Beat {
        term: u64,
        sent_ms: u64,
        ok: bool,
    },
    Committed {
        term: u64,
        seq: u64,
        ok: bool,
    },
}

/// The row, hashable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRowKey(pub LeaderRow);

impl std::hash::Hash for LeaderRowKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.0.term, &self.0.holder, self.0.beats).hash(h)
    }
}

/// A loaded state, hashed by its position and size.
#[derive(Clone, Debug)]
pub struct StoredKey(pub Stored);

impl std::hash::Hash for StoredKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.0.epoch.get(), self.0.counter, self.0.leases.len()).hash(h)
    }
}

/// The shared store.
pub struct Shared {
    pub row: LeaderRow,
    pub stored: Stored,
}

impl Shared {
    pub fn new() -> Self {
        Self {
            row: LeaderRow {
                term: 0,
                holder: None,
                advertise: None,
                beats: 0,
            },
            stored: empty_store(),
        }
    }

    /// Applies `req` from `node` and answers.
    pub fn handle(&mut self, node: usize, req: StoreReq) -> Option<StoreAns> {
        let me = node.to_string();
        match req {
            StoreReq::Read => Some(StoreAns::Row(LeaderRowKey(self.row.clone()))),
            StoreReq::TakeOver { seen, sent_ms } => {
                let now = &self.row;
                if (now.term, &now.holder, now.beats) != (seen.0.term, &seen.0.holder, seen.0.beats)
                {
                    return Some(StoreAns::Lost);
                }
                let term = now.term;
                self.row = LeaderRow {
                    term: term + 1,
                    holder: Some(me.clone()),
                    advertise: Some(me),
                    beats: 0,
                };
                Some(StoreAns::Won {
                    term: term + 1,
                    sent_ms,
                    state: StoredKey(self.stored.clone()),
                })
            }
            StoreReq::Beat { term, sent_ms } => {
                let ok = self.leads(term, &me);
                if ok {
                    self.row.beats += 1;
                }
                Some(StoreAns::Beat { term, sent_ms, ok })
            }
            StoreReq::Commit { term, seq, writes } => {
                let ok = self.leads(term, &me);
                if ok {
                    let writes: Vec<Write> = writes.into_iter().map(|w| w.0).collect();
                    image::apply(&mut self.stored, &writes);
                }
                Some(StoreAns::Committed { term, seq, ok })
            }
            StoreReq::StepDown { term } => {
                if self.leads(term, &me) {
                    self.row.holder = None;
                    self.row.advertise = None;
                }
                None
            }
        }
    }

    fn leads(&self, term: u64, node: &str) -> bool {
        self.row.term == term && self.row.holder.as_deref() == Some(node)
    }
}

/// A store that has never served: tokens start at epoch 1.
pub fn empty_store() -> Stored {
    Stored {
        epoch: Epoch::FIRST,
        counter: 0,
        leases: Vec::new(),
        sessions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the simulator (docs/simulator.md, "Findings"): a takeover
    /// that compared only the term let a follower take over from a row a
    /// late beat had just renewed, while the leader kept answering.
    #[test]
    fn a_takeover_fails_if_a_beat_landed_since_the_row_was_read() {
        let mut s = Shared::new();
        let Some(StoreAns::Row(empty)) = s.handle(0, StoreReq::Read) else {
            panic!()
        };
        assert!(matches!(
            s.handle(
                0,
                StoreReq::TakeOver {
                    seen: empty,
                    sent_ms: 0
                }
            ),
            Some(StoreAns::Won { term: 1, .. })
        ));
        let Some(StoreAns::Row(seen)) = s.handle(1, StoreReq::Read) else {
            panic!()
        };
        // The leader's beat lands after node 1 read the row.
        assert!(matches!(
            s.handle(
                0,
                StoreReq::Beat {
                    term: 1,
                    sent_ms: 5
                }
            ),
            Some(StoreAns::Beat { ok: true, .. })
        ));
        assert!(matches!(
            s.handle(1, StoreReq::TakeOver { seen, sent_ms: 9 }),
            Some(StoreAns::Lost)
        ));
        assert_eq!(s.row.holder.as_deref(), Some("0"));
        // A commit of another node, or of an old term, changes nothing.
        let commit = StoreReq::Commit {
            term: 1,
            seq: 1,
            writes: vec![WriteKey(Write::Tokens {
                epoch: Epoch::FIRST,
                counter: 9,
            })],
        };
        assert!(matches!(
            s.handle(1, commit.clone()),
            Some(StoreAns::Committed { ok: false, .. })
        ));
        assert_eq!(s.stored.counter, 0);
        assert!(matches!(
            s.handle(0, commit),
            Some(StoreAns::Committed { ok: true, .. })
        ));
        assert_eq!(s.stored.counter, 9);
    }
}
