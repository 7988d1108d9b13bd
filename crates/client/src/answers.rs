//! The server's answers as the client's values: leases with their
//! deadlines counted from the request's send time, refusals, renewals,
//! releases and status, each checked on the way in.

use std::time::Duration;

use baton_core::{AcquisitionId, FencingToken, Shape, PERMITS_MAX};
use baton_proto::v1;
use tokio::time::Instant;

use crate::{flags, ClientError};

/// A held lease. `acquisition_id` is the secret that renews and releases it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The canonical resource name the server returned.
    pub resource: String,
    /// The secret that renews and releases this lease; keep it.
    pub acquisition_id: AcquisitionId,
    /// The fencing token: carry it into every protected write.
    pub token: FencingToken,
    /// The granted TTL.
    pub ttl: Duration,
    /// The earliest instant the server may end this lease, on this
    /// process's monotonic clock: the acquire request's **send** time plus
    /// the time the server says it waited in line (never more than this
    /// process saw pass) plus the TTL, never the reply's arrival (the
    /// server started the TTL no earlier than it received the request).
    /// For a lease tied to a session, the later of the send time plus the
    /// TTL and the session's deadline when the grant arrived. A reply that
    /// took longer than the TTL arrives already past it: see
    /// [`Lease::is_expired`].
    pub valid_until: Instant,
    /// A shared holder's or a permit's slot (the lowest free one when it
    /// was granted; a permit's is below the semaphore's N): a slot's
    /// tokens only rise, so a permit's writes are fenced by slot. `None`
    /// for an exclusive lease.
    pub slot: Option<u32>,
}

impl Lease {
    /// How long this process may still count on the lease, from now
    /// (zero once [`Lease::valid_until`] has passed). Renewals or the
    /// session's heartbeats extend it only through a [`worker::Keeper`].
    pub fn valid_for(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// True once [`Lease::valid_until`] has passed: the server may already
    /// have given the resource to someone else. A grant that is expired on
    /// arrival must not be used; release it (best effort) and try again.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until
    }
}

/// `sent + ttl`, refusing a TTL that would overflow the clock (a server
/// that answers nonsense must not panic the client).
pub(crate) fn deadline(sent: Instant, ttl: Duration) -> Result<Instant, ClientError> {
    sent.checked_add(ttl).ok_or_else(|| {
        ClientError::Protocol(format!("ttl of {} ms is out of range", ttl.as_millis()))
    })
}

/// Why an acquire was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAcquired {
    /// True if the wait ran out; false if a try-once request found the resource busy.
    pub timed_out: bool,
    /// The first requested resource that blocked the request (for a wait
    /// that ran out, the first that still did; servers before 2026-12-05
    /// name none then).
    pub resource: Option<String>,
    /// The holder's token, if the resource was held.
    pub holder_token: Option<FencingToken>,
    /// Every requested resource that was held or had requests waiting
    /// ahead, in request order (empty from servers before 2026-12-05).
    pub blockers: Vec<Blocker>,
    /// True when the client sent the request again after losing an answer
    /// and the leader found that the request's leases had already ended
    /// (or could not tell them from ended: it took over since). Nothing is
    /// held under the request and nothing was granted again.
    pub ended: bool,
}

/// A requested resource that stood in the way of an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The resource.
    pub resource: String,
    /// False when the caller may not `read` it: its holders give their
    /// tokens only (and the counts are given).
    pub readable: bool,
    /// Its holders (an exclusive lock has at most one), at most 16.
    pub holders: Vec<BlockingHolder>,
    /// How many hold it.
    pub n_holders: u64,
    /// Requests waiting on it ahead of this one (for a try-once request,
    /// all of its waiters).
    pub n_waiters_ahead: u64,
}

