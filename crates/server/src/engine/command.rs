//! What a caller hands the engine ([`Command`]) and what it is answered.

use baton_core::{
    AcquireError, AcquireRequest, AcquisitionId, Blocker, FenceOutcome, Grant, LeaseStatus,
    NotAcquired, ReleaseOutcome, RenewOutcome, ResourceName, Resumed, SessionDigest, SessionError,
    SetPermitsError, WaiterId,
};
use baton_store::{SnapshotRead, StoreError, Stored};
use tokio::sync::oneshot;

use super::watch::WatchStart;

#[derive(Debug)]
pub enum AcquireReply {
    Granted {
        grants: Vec<Grant>,
        after_wait: bool,
    },
    NotAcquired(NotAcquired),
    /// A repeat of a granted request: its leases, with the time they have left.
    Repeated(Vec<Grant>),
    /// A repeat of a request whose leases ended: nothing held, nothing granted.
    Ended,
    /// The wait ran out; what still stood in the way.
    TimedOut(Vec<Blocker>),
    /// The request's session ended while it waited.
    SessionEnded,
}

pub type Reply<T> = oneshot::Sender<T>;

/// An acquire's answer: the engine's outcome, or the rule it broke.
pub type AcquireAnswer = Result<AcquireReply, AcquireError>;

/// The answer to [`Command::Snapshot`]: the store's view, or `None` for a
/// store without one.
pub type SnapshotReply = Reply<Option<Result<SnapshotRead, StoreError>>>;

/// Who may keep a session alive or close it: the principal that opened
/// it (or an administrator), holding `lease` on what it holds.
pub use baton_core::SessionCheck;

pub enum Command {
    Acquire {
        request: AcquireRequest,
        reply: Reply<AcquireAnswer>,
    },
    Renew {
        resource: ResourceName,
        id: AcquisitionId,
        reply: Reply<RenewOutcome>,
    },
    Release {
        resource: ResourceName,
        id: AcquisitionId,
        reply: Reply<ReleaseOutcome>,
    },
    Status {
        resource: ResourceName,
        reply: Reply<LeaseStatus>,
    },
    List {
        prefix: String,
        start_after: Option<String>,
        limit: usize,
        reply: Reply<Vec<LeaseStatus>>,
    },
    Fence {
        resource: ResourceName,
        reply: Reply<FenceOutcome>,
    },
    SetPermits {
        resource: ResourceName,
        n_permits: u32,
        reply: Reply<Result<u32, SetPermitsError>>,
    },
    /// A view of the store for a backup, taken after every write so far
    /// (the lazy ones too) is durable; `None` if the store has none (then
    /// [`Command::CopyTable`]).
    Snapshot {
        reply: SnapshotReply,
    },
    /// A copy of the table for a backup, made under the table's lock: for
    /// stores without [`LeaseStore::snapshot`].
    CopyTable {
        reply: Reply<Stored>,
    },
    /// A watcher of `prefix`: the holders now, then every later change
    /// (see `watch.rs`).
    /// Resuming after a change's number when `after` is set.
    Watch {
        prefix: String,
        after: Option<u64>,
        reply: Reply<Result<WatchStart, super::watch::Refused>>,
    },
    CancelWait {
        waiter: WaiterId,
    },
    /// Answered after the session is durable.
    OpenSession {
        digest: SessionDigest,
        ttl_ms: u64,
        /// The principal that opens it (`None` with authentication off).
        opener: Option<String>,
        reply: Reply<Result<(), SessionError>>,
    },
    /// A heartbeat: the session's TTL and revoked leases. With `check` (a
    /// resume, or a heartbeat under a reloaded auth table), only if it
    /// accepts every resource of the session, decided in the same step;
    /// never `Refused` without one.
    KeepAlive {
        digest: SessionDigest,
        check: Option<SessionCheck>,
        reply: Reply<Resumed>,
    },
    /// Whether the session was open (it is closed now either way), or
    /// `None` if `may_hold` refuses a resource of the session (nothing
    /// changed).
    CloseSession {
        digest: SessionDigest,
        check: SessionCheck,
        reply: Reply<Option<bool>>,
    },
    /// Flush and stop, even if handles remain (connections that outlived the grace period).
    Shutdown,
}
