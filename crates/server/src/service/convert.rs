//! Between the wire and the engine: requests' fields parsed with the rule
//! that refused them named, and the engine's answers as messages.

use std::sync::Arc;

use baton_core::{
    AcquireError, AcquisitionId, Attempt, Blocker, Claim, Grant, Holder, Kind, LeaseStatus,
    RequestId, ResourceName, Shape,
};
use baton_proto::v1;
use baton_proto::SNAPSHOT_FORMAT;
use baton_store::Stored;
use tonic::Status;

use crate::access::auth::{Permission, Principal};
use crate::access::Admitted;
use crate::engine::AcquireReply;

/// Parses the name of a resource that may already be held, naming the
/// field and the rule on failure: names stored before invisible characters
/// were refused still reach their leases (status, renew, release, fence).
pub fn parse_resource(field: impl std::fmt::Display, raw: &str) -> Result<ResourceName, Status> {
    ResourceName::parse_existing(raw).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

/// Parses the name of a resource to be granted: every rule of a new name.
fn parse_new_resource(field: impl std::fmt::Display, raw: &str) -> Result<ResourceName, Status> {
    ResourceName::parse(raw).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

/// An optional holder description: absent or empty is none; otherwise it
/// must follow [`Holder::parse`]'s rules, named in the error.
pub fn parse_holder(
    field: impl std::fmt::Display,
    raw: Option<&str>,
) -> Result<Option<Holder>, Status> {
    match raw {
        None | Some("") => Ok(None),
        Some(text) => Holder::parse(text)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("{field}: {e}"))),
    }
}

/// Names element `i` of the `resources` field in error messages.
pub(super) struct ResourcesField(pub(super) usize);

impl std::fmt::Display for ResourcesField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "resources[{}]", self.0)
    }
}

pub(super) fn parse_acquisition_id(bytes: &[u8]) -> Result<AcquisitionId, Status> {
    AcquisitionId::from_slice(bytes).ok_or_else(|| {
        Status::invalid_argument(format!(
            "acquisition_id is {} bytes; it must be exactly {} bytes",
            bytes.len(),
            AcquisitionId::LEN_BYTES
        ))
    })
}

/// A fresh acquisition or session id: 16 bytes of the thread's ChaCha12
/// generator, seeded from the operating system and reseeded after every
/// 64 KiB (`rand::rng`). One `getrandom` call per id was a system call on
/// every acquire.
pub(super) fn random_id() -> AcquisitionId {
    use rand::Rng;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    AcquisitionId::from_bytes(bytes)
}

/// Each resource of an acquire with the acquisition id its lease will
/// carry and how it is held.
pub(super) type Claims = Vec<Claim>;

/// Names element `i` of the `shapes` field in error messages.
struct ShapesField(usize);

impl std::fmt::Display for ShapesField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shapes[{}]", self.0)
    }
}

/// How each resource is held: `shapes` has one per resource, or none
/// (every resource exclusive); shared with permits is refused, as is a
/// count out of range (by the table, naming the resource).
fn parse_shapes(n_resources: usize, shapes: &[v1::LockShape]) -> Result<Vec<Shape>, Status> {
    if shapes.is_empty() {
        return Ok(vec![Shape::Exclusive; n_resources]);
    }
    if shapes.len() != n_resources {
        return Err(Status::invalid_argument(format!(
            "shapes has {} entries for {n_resources} resources; give one per resource, or none \
             (every resource exclusive)",
            shapes.len()
        )));
    }
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| match (s.shared, s.permits) {
            (false, 0) => Ok(Shape::Exclusive),
            (true, 0) => Ok(Shape::Shared),
            (false, n) => Ok(Shape::Permits(n)),
            (true, n) => Err(Status::invalid_argument(format!(
                "{}: shared and {n} permits; a resource is held shared (a lock) or as a permit \
                 (a semaphore), not both",
                ShapesField(i)
            ))),
        })
        .collect()
}

