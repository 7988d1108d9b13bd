//! Lock shapes: a resource held by one exclusive holder, by any number of
//! shared holders, or by at most N holders of a semaphore's permits.
//!
//! The exclusive holder is the resource's lease, as it always was. Every
//! other holder is a lease of its own under a holder's name
//! ([`ResourceName::slot`]): the resource's name and a slot, the lowest
//! free one when it was granted (below N for a permit). The machinery of
//! leases (expiry, sessions, bounded drops, the store) is the same for
//! both; this module keeps, per resource, which slots are held (`groups`)
//! and a semaphore's N (`semaphores`), and judges a claim against them.
//!
//! The rules: a resource is a lock (exclusive and shared claims) or a
//! semaphore (permit claims of one N) while it has a holder or a waiter;
//! a claim of the other kind, or of another N, is refused naming both.
//! Waiting is first come first served across every shape: a request
//! never passes one queued before it, so a waiting exclusive request
//! holds back the shared ones behind it (no writer starvation).

use std::collections::BTreeSet;

use super::state::ResourceState;
use super::{AcquireError, LeaseTable};
use crate::{AcquisitionId, ResourceName};

/// The most permits a semaphore can have.
pub const PERMITS_MAX: u32 = 4_096;

/// How a claim holds its resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Alone: no other holder of any shape.
    #[default]
    Exclusive,
    /// Beside any number of other shared holders, and no exclusive one.
    Shared,
    /// One of at most this many permits of a semaphore.
    Permits(u32),
}

impl Shape {
    /// Its name in messages: `exclusive`, `shared`, `a semaphore of N permits`.
    pub fn describe(self) -> String {
        match self {
            Shape::Exclusive => "an exclusive lock".into(),
            Shape::Shared => "a shared lock".into(),
            Shape::Permits(n) => format!("a semaphore of {n} permits"),
        }
    }
}

/// One resource of an acquire request, with the acquisition id its lease
/// will carry and how it is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The canonical resource name.
    pub resource: ResourceName,
    /// The holder's secret for this lease.
    pub acquisition_id: AcquisitionId,
    /// Exclusive, shared, or a permit.
    pub shape: Shape,
}

impl Claim {
    /// An exclusive claim: today's lock.
    pub fn exclusive(resource: ResourceName, acquisition_id: AcquisitionId) -> Self {
        Self {
            resource,
            acquisition_id,
            shape: Shape::Exclusive,
        }
    }
}

/// What a resource is, for a claim that does not fit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Held or waited for as a lock (exclusive or shared).
    Lock,
    /// A semaphore of this many permits.
    Semaphore(u32),
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Lock => f.write_str("a lock"),
            Kind::Semaphore(n) => write!(f, "a semaphore of {n} permits"),
        }
    }
}

/// The slots held on one resource by shared holders or permits.
pub(super) type Slots = BTreeSet<u32>;

impl LeaseTable {
    /// What `resource` is now, if it has a holder or a waiter.
    pub(super) fn kind_of(&self, resource: &ResourceName) -> Option<Kind> {
        self.kind_in(resource, self.resources.get(resource).map(|s| &**s))
    }

    /// [`LeaseTable::kind_of`], given the resource's state.
    pub(super) fn kind_in(
        &self,
        resource: &ResourceName,
        state: Option<&ResourceState>,
    ) -> Option<Kind> {
        if let Some(&n) = self.semaphores.get(resource) {
            return Some(Kind::Semaphore(n));
        }
        let held = state.is_some_and(|s| s.lease.is_some()) || self.groups.contains_key(resource);
        (held || self.queue(resource).is_some()).then_some(Kind::Lock)
    }

