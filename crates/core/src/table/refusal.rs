//! Why a request cannot be granted now: every requested resource in the
//! way, with its holder, how long it has held it, its TTL left and the
//! requests waiting ahead. Read-only; the service decides what a caller
//! may see of it.

pub use super::state::HeldFor;
use super::{Claim, LeaseTable, MonoMs};
use crate::{FencingToken, Holder, ResourceName, WaiterId};

/// Why a try-once acquire was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAcquired {
    /// The first requested resource that is held or has waiters.
    pub resource: ResourceName,
    /// The current holder's token, if the resource is held (it may only have waiters).
    pub holder_token: Option<FencingToken>,
    /// Every requested resource that is held or has waiters, in request
    /// order (the first is `resource`).
    pub blockers: Vec<Blocker>,
}

/// A requested resource that stood in the way of an acquire: held, or
/// with requests waiting ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The resource.
    pub resource: ResourceName,
    /// Its holders in the way, longest held (lowest token) first, at most
    /// [`BLOCKING_HOLDERS_MAX`]: the exclusive one, or the shared holders
    /// or permits that leave no room; none when only waiters are ahead.
    pub holders: Vec<Held>,
    /// How many hold it in the way (`holders` lists the first
    /// [`BLOCKING_HOLDERS_MAX`]).
    pub n_holders: u64,
    /// Requests waiting on it ahead of this one (for a refused try-once
    /// request, all of its waiters).
    pub n_waiters_ahead: u64,
}

/// At most this many holders of one blocking resource are listed.
pub const BLOCKING_HOLDERS_MAX: usize = 16;

/// The lease that holds a blocking resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its token.
    pub token: FencingToken,
    /// Its holder's description, if it gave one.
    pub holder: Option<Holder>,
    /// How long it has been held.
    pub held_for: HeldFor,
    /// Its TTL left; `None` when it is tied to a session (it lasts as long
    /// as the session's heartbeats).
    pub remaining_ms: Option<u64>,
}

impl LeaseTable {
    /// Why a request on `claims` cannot be granted now: every one of them
    /// that does not admit it or has waiters (ahead of `waiter`, if it
    /// waits), or `None`.
    pub(super) fn not_acquired<'a>(
        &self,
        now: MonoMs,
        claims: impl Iterator<Item = &'a Claim>,
        waiter: Option<WaiterId>,
    ) -> Option<NotAcquired> {
        let blockers = self.blockers(now, claims, waiter);
        let first = blockers.first()?;
        Some(NotAcquired {
            resource: first.resource.clone(),
            holder_token: first.holders.first().map(|h| h.token),
            blockers,
        })
    }

    /// Each of `claims` that does not admit it or has waiters (ahead of
    /// `waiter`, if it waits), in their order, each with its holders in
    /// the way.
    pub(super) fn blockers<'a>(
        &self,
        now: MonoMs,
        claims: impl Iterator<Item = &'a Claim>,
        waiter: Option<WaiterId>,
    ) -> Vec<Blocker> {
        claims
            .filter_map(|claim| {
                let resource = &claim.resource;
                let state = self.resources.get(resource)?;
                let queue = self.queue(resource);
                let n_waiters_ahead = match (queue, waiter) {
                    (None, _) => 0,
                    (Some(q), Some(w)) => q.iter().position(|x| *x == w).unwrap_or(q.len()),
                    (Some(q), None) => q.len(),
                } as u64;
                let admitted = self.admits_in(Some(state), claim);
                if admitted && n_waiters_ahead == 0 {
                    return None;
                }
                let mut in_way: Vec<&super::state::Lease> = match state.lease.as_ref() {
                    Some(l) if !self.is_gone(l) => vec![l],
                    _ if admitted => Vec::new(),
                    _ => self
                        .slot_names(resource)
                        .iter()
                        .filter_map(|n| self.resources.get(n)?.lease.as_ref())
                        .filter(|l| !self.is_gone(l))
                        .collect(),
                };
                in_way.sort_by_key(|l| l.token);
                let n_holders = in_way.len() as u64;
                let holders = in_way
                    .into_iter()
                    .take(BLOCKING_HOLDERS_MAX)
                    .map(|l| Held {
                        token: l.token,
                        holder: l.holder().cloned(),
                        held_for: l.held_for(now),
                        remaining_ms: l
                            .session()
                            .is_none()
                            .then(|| self.expiry_of(l).left_at(now)),
                    })
                    .collect();
                Some(Blocker {
                    resource: resource.clone(),
                    holders,
                    n_holders,
                    n_waiters_ahead,
                })
            })
            .collect()
    }
}
