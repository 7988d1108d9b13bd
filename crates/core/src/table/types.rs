//! What goes in and out of the lease table: requests, outcomes, durable
//! records, writes, events and effects.

use super::refusal::{Blocker, NotAcquired};
use super::shape::{Claim, Kind, Shape};
use super::term::LeaseTerm;
use crate::{
    AcquisitionDigest, AcquisitionId, Attempt, Epoch, FencingToken, Holder, ResourceName,
    SessionDigest, WaiterId,
};

/// Milliseconds on the server's monotonic clock, from an origin the shell picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonoMs(pub u64);

impl MonoMs {
    /// Never reached: the expiry of a lease that its session governs.
    pub(crate) const NEVER: MonoMs = MonoMs(u64::MAX);

    pub(crate) fn plus(self, ms: u64) -> MonoMs {
        MonoMs(self.0.saturating_add(ms))
    }

    /// When a lease or session granted or refreshed at `self` for `ttl_ms`
    /// ends: one tick past `self + ttl_ms`. The shell's clock truncates to
    /// whole milliseconds, so a grant at 10.9 ms reads 10; ending at 10 +
    /// ttl would cut up to a millisecond off the TTL, ending at 11 + ttl
    /// never does.
    pub(crate) fn end_of(self, ttl_ms: u64) -> MonoMs {
        MonoMs(self.0.saturating_add(ttl_ms).saturating_add(1))
    }

    /// Milliseconds of `ttl` left at `now` of something that ends at `self`.
    pub(crate) fn left_at(self, now: MonoMs) -> u64 {
        self.0.saturating_sub(now.0).saturating_sub(1)
    }
}

/// One acquire request: one or more resources, all or nothing.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// Each resource with the acquisition id its lease will carry and
    /// how it is held.
    pub claims: Vec<Claim>,
    /// How long every granted lease lives: its own TTL, or its session's life.
    pub term: LeaseTerm,
    /// 0 means try once. Otherwise the request queues, FIFO, for at most this long.
    pub wait_ms: u64,
    /// Identifies the request if it has to wait; the shell picks a unique one.
    pub waiter: WaiterId,
    /// Who asks, as the holder describes itself; stored with every lease
    /// granted (see [`Holder`]).
    pub holder: Option<Holder>,
    /// Set when the request carries a client's request id (its claims'
    /// ids are then [`crate::RequestId::acquisition_id`]s): the table
    /// answers a repeat with what it granted, never with a second grant.
    /// `None`: an older client's request, served as a new one every time.
    pub attempt: Option<Attempt>,
}

impl AcquireRequest {
    /// A request for one resource, exclusive, try-once.
    pub fn single(resource: ResourceName, acquisition_id: AcquisitionId, ttl_ms: u64) -> Self {
        Self {
            claims: vec![Claim::exclusive(resource, acquisition_id)],
            term: LeaseTerm::Own { ttl_ms },
            wait_ms: 0,
            waiter: WaiterId(0),
            holder: None,
            attempt: None,
        }
    }
}

/// One granted lease, as the holder hears it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The canonical resource name.
    pub resource: ResourceName,
    /// The holder's secret.
    pub acquisition_id: AcquisitionId,
    /// Above every token issued before.
    pub token: FencingToken,
    /// The slot of a shared holder or a permit (the lowest free one when
    /// granted; a permit's is below the semaphore's N); `None` for an
    /// exclusive lease.
    pub slot: Option<u32>,
    /// The granted duration.
    pub ttl_ms: u64,
    /// How long the request waited in line before this grant, on the
    /// table's clock (0 when granted at once): a client that counts the
    /// lease from its send time adds this.
    pub waited_ms: u64,
}

/// What an acquire did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named for what they hold: the resource, its token, the waiter
pub enum AcquireOutcome {
    /// Every requested lease is held now, one grant per resource, in request order.
    Granted(Vec<Grant>),
    /// The request waits; its result arrives later as [`WaitResult`] in [`Effects::woken`].
    Queued { waiter: WaiterId },
    /// Refused without waiting: the first held resource, or waiters ahead.
    NotAcquired(NotAcquired),
    /// A repeat of a request already granted: the same leases, tokens and
    /// acquisition ids, each grant's `ttl_ms` the time it has left.
    Repeated(Vec<Grant>),
    /// A repeat of a request whose leases have ended (or that this table
    /// cannot tell from one: see `repeats.rs`). Nothing is held under the
    /// request id, and nothing was granted.
    Ended,
}

/// How a waiting acquire ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitResult {
    /// Every claimed resource, granted together.
    Granted(Vec<Grant>),
    /// The wait ran out; nothing was granted. What still stood in the way
    /// when it did.
    TimedOut(Vec<Blocker>),
    /// The waiter's session expired or was closed; nothing was granted.
    SessionEnded,
    /// Its turn came, but granting it then would exceed a leases quota
    /// (lowered while it waited, or a multi-acquire some of whose names
    /// were free when it queued); nothing was granted.
    OverQuota(crate::quota::OverQuota),
}

