//! Durable lease state behind a narrow trait.
//!
//! The server persists three things: the position of the last issued token
//! (epoch and counter), the held leases, and a format number. The trait is
//! small on purpose so that another backend (PostgreSQL, etcd) can implement
//! it and crash tests can wrap it.

mod identity;
mod quiet;
mod redb_store;

pub use identity::{Identity, StoreId};
pub use redb_store::RedbStore;

use baton_core::{Epoch, LeaseRecord, ResourceName, Write};

/// Everything a restart needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub epoch: Epoch,
    /// Counter of the last issued token in `epoch`.
    pub counter: u64,
    pub leases: Vec<(ResourceName, LeaseRecord)>,
}

pub trait LeaseStore: Send {
    /// Reads the durable state.
    fn load(&self) -> Result<Stored, StoreError>;
    /// Applies `writes` in order in one transaction and makes them durable
    /// before returning. After an error the store must not be used again.
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError>;
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("the data directory {path} is in use by another process (is a server running?)")]
    InUse { path: String },
    #[error("storage failure: {0}")]
    Storage(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store file {path} is {state}, but its data directory {data_dir} has served before (tokens at or above epoch {floor_epoch}); starting would issue tokens again from epoch 1")]
    StoreLost {
        path: String,
        state: &'static str,
        data_dir: String,
        floor_epoch: u32,
    },
    #[error("the store in {data_dir} has id {found}, but the directory's identity file names store {expected}: it is another server's store")]
    IdentityMismatch {
        data_dir: String,
        expected: String,
        found: String,
    },
    #[error("the store file {path} is at {found}, below the floor {floor} that this directory already reached: it is an older copy and would issue tokens again")]
    BehindFloor {
        path: String,
        found: String,
        floor: String,
    },
    #[error("the identity file {path} is unreadable: {why}")]
    IdentityUnreadable { path: String, why: String },
    #[error("stored format {found} is not supported; this build reads format {supported}")]
    UnsupportedFormat { found: u64, supported: u64 },
    #[error("an earlier storage failure makes this store unusable; restart the server")]
    PreviousIo,
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}
