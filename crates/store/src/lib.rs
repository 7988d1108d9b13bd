//! Durable lease state behind a narrow trait.
//!
//! The server persists four things: the position of the last issued token
//! (epoch and counter), the held leases, the open sessions, and a format
//! number. The trait is small on purpose so that another backend
//! (PostgreSQL, etcd) can implement it and crash tests can wrap it.
#![warn(missing_docs)]

mod identity;
mod quiet;
mod record;
mod redb_store;
mod wal;

pub use identity::{Identity, StoreId};

/// The write-ahead log's records as pure functions on bytes: the code the
/// log writes and replays with, for a disk that is not a file (the
/// simulator's, which loses unsynced writes and tears the last one).
pub mod image {
    pub use crate::redb_store::apply;
    pub use crate::wal::{frame, replay, Undecodable};

    /// The payload of one commit of `writes`.
    pub fn encode(writes: &[baton_core::Write]) -> Vec<u8> {
        crate::wal::encode(writes)
    }

    /// One numbered change as the log encodes it (the cluster's store
    /// keeps its changes so too).
    pub fn encode_change(change: &baton_core::NumberedChange) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        crate::wal::encode_change(&mut out, change);
        out
    }

    /// Changes encoded by [`encode_change`], end to end.
    pub fn decode_changes(bytes: &[u8]) -> Result<Vec<baton_core::NumberedChange>, Undecodable> {
        crate::wal::decode_changes(bytes)
    }
}
pub use redb_store::RedbStore;
/// The size of each of the embedded store's two logs, unless set.
pub use wal::LEN_BYTES_DEFAULT as LOG_LEN_BYTES_DEFAULT;

use baton_core::{AcquisitionDigest, Epoch, LeaseRecord, ResourceName, SessionRecord, Write};

/// Everything a restart needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Epoch of the last issued token.
    pub epoch: Epoch,
    /// Counter of the last issued token in `epoch`.
    pub counter: u64,
    /// Every held lease, with its acquisition digest, token and TTL.
    pub leases: Vec<(ResourceName, LeaseRecord)>,
    /// Every open session, with its digest and TTL.
    pub sessions: Vec<SessionRecord>,
}

/// Where the engine makes lease state durable.
///
/// The engine calls [`LeaseStore::load_with`] once at start and
/// [`LeaseStore::commit`] with every batch that must be durable before its
/// replies go out (see docs/design.md, "The engine and the I/O ordering"). An implementation
/// must make a commit's writes durable, all of them or none, before it
/// returns `Ok`; after it returns `Err` the engine stops and never calls it
/// again, so a store may leave itself unusable (`StoreError::PreviousIo`).
pub trait LeaseStore: Send {
    /// Reads the durable state.
    fn load(&self) -> Result<Stored, StoreError>;
    /// Reads the durable state and hands it to `take`, which reads the
    /// leases from [`Loading::leases`] as the store reads them: a restart
    /// builds its table without holding every stored lease a second time.
    /// The default reads them all with [`LeaseStore::load`] first.
    fn load_with(&self, take: &mut dyn FnMut(Loading<'_>)) -> Result<(), StoreError> {
        let stored = self.load()?;
        let mut leases = stored.leases.into_iter().map(Ok);
        take(Loading {
            epoch: stored.epoch,
            counter: stored.counter,
            sessions: stored.sessions,
            leases: &mut leases,
        });
        Ok(())
    }
    /// Applies `writes` in order in one transaction and makes them durable
    /// before returning. After an error the store must not be used again.
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError>;
    /// How many commits [`LeaseStore::start_commit`] may have in flight at
    /// once. 1, the default: each is finished before the next starts.
    fn commits_in_flight_max(&self) -> usize {
        1
    }
    /// Starts committing `writes` after every commit started before, and
    /// hands its outcome to `done` once known. Outcomes come in the order
    /// the commits started, and a commit succeeds only if every commit
    /// started before it did: what is durable is always a prefix of the
    /// commits started. The default commits at once with
    /// [`LeaseStore::commit`] and calls `done` before it returns.
    fn start_commit(&mut self, writes: &[Write], done: CommitDone) {
        done(self.commit(writes));
    }
    /// A consistent view of every commit so far, taken now and read later
    /// on another thread: a backup of a large table then holds up neither
    /// the commits nor the lease table. Taking it must be cheap (no read
    /// of the whole table). `None`, the default: the store has no such
    /// view, and the engine copies its table instead.
    fn snapshot(&mut self) -> Option<Result<SnapshotRead, StoreError>> {
        None
    }
    /// The acquisition digests of the leases that ended lately
    /// ([`Write::LeaseEnded`]): every one that ended in the last
    /// [`baton_core::REPEAT_MEMORY_MS`] at least, read once at start with
    /// the state. The default: none (a store that keeps none; a table
    /// recovered from it answers a late attempt as its own memory allows).
    fn ended(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        Ok(Vec::new())
    }
    /// The latest holder changes ([`Write::Changed`]), the last `n_max`
    /// committed (fewer only if fewer were; a store keeps the last
    /// [`baton_core::HISTORY_LEN_MAX`]), in number order, and the last
    /// change's number, read once at start with the state. The default:
    /// none kept (a watcher then resumes only from the last change on).
    fn history(&self, n_max: usize) -> Result<History, StoreError> {
        let _ = n_max;
        Ok(History::default())
    }
    /// Keys committed to the store's log but not yet folded into its main
    /// file, for a gauge read after every commit: it must not wait for
    /// the fold. `None`, the default: the store folds nothing behind.
    fn fold_backlog(&self) -> Option<usize> {
        None
    }
}

/// The holder changes a store kept ([`LeaseStore::history`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The last change's number (0: none was ever numbered here).
    pub seq: u64,
    /// The latest changes, in number order, the last one's number at most
    /// `seq`.
    pub changes: Vec<baton_core::NumberedChange>,
}