/// A request the table refuses to judge: it broke a rule (or a limit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum AcquireError {
    #[error(
        "ttl {ttl_ms}ms is out of range: it must be between {ttl_ms_min}ms and {ttl_ms_max}ms"
    )]
    TtlOutOfRange {
        ttl_ms: u64,
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    #[error("wait {wait_ms}ms is above the maximum {wait_ms_max}ms")]
    WaitTooLong { wait_ms: u64, wait_ms_max: u64 },
    #[error("an acquire request must name at least one resource")]
    NoResources,
    #[error("an acquire request names {n_resources} resources; the limit is {n_resources_max}")]
    TooManyResources {
        n_resources: usize,
        n_resources_max: usize,
    },
    #[error("resource {resource} appears more than once in one acquire request")]
    DuplicateResource { resource: ResourceName },
    #[error("resource {resource} already has {n_waiters} waiters, the limit per resource")]
    TooManyWaitersOnResource {
        resource: ResourceName,
        n_waiters: usize,
    },
    #[error("the server already has {n_waiters} waiting requests, its limit")]
    TooManyWaiters { n_waiters: usize },
    #[error("waiter id {0:?} is already in use")]
    DuplicateWaiter(WaiterId),
    #[error("the session is not open (it expired or was closed); nothing was acquired")]
    SessionNotOpen,
    /// Refused by a quota (`crate::quota`): nothing was granted or queued.
    #[error("{0}")]
    OverQuota(crate::quota::OverQuota),
    #[error(
        "resource {resource}: a semaphore has from 1 to {n_permits_max} permits, not {n_permits}"
    )]
    PermitsOutOfRange {
        resource: ResourceName,
        n_permits: u32,
        n_permits_max: u32,
    },
    #[error("resource {resource} is a semaphore of {n_permits_now} permits while it has holders or waiters; this request asks for {n_permits}")]
    PermitsDiffer {
        resource: ResourceName,
        n_permits: u32,
        n_permits_now: u32,
    },
    #[error("resource {resource} is {now} while it has holders or waiters; this request asks for {asked}")]
    KindDiffers {
        resource: ResourceName,
        asked: String,
        now: Kind,
    },
}

/// A session request the table refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum SessionError {
    #[error(
        "session ttl {ttl_ms}ms is out of range: it must be between {ttl_ms_min}ms and {ttl_ms_max}ms"
    )]
    TtlOutOfRange {
        ttl_ms: u64,
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    #[error("the server already has {n_sessions} open sessions, its limit")]
    TooManySessions { n_sessions: usize },
    #[error("a session with this id is already open")]
    AlreadyOpen,
    /// Refused by the opener's sessions quota: nothing was opened.
    #[error("{0}")]
    OverQuota(crate::quota::OverQuota),
}

/// What a renew did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named for what they hold: the resource, its token, the waiter
pub enum RenewOutcome {
    /// Extended by its TTL from `now`; `ttl_ms` is the remaining time.
    Renewed { token: FencingToken, ttl_ms: u64 },
    /// Expired, released, fenced or replaced: nothing was extended or created.
    NotOwner,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named for what they hold: the resource, its token, the waiter
pub enum ReleaseOutcome {
    Released {
        token: FencingToken,
    },
    /// Already released, expired, fenced, or never this id's: nothing changed.
    NotHeld,
}

/// What an operator fence did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceOutcome {
    /// Issued to the fence itself: above every earlier grant, below every later one.
    pub token: FencingToken,
    /// The token of the lease the fence revoked, if one was held (of a
    /// shared lock's or a semaphore's holders, the highest: it revokes
    /// them all).
    pub revoked: Option<FencingToken>,
}

/// One holder of a shared lock or a semaphore, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotStatus {
    /// Its slot.
    pub slot: u32,
    /// Its token.
    pub token: FencingToken,
    /// Time left on its lease.
    pub remaining_ms: u64,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Its description, if it gave one.
    pub holder: Option<Holder>,
}

/// A resource as `status` and `list` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The canonical name.
    pub resource: ResourceName,
    /// The exclusive holder's token, if held so.
    pub holder_token: Option<FencingToken>,
    /// Time left on the lease (0 if free).
    pub remaining_ms: u64,
    /// The lease's TTL (0 if free).
    pub ttl_ms: u64,
    /// Requests waiting in line.
    pub n_waiters: usize,
    /// The holder's description, if it gave one.
    pub holder: Option<Holder>,
    /// The last token this server issued, to any resource, when it
    /// answered: every later grant (and fence) gets a higher one. A
    /// resource that stored a token above it saw tokens from a state this
    /// server does not know (a restore without the floor).
    pub issued_through: FencingToken,
    /// What the resource is while it has holders or waiters.
    pub kind: Option<Kind>,
    /// Its shared holders or permits, by slot (none for an exclusive lock).
    pub slots: Vec<SlotStatus>,
}