/// A holder of a resource that blocked an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockingHolder {
    /// Its lease's token.
    pub token: FencingToken,
    /// Its description, if it gave one (and the caller may read it).
    pub holder: Option<String>,
    /// How long it has held the resource, in whole seconds: since its
    /// grant, or, when `held_since_recovery`, since the server restart or
    /// leader takeover that loaded it (it was granted before). `None` when
    /// not readable.
    pub held_for: Option<Duration>,
    /// See `held_for`.
    pub held_since_recovery: bool,
    /// Its TTL left; `None` when tied to a session or not readable.
    pub remaining: Option<Duration>,
    /// Its lease is tied to its holder's session.
    pub session_bound: bool,
}

fn blockers(all: Vec<v1::Blocker>) -> Result<Vec<Blocker>, ClientError> {
    all.into_iter()
        .map(|b| {
            let holders = b
                .holders
                .into_iter()
                .map(|h| {
                    Ok(BlockingHolder {
                        token: token(h.token)?,
                        holder: h.holder,
                        held_for: h.held_s.map(Duration::from_secs),
                        held_since_recovery: h.held_since_recovery,
                        remaining: h.remaining_ms.map(Duration::from_millis),
                        session_bound: h.session_bound,
                    })
                })
                .collect::<Result<_, ClientError>>()?;
            Ok(Blocker {
                resource: b.resource,
                readable: b.readable,
                holders,
                n_holders: b.n_holders,
                n_waiters_ahead: b.n_waiters_ahead,
            })
        })
        .collect()
}

/// The answer to a single-resource acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is yours.
    Granted(Lease),
    /// Refused (held, or the wait ran out).
    NotAcquired(NotAcquired),
}

/// The answer to a multi-resource acquire: all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquiredAll {
    /// One lease per requested resource, in request order.
    Granted {
        /// One lease per claimed resource.
        leases: Vec<Lease>,
        /// Whether the request waited in line first.
        after_wait: bool,
    },
    /// Refused: nothing was granted.
    NotAcquired(NotAcquired),
}

impl AcquiredAll {
    /// Whether every resource was granted.
    pub fn is_granted(&self) -> bool {
        matches!(self, AcquiredAll::Granted { .. })
    }
}

/// The answer to a renew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Extended by its TTL from when the server received the renewal.
    Renewed {
        /// The lease's token (unchanged by renewals).
        token: FencingToken,
        /// Time left when the server answered.
        remaining: Duration,
        /// The earliest instant the server may end the lease, on this
        /// process's monotonic clock: the renewal's send time plus
        /// `remaining` (see [`Lease::valid_until`]).
        valid_until: Instant,
    },
    /// The lease expired, was released, fenced or replaced. You no longer own it.
    NotOwner,
}

/// The answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Given back.
    Released {
        /// The released lease's token.
        token: FencingToken,
    },
    /// Already released, expired, fenced or never this id's. Nothing changed.
    NotHeld,
}

/// A resource as the server reports it (never the acquisition id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The canonical name.
    pub resource: String,
    /// The holder's token, if held.
    pub holder_token: Option<FencingToken>,
    /// Time left on the lease.
    pub remaining: Duration,
    /// The lease's TTL.
    pub ttl: Duration,
    /// Requests waiting in line.
    pub n_waiters: u64,
    /// The holder's description, if it gave one.
    pub holder: Option<String>,
    /// The last token the server issued, to any resource, when it
    /// answered: every later grant gets a higher one (`None` from a server
    /// too old to say).
    pub issued_through: Option<FencingToken>,
    /// A semaphore's number of permits while it has holders or waiters
    /// (`None`: a lock, or free).
    pub permits: Option<u32>,
    /// Its shared holders or permits, by slot (`holder_token` and the
    /// fields after it describe an exclusive holder only).
    pub slots: Vec<SlotHolder>,
}

/// A shared holder or a permit, as status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHolder {
    /// Its slot.
    pub slot: u32,
    /// Its token.
    pub token: FencingToken,
    /// Time left on its lease.
    pub remaining: Duration,
    /// Its TTL.
    pub ttl: Duration,
    /// Its description, if it gave one.
    pub holder: Option<String>,
}