/// An acquire's claims, each resource with the acquisition id its lease
/// will carry, and which attempt of its request it is: ids drawn at random
/// for a request without a request id, derived from it otherwise (so a
/// repeat finds what the first attempt was granted).
pub(super) fn parse_claims(
    resources: &[String],
    shapes: &[v1::LockShape],
    request_id: &[u8],
    first_sent_ms_ago: Option<u64>,
) -> Result<(Claims, Option<Attempt>), Status> {
    let request = match request_id.len() {
        0 => None,
        _ => Some(RequestId::from_slice(request_id).ok_or_else(|| {
            Status::invalid_argument(format!(
                "request_id is {} bytes; it must be exactly {} bytes, or empty",
                request_id.len(),
                RequestId::LEN_BYTES
            ))
        })?),
    };
    let attempt = match (request, first_sent_ms_ago) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(Status::invalid_argument(
                "first_sent_ms_ago is set without a request_id: only a repeat of a request \
                 carrying an id says when its first attempt was sent",
            ))
        }
        (Some(_), None) => Some(Attempt::First),
        (Some(_), Some(first_sent_ms_ago)) => Some(Attempt::Repeat { first_sent_ms_ago }),
    };
    let shapes = parse_shapes(resources.len(), shapes)?;
    let mut claims = Vec::with_capacity(resources.len());
    for (i, (raw, shape)) in resources.iter().zip(shapes).enumerate() {
        let resource = parse_new_resource(ResourcesField(i), raw)?;
        let acquisition_id = request.map_or_else(random_id, |r| r.acquisition_id(&resource));
        claims.push(Claim {
            resource,
            acquisition_id,
            shape,
        });
    }
    Ok((claims, attempt))
}

pub(super) fn acquire_error(e: AcquireError) -> Status {
    match e {
        AcquireError::TooManyWaiters { .. }
        | AcquireError::TooManyWaitersOnResource { .. }
        | AcquireError::OverQuota(_) => Status::resource_exhausted(e.to_string()),
        other => Status::invalid_argument(other.to_string()),
    }
}

/// Which names a caller may read: the blockers of its refused acquires it
/// is told about in full. Everything with auth off.
#[derive(Clone)]
pub(super) struct Readable(Option<Arc<Principal>>);

impl Readable {
    pub(super) fn of(who: &Admitted<'_>) -> Self {
        Self(who.principal().cloned())
    }

    fn may(&self, name: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|p| p.allows(Permission::Read, name))
    }
}

/// Every blocker on the wire; what `readable` may not read gives its
/// holders' tokens and the counts only.
fn blockers(blockers: Vec<Blocker>, readable: &Readable) -> Vec<v1::Blocker> {
    blockers
        .into_iter()
        .map(|b| {
            let may = readable.may(b.resource.as_str());
            let holders: Vec<v1::BlockingHolder> = b
                .holders
                .into_iter()
                .map(|h| v1::BlockingHolder {
                    token: h.token.get(),
                    holder: h.holder.filter(|_| may).map(|d| d.to_string()),
                    held_s: may.then_some(h.held_for.held_s),
                    held_since_recovery: may && h.held_for.recovered,
                    remaining_ms: h.remaining_ms.filter(|_| may),
                    session_bound: may && h.remaining_ms.is_none(),
                })
                .collect();
            v1::Blocker {
                resource: b.resource.to_string(),
                readable: may,
                n_holders: b.n_holders,
                holders,
                n_waiters_ahead: b.n_waiters_ahead,
            }
        })
        .collect()
}

/// A refusal on the wire: the first blocker's name and token, and every
/// blocker.
fn refused(
    reason: v1::not_acquired::Reason,
    all: Vec<Blocker>,
    readable: &Readable,
) -> v1::acquire_response::Outcome {
    let first = all.first();
    v1::acquire_response::Outcome::NotAcquired(v1::NotAcquired {
        reason: reason.into(),
        resource: first.map(|b| b.resource.to_string()).unwrap_or_default(),
        holder_token: first
            .and_then(|b| b.holders.first())
            .map_or(0, |h| h.token.get()),
        blockers: blockers(all, readable),
    })
}

/// An acquire's answer on the wire; `bound`: its leases are tied to a session.
pub(super) fn acquire_outcome(
    reply: AcquireReply,
    bound: bool,
    readable: &Readable,
) -> v1::acquire_response::Outcome {
    match reply {
        AcquireReply::Granted { grants, after_wait } => {
            v1::acquire_response::Outcome::Granted(v1::Granted {
                leases: leases(grants, bound),
                after_wait,
                repeat: false,
            })
        }
        AcquireReply::Repeated(grants) => v1::acquire_response::Outcome::Granted(v1::Granted {
            leases: leases(grants, bound),
            after_wait: false,
            repeat: true,
        }),
        AcquireReply::Ended => not_acquired(v1::not_acquired::Reason::Ended),
        AcquireReply::NotAcquired(n) => {
            refused(v1::not_acquired::Reason::Held, n.blockers, readable)
        }
        AcquireReply::TimedOut(all) => refused(v1::not_acquired::Reason::TimedOut, all, readable),
        AcquireReply::SessionEnded => not_acquired(v1::not_acquired::Reason::SessionEnded),
    }
}