/// The durable form of a lease. Expiry is not stored: after a restart every
/// stored lease gets its full TTL again from the restart. The acquisition id
/// itself is never stored, only its digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// SHA-256 of the acquisition id, first 16 bytes.
    pub acquisition_digest: AcquisitionDigest,
    /// The lease's token.
    pub token: FencingToken,
    /// The lease's TTL; recovery gives it in full again. For a lease tied
    /// to a session, the session's TTL.
    pub ttl_ms: u64,
    /// The session the lease is tied to, if any.
    pub session: Option<SessionDigest>,
    /// The holder's description, if it gave one.
    pub holder: Option<Holder>,
    /// How it holds its resource: exclusive (stored under the resource's
    /// name), or shared or a permit (stored under a holder's name,
    /// [`ResourceName::slot`]).
    pub shape: Shape,
}

/// What a heartbeat did to an open session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptAlive {
    /// The session's TTL, counted again from the heartbeat.
    pub ttl_ms: u64,
    /// Leases of the session fenced since its previous heartbeat (their
    /// holders no longer own them), with the revoked tokens.
    pub revoked: Vec<(ResourceName, FencingToken)>,
}

/// The durable form of a session. Like a lease's, its expiry is not stored:
/// after a restart it gets its full TTL again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    /// SHA-256 of the session id, first 16 bytes.
    pub digest: SessionDigest,
    /// The session's TTL.
    pub ttl_ms: u64,
    /// The principal that opened the session (`None` when it was opened
    /// without authentication, or written before openers were stored):
    /// only it, or an administrator, may resume it.
    pub opener: Option<String>,
}

/// A change to durable state, applied by the shell in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named for what they hold: the resource, its token, the waiter
pub enum Write {
    PutLease {
        resource: ResourceName,
        record: LeaseRecord,
    },
    DeleteLease {
        resource: ResourceName,
    },
    PutSession {
        record: SessionRecord,
    },
    DeleteSession {
        digest: SessionDigest,
    },
    /// The last issued token position.
    Tokens {
        epoch: Epoch,
        counter: u64,
    },
    /// The lease granted under this acquisition digest ended (beside its
    /// `DeleteLease`, in the same commit). A store keeps it for at least
    /// [`crate::REPEAT_MEMORY_MS`] by its own clock and gives it back at
    /// load, so that a table recovered after a restart or a takeover
    /// still answers a late repeat of the request "ended" (`repeats.rs`).
    LeaseEnded {
        digest: AcquisitionDigest,
    },
    /// A holder change, numbered in commit order (beside the writes that
    /// made it, in the same commit): a store keeps the latest of them (at
    /// least as many as it was told to keep) and gives them back at load,
    /// so that a watcher resumes across a restart or a takeover. Written by
    /// the pipeline, not the table.
    Changed(super::NumberedChange),
}

/// What happened, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named for what they hold: the resource, its token, the waiter
pub enum Event {
    Granted {
        resource: ResourceName,
        token: FencingToken,
        acquisition_id: AcquisitionId,
        after_wait: bool,
        holder: Option<Holder>,
    },
    Renewed {
        resource: ResourceName,
        token: FencingToken,
    },
    RenewRefused {
        resource: ResourceName,
    },
    Released {
        resource: ResourceName,
        token: FencingToken,
        holder: Option<Holder>,
    },
    Expired {
        resource: ResourceName,
        token: FencingToken,
        holder: Option<Holder>,
    },
    /// `holder` is the revoked lease's.
    Fenced {
        resource: ResourceName,
        token: FencingToken,
        revoked: Option<FencingToken>,
        holder: Option<Holder>,
    },
    WaitTimedOut {
        waiter: WaiterId,
    },
    SessionOpened {
        digest: SessionDigest,
    },
    SessionEnded {
        digest: SessionDigest,
        /// True if it ran out; false if its client closed it.
        expired: bool,
        n_leases: usize,
    },
    /// A step reached more expired leases than it drops: `n_leases` of
    /// them, gone already, are left to later steps (`expiry.rs`).
    ExpiriesDeferred {
        n_leases: usize,
    },
}

/// Everything the shell must do after a batch of operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Changes to persist, in order.
    pub writes: Vec<Write>,
    /// True when a token was issued: the writes must be durable before any
    /// reply of this batch (or wake-up below) is released.
    pub sync: bool,
    /// Waiting requests that finished, to be answered.
    pub woken: Vec<(WaiterId, WaitResult)>,
    /// What happened, for metrics and logs.
    pub events: Vec<Event>,
}