/// What an operator fence did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// A token above every token issued before it; write it into the resource to cancel durably.
    pub token: FencingToken,
    /// The token of the lease it revoked, if one was held.
    pub revoked: Option<FencingToken>,
}

/// A TTL as the wire's optional milliseconds: zero is absent (the server's
/// default), anything else as [`millis`].
/// A session's TTL as the wire's milliseconds, zero asking the server's
/// default.
pub(crate) fn optional_millis(d: Duration, what: &str) -> Result<Option<u64>, ClientError> {
    (!d.is_zero()).then(|| millis(d, what)).transpose()
}

/// Each claim's shape on the wire: none when every one is exclusive (the
/// request older servers know), else one per resource. A semaphore of no
/// permits, or of more than [`PERMITS_MAX`], is refused before anything
/// is sent.
pub(crate) fn wire_shapes(
    shapes: impl Iterator<Item = Shape> + Clone,
) -> Result<Vec<v1::LockShape>, ClientError> {
    if shapes.clone().all(|s| s == Shape::Exclusive) {
        return Ok(Vec::new());
    }
    shapes
        .map(|s| match s {
            Shape::Exclusive => Ok(v1::LockShape::default()),
            Shape::Shared => Ok(v1::LockShape {
                shared: true,
                permits: 0,
            }),
            Shape::Permits(n) if n == 0 || n > PERMITS_MAX => Err(ClientError::Invalid(format!(
                "permits {n}: a semaphore has from 1 to {PERMITS_MAX} permits"
            ))),
            Shape::Permits(n) => Ok(v1::LockShape {
                shared: false,
                permits: n,
            }),
        })
        .collect()
}

/// A lease's TTL as the wire's milliseconds: `None` asks the server's
/// default; a TTL of zero is refused (there is no such lease).
pub(crate) fn ttl_millis(ttl: Option<Duration>) -> Result<Option<u64>, ClientError> {
    match ttl {
        Some(d) if d.is_zero() => Err(ClientError::Invalid(
            "ttl is 0 ms: a lease's TTL is above 0 (None asks the server's default)".into(),
        )),
        Some(d) => millis(d, "ttl").map(Some),
        None => Ok(None),
    }
}

/// A duration as the wire's milliseconds: whole, and refused rather than
/// wrapped when it does not fit (a TTL of 2^61 s must not become 30 s).
pub(crate) fn millis(d: Duration, what: &str) -> Result<u64, ClientError> {
    if d > flags::DURATION_MAX {
        return Err(ClientError::Invalid(format!(
            "{what} of {} ms is longer than the longest accepted, {} ms",
            d.as_millis(),
            flags::DURATION_MAX.as_millis()
        )));
    }
    Ok(d.as_millis() as u64)
}

pub(crate) fn token(value: u64) -> Result<FencingToken, ClientError> {
    FencingToken::from_u64(value).map_err(|e| ClientError::Protocol(e.to_string()))
}

pub(crate) fn optional_token(value: u64) -> Result<Option<FencingToken>, ClientError> {
    if value == 0 {
        Ok(None)
    } else {
        token(value).map(Some)
    }
}

/// A granted lease from the acquire request sent at `sent`: valid from the
/// send time plus how long it waited in line on the server (a lease tied
/// to a session: the acquire refreshed the session on arrival, so from the
/// send time; the session's heartbeats extend it, see `Session`).
pub(crate) fn lease(l: v1::Lease, sent: Instant) -> Result<Lease, ClientError> {
    let ttl = Duration::from_millis(l.ttl_ms);
    // Never more than this process saw pass since the send.
    let waited = if l.session_bound {
        Duration::ZERO
    } else {
        Duration::from_millis(l.waited_ms).min(sent.elapsed())
    };
    Ok(Lease {
        acquisition_id: AcquisitionId::from_slice(&l.acquisition_id)
            .ok_or_else(|| ClientError::Protocol("acquisition id is not 16 bytes".into()))?,
        token: token(l.token)?,
        ttl,
        valid_until: deadline(sent, waited.saturating_add(ttl))?,
        resource: l.resource,
        slot: l.slot,
    })
}