/// The durable state as [`LeaseStore::load_with`] hands it over, its
/// leases still to be read.
pub struct Loading<'a> {
    /// Epoch of the last issued token.
    pub epoch: Epoch,
    /// Counter of the last issued token in `epoch`.
    pub counter: u64,
    /// Every open session.
    pub sessions: Vec<SessionRecord>,
    /// Every held lease, in name order, read as it is taken. Its
    /// `size_hint` has an upper bound: how many there are at most (a
    /// store's count, plus the writes of its log not yet counted). A read
    /// that fails yields its error, and the state must not be used.
    pub leases: &'a mut dyn Iterator<Item = Result<(ResourceName, LeaseRecord), StoreError>>,
}

impl Loading<'_> {
    /// Reads every lease, as [`LeaseStore::load`] gives them.
    pub fn read_all(self) -> Result<Stored, StoreError> {
        let n_max = self.leases.size_hint().1.unwrap_or(0);
        let mut leases = Vec::with_capacity(n_max);
        for lease in self.leases {
            leases.push(lease?);
        }
        Ok(Stored {
            epoch: self.epoch,
            counter: self.counter,
            leases,
            sessions: self.sessions,
        })
    }
}

/// A view of the store taken by [`LeaseStore::snapshot`]: reading it
/// gives the state as of the moment it was taken, whatever was committed
/// since.
pub type SnapshotRead = Box<dyn FnOnce() -> Result<Stored, StoreError> + Send>;

/// Where [`LeaseStore::start_commit`] reports a commit's outcome (called
/// once, on any thread).
pub type CommitDone = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// Why the store could not open, load or commit.
#[allow(missing_docs)] // variant fields are named for what they hold; the messages explain them
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process holds the store file open.
    #[error("the data directory {path} is in use by another process (is a server running?)")]
    InUse { path: String },
    /// The storage library failed; the outcome of a commit is unknown.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The file cannot be read as a lease store.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The store file is gone or empty in a directory that served before.
    #[error("the store file {path} is {state}, but its data directory {data_dir} has served before (tokens at or above epoch {floor_epoch}); starting would issue tokens again from epoch 1")]
    StoreLost {
        path: String,
        state: &'static str,
        data_dir: String,
        floor_epoch: u32,
    },
    /// The write-ahead log is gone from a store that has used one.
    #[error("the write-ahead log {path} is missing, but the store in {data_dir} has used one: the commits since its last fold would be lost and their tokens issued again; run `baton admin restore` to start over in a new epoch")]
    LogLost { path: String, data_dir: String },
    /// The store belongs to another directory's identity.
    #[error("the store in {data_dir} has id {found}, but the directory's identity file names store {expected}: it is another server's store")]
    IdentityMismatch {
        data_dir: String,
        expected: String,
        found: String,
    },
    /// The store is an older copy than the directory already reached.
    #[error("the store file {path} is at {found}, below the floor {floor} that this directory already reached: it is an older copy and would issue tokens again")]
    BehindFloor {
        path: String,
        found: String,
        floor: String,
    },
    /// The identity file cannot be parsed.
    #[error("the identity file {path} is unreadable: {why}")]
    IdentityUnreadable { path: String, why: String },
    /// Written by a newer build.
    #[error("stored format {found} is not supported; this build reads format {supported}")]
    UnsupportedFormat { found: u64, supported: u64 },
    /// Another server leads now: this leader's term is over and the commit
    /// was refused (nothing of it was written).
    #[error(
        "leadership term {term} is over, another server took over; nothing was written: {why}"
    )]
    Deposed { term: u64, why: String },
    /// An earlier commit failed; the handle is no longer trusted.
    #[error("an earlier storage failure makes this store unusable; restart the server")]
    PreviousIo,
    /// A file operation around the store failed.
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}