    /// Refuses a claim whose shape is not what its resource is, or a
    /// permit count out of range.
    pub(super) fn check_shape(&self, claim: &Claim) -> Result<(), AcquireError> {
        let resource = &claim.resource;
        let kind = match claim.shape {
            // The common case: a lock claim, and no semaphore anywhere.
            Shape::Exclusive | Shape::Shared if self.semaphores.is_empty() => return Ok(()),
            Shape::Exclusive | Shape::Shared => {
                self.semaphores.get(resource).map(|&n| Kind::Semaphore(n))
            }
            Shape::Permits(_) => self.kind_of(resource),
        };
        match (claim.shape, kind) {
            (Shape::Permits(n), _) if n == 0 || n > PERMITS_MAX => {
                Err(AcquireError::PermitsOutOfRange {
                    resource: resource.clone(),
                    n_permits: n,
                    n_permits_max: PERMITS_MAX,
                })
            }
            (Shape::Permits(n), Some(Kind::Semaphore(m))) if n != m => {
                Err(AcquireError::PermitsDiffer {
                    resource: resource.clone(),
                    n_permits: n,
                    n_permits_now: m,
                })
            }
            (Shape::Permits(_), Some(kind @ Kind::Lock))
            | (Shape::Exclusive | Shape::Shared, Some(kind @ Kind::Semaphore(_))) => {
                Err(AcquireError::KindDiffers {
                    resource: resource.clone(),
                    asked: claim.shape.describe(),
                    now: kind,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether `claim` could be held now beside what holds its resource
    /// (leases that have ended do not count), waiters aside.
    pub(super) fn admits(&self, claim: &Claim) -> bool {
        self.admits_in(self.resources.get(&claim.resource).map(|s| &**s), claim)
    }

    /// [`LeaseTable::admits`], given the resource's state.
    pub(super) fn admits_in(&self, state: Option<&ResourceState>, claim: &Claim) -> bool {
        let exclusive = state
            .and_then(|s| s.lease.as_ref())
            .is_some_and(|l| !self.is_gone(l));
        if exclusive {
            return false;
        }
        let resource = &claim.resource;
        match claim.shape {
            Shape::Exclusive => {
                self.n_live_slots(resource) == 0
                    || crate::bad::on(crate::bad::Variant::ExclusiveBesideShared)
            }
            Shape::Shared => !self.holds_slot(resource, &claim.acquisition_id),
            Shape::Permits(_) => {
                let n = self.semaphores.get(resource).copied().unwrap_or(u32::MAX);
                let fits = if crate::bad::on(crate::bad::Variant::PermitsAtOrBelow) {
                    self.n_live_slots(resource) <= n as usize
                } else {
                    self.n_live_slots(resource) < n as usize
                };
                fits && !self.holds_slot(resource, &claim.acquisition_id)
            }
        }
    }

    /// Whether `id` already holds one of `resource`'s slots: a second copy
    /// of the request that got it (a duplicate the network delivered, sent
    /// without a request id) waits, as it would behind an exclusive lease
    /// of its own, and is never granted a second slot.
    fn holds_slot(&self, resource: &ResourceName, id: &crate::AcquisitionId) -> bool {
        let Some(slots) = self.groups.get(resource) else {
            return false;
        };
        let digest = id.digest();
        slots.iter().any(|&k| {
            self.resources
                .get(&resource.slot(k))
                .and_then(|s| s.lease.as_ref())
                .is_some_and(|l| l.acquisition_digest == digest && !self.is_gone(l))
        })
    }

    /// How many of `resource`'s slots hold a lease that has not ended.
    pub(super) fn n_live_slots(&self, resource: &ResourceName) -> usize {
        if self.groups.is_empty() {
            return 0;
        }
        let Some(slots) = self.groups.get(resource) else {
            return 0;
        };
        if self.draining.is_empty() && self.n_overdue == 0 {
            return slots.len();
        }
        slots
            .iter()
            .filter(|&&k| {
                self.resources
                    .get(&resource.slot(k))
                    .and_then(|s| s.lease.as_ref())
                    .is_some_and(|l| !self.is_gone(l))
            })
            .count()
    }

    /// The holders' names of `resource`'s slots, held or ended.
    pub(super) fn slot_names(&self, resource: &ResourceName) -> Vec<ResourceName> {
        if self.groups.is_empty() {
            return Vec::new();
        }
        self.groups
            .get(resource)
            .map(|slots| slots.iter().map(|&k| resource.slot(k)).collect())
            .unwrap_or_default()
    }

    /// Takes the lowest free slot of `resource` for a new holder of
    /// `shape` (not exclusive) and returns the holder's name.
    pub(super) fn take_slot(
        &mut self,
        resource: &ResourceName,
        shape: Shape,
    ) -> (ResourceName, u32) {
        if let Shape::Permits(n) = shape {
            self.semaphores.entry(resource.clone()).or_insert(n);
        }
        let slots = self.groups.entry(resource.clone()).or_default();
        let slot = (0..).find(|k| !slots.contains(k)).expect("a free slot");
        slots.insert(slot);
        (resource.slot(slot), slot)
    }

    /// After the lease under `name` left the table: frees its slot if it
    /// was a holder's, and returns the resource to hand on.
    pub(super) fn left(&mut self, name: &ResourceName) -> Option<ResourceName> {
        // Every holder's name has its slot in `groups`: with none, `name`
        // is a resource's own (the common case, on every release and drop).
        if self.groups.is_empty() {
            return None;
        }
        let (resource, slot) = name.slot_of()?;
        if let Some(slots) = self.groups.get_mut(&resource) {
            slots.remove(&slot);
            if slots.is_empty() {
                self.groups.remove(&resource);
            }
        }
        Some(resource)
    }

    /// Forgets what `resource` was once nothing holds or waits on it.
    pub(super) fn forget_kind_if_idle(&mut self, resource: &ResourceName) {
        if !self.semaphores.is_empty()
            && !self.groups.contains_key(resource)
            && self.queue(resource).is_none()
        {
            self.semaphores.remove(resource);
        }
    }

    /// The shape a holder's lease under `name` was granted with.
    pub(super) fn shape_of(&self, name: &ResourceName) -> Shape {
        match name.split_slot() {
            None => Shape::Exclusive,
            Some((resource, _)) => match self.semaphores.get(resource) {
                Some(&n) => Shape::Permits(n),
                None => Shape::Shared,
            },
        }
    }
}

/// Why an operator's change of a semaphore's N was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum SetPermitsError {
    #[error(
        "resource {resource}: a semaphore has from 1 to {n_permits_max} permits, not {n_permits}"
    )]
    OutOfRange {
        resource: ResourceName,
        n_permits: u32,
        n_permits_max: u32,
    },
    #[error("resource {resource} is not a semaphore now (it is {now}); a semaphore's N is set by its first request")]
    NotASemaphore { resource: ResourceName, now: String },
}

impl LeaseTable {
    /// An operator's change of a semaphore's N, while it has a holder or
    /// a waiter: lowering it revokes no permit held (new ones wait until
    /// fewer than N are held); raising it grants waiters at once. Every
    /// permit held is written again with the new N, durably before the
    /// answer (`sync`), so a restart or a new leader keeps it. Returns the
    /// N it replaced.
    pub fn set_permits(
        &mut self,
        now: super::MonoMs,
        resource: &ResourceName,
        n_permits: u32,
    ) -> Result<u32, SetPermitsError> {
        self.tick(now);
        if n_permits == 0 || n_permits > PERMITS_MAX {
            return Err(SetPermitsError::OutOfRange {
                resource: resource.clone(),
                n_permits,
                n_permits_max: PERMITS_MAX,
            });
        }
        self.settle_and_pump(now, resource);
        let Some(n) = self.semaphores.get_mut(resource) else {
            let now = self.kind_of(resource).map_or_else(
                || "neither held nor waited for".to_owned(),
                |k| k.to_string(),
            );
            return Err(SetPermitsError::NotASemaphore {
                resource: resource.clone(),
                now,
            });
        };
        let before = std::mem::replace(n, n_permits);
        for name in self.slot_names(resource) {
            let Some(lease) = self.resources.get(&name).and_then(|s| s.lease.as_ref()) else {
                continue;
            };
            if self.is_gone(lease) {
                continue;
            }
            let record = self.record_of(&name, lease);
            self.effects.writes.push(super::Write::PutLease {
                resource: name,
                record,
            });
        }
        self.effects.sync = true;
        self.pump(now, resource);
        Ok(before)
    }
}