/// An acquire's answer for `n_resources` resources, to the request sent at `sent`.
pub(crate) fn acquired_all(
    response: v1::AcquireResponse,
    n_resources: usize,
    sent: Instant,
) -> Result<AcquiredAll, ClientError> {
    use v1::not_acquired::Reason;
    match response.outcome {
        Some(v1::acquire_response::Outcome::Granted(g)) => {
            if g.leases.len() != n_resources {
                return Err(ClientError::Protocol(format!(
                    "{} leases for {n_resources} resources",
                    g.leases.len(),
                )));
            }
            let leases = g
                .leases
                .into_iter()
                .map(|l| lease(l, sent))
                .collect::<Result<_, _>>()?;
            Ok(AcquiredAll::Granted {
                leases,
                after_wait: g.after_wait,
            })
        }
        Some(v1::acquire_response::Outcome::NotAcquired(n))
            if n.reason() == Reason::SessionEnded =>
        {
            Err(ClientError::SessionEnded)
        }
        Some(v1::acquire_response::Outcome::NotAcquired(n)) => {
            Ok(AcquiredAll::NotAcquired(NotAcquired {
                timed_out: n.reason() == Reason::TimedOut,
                ended: n.reason() == Reason::Ended,
                resource: (!n.resource.is_empty()).then_some(n.resource),
                holder_token: optional_token(n.holder_token)?,
                blockers: blockers(n.blockers)?,
            }))
        }
        None => Err(ClientError::Protocol(
            "acquire response without an outcome".into(),
        )),
    }
}

/// A renewal's answer to the request sent at `sent`.
pub(crate) fn renewal(r: v1::RenewResponse, sent: Instant) -> Result<Renewal, ClientError> {
    Ok(if r.renewed {
        let remaining = Duration::from_millis(r.remaining_ms);
        Renewal::Renewed {
            token: token(r.token)?,
            remaining,
            valid_until: deadline(sent, remaining)?,
        }
    } else {
        Renewal::NotOwner
    })
}

pub(crate) fn release(r: v1::ReleaseResponse) -> Result<Release, ClientError> {
    Ok(if r.released {
        Release::Released {
            token: token(r.token)?,
        }
    } else {
        Release::NotHeld
    })
}

impl Acquired {
    /// The single lease of a one-resource answer.
    pub(crate) fn from_all(all: AcquiredAll) -> Result<Self, ClientError> {
        Ok(match all {
            AcquiredAll::Granted { mut leases, .. } => {
                let one = leases
                    .pop()
                    .ok_or_else(|| ClientError::Protocol("granted without a lease".into()))?;
                Acquired::Granted(one)
            }
            AcquiredAll::NotAcquired(n) => Acquired::NotAcquired(n),
        })
    }
}

pub(crate) fn status(s: v1::StatusResponse) -> Result<Status, ClientError> {
    Ok(Status {
        holder_token: if s.held {
            Some(token(s.holder_token)?)
        } else {
            None
        },
        remaining: Duration::from_millis(s.remaining_ms),
        ttl: Duration::from_millis(s.ttl_ms),
        n_waiters: s.n_waiters,
        resource: s.resource,
        holder: (!s.holder.is_empty()).then_some(s.holder),
        issued_through: match s.issued_through {
            0 => None,
            t => Some(token(t)?),
        },
        permits: (s.permits > 0).then_some(s.permits),
        slots: s
            .slots
            .into_iter()
            .map(|x| {
                Ok(SlotHolder {
                    slot: x.slot,
                    token: token(x.token)?,
                    remaining: Duration::from_millis(x.remaining_ms),
                    ttl: Duration::from_millis(x.ttl_ms),
                    holder: (!x.holder.is_empty()).then_some(x.holder),
                })
            })
            .collect::<Result<_, ClientError>>()?,
    })
}