fn leases(grants: Vec<Grant>, bound: bool) -> Vec<v1::Lease> {
    grants
        .into_iter()
        .map(|g| v1::Lease {
            resource: g.resource.to_string(),
            acquisition_id: g.acquisition_id.as_bytes().to_vec(),
            token: g.token.get(),
            ttl_ms: g.ttl_ms,
            session_bound: bound,
            waited_ms: g.waited_ms,
            slot: g.slot,
        })
        .collect()
}

pub(super) fn not_acquired(reason: v1::not_acquired::Reason) -> v1::acquire_response::Outcome {
    v1::acquire_response::Outcome::NotAcquired(v1::NotAcquired {
        reason: reason.into(),
        resource: String::new(),
        holder_token: 0,
        blockers: Vec::new(),
    })
}

pub(super) fn renew_message(out: baton_core::RenewOutcome) -> v1::RenewResponse {
    match out {
        baton_core::RenewOutcome::Renewed { token, ttl_ms } => v1::RenewResponse {
            renewed: true,
            token: token.get(),
            remaining_ms: ttl_ms,
        },
        baton_core::RenewOutcome::NotOwner => v1::RenewResponse {
            renewed: false,
            token: 0,
            remaining_ms: 0,
        },
    }
}

pub(super) fn release_message(out: baton_core::ReleaseOutcome) -> v1::ReleaseResponse {
    match out {
        baton_core::ReleaseOutcome::Released { token } => v1::ReleaseResponse {
            released: true,
            token: token.get(),
        },
        baton_core::ReleaseOutcome::NotHeld => v1::ReleaseResponse {
            released: false,
            token: 0,
        },
    }
}

pub(super) fn status_message(s: LeaseStatus) -> v1::StatusResponse {
    v1::StatusResponse {
        resource: s.resource.to_string(),
        held: s.holder_token.is_some(),
        holder_token: s.holder_token.map_or(0, |t| t.get()),
        remaining_ms: s.remaining_ms,
        ttl_ms: s.ttl_ms,
        n_waiters: s.n_waiters as u64,
        holder: s.holder.map(|h| h.to_string()).unwrap_or_default(),
        issued_through: s.issued_through.get(),
        permits: match s.kind {
            Some(Kind::Semaphore(n)) => n,
            Some(Kind::Lock) | None => 0,
        },
        slots: s
            .slots
            .into_iter()
            .map(|x| v1::SlotHolder {
                slot: x.slot,
                token: x.token.get(),
                remaining_ms: x.remaining_ms,
                ttl_ms: x.ttl_ms,
                holder: x.holder.map(|h| h.to_string()).unwrap_or_default(),
            })
            .collect(),
    }
}

/// The backup's messages for a snapshot of the store: parts of at most
/// `leases_per_part` leases, the first with the sessions (and the only one
/// when the store holds no more than that), converted as they are taken.
pub(super) fn snapshot_parts(
    stored: Stored,
    leases_per_part: usize,
) -> impl Iterator<Item = v1::Snapshot> {
    let (epoch, counter) = (stored.epoch.get(), stored.counter);
    let mut sessions = Some(
        stored
            .sessions
            .into_iter()
            .map(|s| v1::StoredSession {
                digest: s.digest.as_bytes().to_vec(),
                ttl_ms: s.ttl_ms,
                opener: s.opener.unwrap_or_default(),
            })
            .collect::<Vec<_>>(),
    );
    let mut leases = stored.leases.into_iter().peekable();
    std::iter::from_fn(move || {
        let first = sessions.is_some();
        if !first && leases.peek().is_none() {
            return None;
        }
        Some(v1::Snapshot {
            format: SNAPSHOT_FORMAT,
            epoch,
            counter,
            leases: Vec::new(),
            stored_leases: leases
                .by_ref()
                .take(leases_per_part)
                .map(|(r, l)| v1::StoredLease {
                    resource: r.to_string(),
                    acquisition_digest: l.acquisition_digest.as_bytes().to_vec(),
                    token: l.token.get(),
                    ttl_ms: l.ttl_ms,
                    session_digest: l.session.map_or_else(Vec::new, |d| d.as_bytes().to_vec()),
                    holder: l.holder.map(|h| h.to_string()).unwrap_or_default(),
                    permits: match l.shape {
                        Shape::Permits(n) => n,
                        Shape::Exclusive | Shape::Shared => 0,
                    },
                })
                .collect(),
            sessions: sessions.take().unwrap_or_default(),
        })
    })
}
