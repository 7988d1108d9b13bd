//! The rule that keeps bounded steps invisible: a lease that has ended is
//! gone for every caller from the step in which it ended, although it may
//! stay in the table until a later step drops it.
//!
//! Two kinds of lease end that way: an ended session's (`drain.rs`) and a
//! lease of its own whose deadline a step has reached (`expiry.rs`). Such a
//! lease is not counted in [`LeaseTable::n_leases`], listed, reported by
//! [`LeaseTable::status`], saved in a snapshot, renewable or releasable, and
//! every per-resource call drops the lease it touches first (`settle`),
//! handing the resource to its next waiter before the call is judged,
//! exactly as if every ended lease had been dropped at once.

use super::state::Lease;
use super::{LeaseTable, MonoMs};
use crate::{ResourceName, WaiterId};

impl LeaseTable {
    /// Writes the end of `lease` on `resource`, however it ended: its
    /// deletion, and its acquisition digest for the store to keep a while
    /// (`repeats.rs`).
    pub(super) fn write_end(&mut self, resource: &ResourceName, lease: &Lease) {
        self.effects.writes.push(super::Write::DeleteLease {
            resource: resource.clone(),
        });
        self.effects.writes.push(super::Write::LeaseEnded {
            digest: lease.acquisition_digest,
        });
    }

    /// Whether `lease` has ended (its session ended, or a step reached its
    /// deadline), though it is still in the table until its batch comes.
    pub(super) fn is_gone(&self, lease: &Lease) -> bool {
        match lease.session() {
            Some(digest) => !self.draining.is_empty() && self.draining.contains_key(&digest),
            // Every lease a step reached is in `overdue` until dropped.
            None => self.n_overdue > 0 && lease.expires_at <= self.expired_through,
        }
    }

    /// Drops `resource`'s leases that have ended, its exclusive one or
    /// those of its shared holders or permits (without handing the
    /// resource on: the caller does). `true` if it did.
    pub(super) fn settle(&mut self, resource: &ResourceName) -> bool {
        // The common case, on every acquire, renew and release: nothing
        // ended is waiting for its step, and no lookup is needed.
        if self.draining.is_empty() && self.n_overdue == 0 {
            return false;
        }
        let mut settled = self.settle_one(resource);
        if self.groups.contains_key(resource) {
            for name in self.slot_names(resource) {
                settled |= self.settle_one(&name);
            }
        }
        settled
    }

    /// Drops the lease kept under `resource` (a resource's own name, or a
    /// holder's) if it has ended.
    fn settle_one(&mut self, resource: &ResourceName) -> bool {
        let Some(lease) = self
            .resources
            .get(resource)
            .and_then(|s| s.lease.as_ref())
            .filter(|l| self.is_gone(l))
        else {
            return false;
        };
        match lease.session() {
            Some(digest) => {
                let draining = self.draining.get_mut(&digest).expect("checked by is_gone");
                draining.leases.remove(resource);
                let expired = draining.expired;
                if draining.leases.is_empty() {
                    // Its drain timer, when it comes, finds nothing left.
                    self.draining.remove(&digest);
                }
                self.drop_drained(resource, digest, expired);
            }
            // Its entry in `overdue` finds nothing when its step comes.
            None => self.drop_expired(resource),
        }
        if self.left(resource).is_some() {
            self.resources.remove(resource);
        }
        true
    }

    /// Takes `resource`'s lease out if `ended` holds for it, in one search
    /// of the resources (a step drops up to
    /// [`ENDS_PER_STEP`](crate::ENDS_PER_STEP) leases this way, and with a
    /// million names each search is a string of cache misses). The entry
    /// goes too unless someone waits on the resource. The second value is
    /// the resource for the caller to hand on (`pump`): this one if it has
    /// waiters, or the resource whose shared holder or permit this was.
    pub(super) fn take_ended(
        &mut self,
        resource: ResourceName,
        ended: impl FnOnce(&Lease) -> bool,
    ) -> Option<(Lease, Option<ResourceName>)> {
        let queued = self.queue(&resource).is_some();
        let place = self.resources.find(&resource)?;
        let (_, state) = self.resources.at_mut(place);
        let lease = state.lease.take_if(|l| ended(l))?;
        let counted = self.quotas.on().then(|| resource.clone());
        let next = if queued {
            Some(resource)
        } else {
            let (name, _) = self.resources.remove_at(place);
            // A holder's name: its slot is free, and its resource may
            // have waiters.
            self.left(&name)
        };
        if let Some(resource) = counted {
            self.count_lease(&resource, false);
        }
        Some((lease, next))
    }

    /// The resources with waiters among `ended` (leases that just ended: a
    /// step's reached piece, or an ended session's leases), for the caller
    /// to hand over now (`settle_and_pump`) rather than when their bounded
    /// drop comes; like a caller's `settle`, those hand-offs do not count
    /// against the pace. None when the `pending` drops fit this step
    /// anyway. Found from the smaller side, `ended` or the wait queues' map
    /// (which holds only resources with waiters), and none when both hold
    /// more than [`ENDS_PER_STEP`](crate::ENDS_PER_STEP): the step stays
    /// bounded. In name order or `ended`'s, whatever the map's order, so a
    /// replay hands over in the same order.
    pub(super) fn waiting_on_ended<'a>(
        &self,
        ended: impl ExactSizeIterator<Item = &'a ResourceName>,
        pending: usize,
    ) -> Vec<ResourceName> {
        let bound = self.ends_per_step;
        if self.queues.is_empty()
            || pending <= self.drops_per_ms.min(bound)
            || self.queues.len().min(ended.len()) > bound
        {
            return Vec::new();
        }
        if self.queues.len() > ended.len() {
            // A shared holder's or a permit's end is its resource's.
            let mut waited: Vec<ResourceName> = ended
                .filter_map(|r| {
                    let slot = (!self.groups.is_empty()).then(|| r.slot_of()).flatten();
                    let owner = slot.map_or_else(|| r.clone(), |(owner, _)| owner);
                    self.queues.contains_key(&owner).then_some(owner)
                })
                .collect();
            waited.dedup();
            return waited;
        }
        let gone = |name: &ResourceName| {
            let lease = self.resources.get(name).and_then(|s| s.lease.as_ref());
            lease.is_some_and(|l| self.is_gone(l))
        };
        let mut waited: Vec<_> = self
            .queues
            .keys()
            .filter(|r| gone(r) || self.slot_names(r).iter().any(gone))
            .cloned()
            .collect();
        waited.sort_unstable();
        waited
    }

    /// [`LeaseTable::settle`], then the resource goes to its next waiter.
    pub(super) fn settle_and_pump(&mut self, now: MonoMs, resource: &ResourceName) {
        if self.settle(resource) {
            self.pump(now, resource);
        }
    }

    /// Before `waiter`'s wait ends, drops the ended leases on what it
    /// claims and lets it be granted: it would have had them when they
    /// ended. `true` if it was granted.
    pub(super) fn settle_claims_of(&mut self, now: MonoMs, waiter: WaiterId) -> bool {
        if self.draining.is_empty() && self.n_overdue == 0 {
            return false;
        }
        let Some(w) = self.waiters.get(&waiter) else {
            return false;
        };
        let claims: Vec<ResourceName> = w.claims.iter().map(|c| c.resource.clone()).collect();
        for resource in &claims {
            self.settle_and_pump(now, resource);
        }
        !self.waiters.contains_key(&waiter)
    }
}
