//! An ended session's leases, dropped in bounded steps.
//!
//! A session can hold many leases (100,000 is a benchmark row), and all of
//! them end when the session does. Dropping them all in the step that ends
//! the session would hold the table (and the engine's lock) for as long as
//! that takes, and stall every other caller. So the step that ends a
//! session drops at most [`SESSION_ENDS_PER_STEP`] of them and leaves the
//! rest *draining*: a timer one millisecond later takes the next batch.
//!
//! The rule that keeps this invisible: a draining session's lease is gone
//! for every caller from the step that ended the session. It is not
//! counted in [`LeaseTable::n_leases`], listed, reported by
//! [`LeaseTable::status`] or renewable, and every per-resource call drops
//! the lease it touches first (`settle`), handing the
//! resource to its next waiter before the call is judged, exactly as if the
//! whole session had been dropped at once.

use super::state::Lease;
use super::{Event, LeaseTable, MonoMs, Timer, Write};
use crate::{ResourceName, SessionDigest, WaiterId};

/// At most this many of an ended session's leases are dropped in one step
/// (about a millisecond of work on the reference machine).
pub const SESSION_ENDS_PER_STEP: usize = 1_024;

impl LeaseTable {
    /// Drops the next batch of the draining session's leases, handing each
    /// resource on, and sets a timer for the batch after it, if any.
    pub(super) fn drain_session(&mut self, now: MonoMs, digest: SessionDigest) {
        for _ in 0..self.ends_per_step {
            // Refetched each time: a hand-off below may settle (and so take
            // out) another lease of this session.
            let Some((resource, expired)) = self
                .draining
                .get_mut(&digest)
                .and_then(|d| Some((d.leases.pop_first()?, d.expired)))
            else {
                break;
            };
            self.drop_drained(&resource, digest, expired);
            self.pump(now, &resource);
        }
        match self.draining.get(&digest) {
            Some(d) if d.leases.is_empty() => {
                self.draining.remove(&digest);
            }
            Some(_) => {
                self.timers
                    .insert((now.plus(1), Timer::SessionDrain(digest)));
            }
            None => {}
        }
    }

    /// Whether `lease` belongs to an ended session: gone, though still in
    /// the table until its batch comes.
    pub(super) fn is_gone(&self, lease: &Lease) -> bool {
        !self.draining.is_empty()
            && lease
                .session
                .is_some_and(|digest| self.draining.contains_key(&digest))
    }

    /// Drops `resource`'s lease if it belongs to an ended session (without
    /// handing the resource on: the caller does). `true` if it did.
    pub(super) fn settle(&mut self, resource: &ResourceName) -> bool {
        // The common case, on every acquire, renew and release: nothing is
        // draining, and no lookup is needed.
        if self.draining.is_empty() {
            return false;
        }
        let Some(digest) = self
            .resources
            .get(resource)
            .and_then(|s| s.lease.as_ref())
            .filter(|l| self.is_gone(l))
            .and_then(|l| l.session)
        else {
            return false;
        };
        let draining = self.draining.get_mut(&digest).expect("checked by is_gone");
        draining.leases.remove(resource);
        let expired = draining.expired;
        if draining.leases.is_empty() {
            // Its drain timer, when it comes, finds nothing left.
            self.draining.remove(&digest);
        }
        self.drop_drained(resource, digest, expired);
        true
    }

    /// [`LeaseTable::settle`], then the resource goes to its next waiter.
    pub(super) fn settle_and_pump(&mut self, now: MonoMs, resource: &ResourceName) {
        if self.settle(resource) {
            self.pump(now, resource);
        }
    }

    /// Before `waiter`'s wait ends, drops the ended sessions' leases on what
    /// it claims and lets it be granted: it would have had them when their
    /// session ended. `true` if it was granted.
    pub(super) fn settle_claims_of(&mut self, now: MonoMs, waiter: WaiterId) -> bool {
        if self.draining.is_empty() {
            return false;
        }
        let Some(w) = self.waiters.get(&waiter) else {
            return false;
        };
        let claims: Vec<ResourceName> = w.claims.iter().map(|(r, _)| r.clone()).collect();
        for resource in &claims {
            self.settle_and_pump(now, resource);
        }
        !self.waiters.contains_key(&waiter)
    }

    /// Takes out the lease of an ended session on `resource` (already
    /// taken out of its draining set, and already uncounted).
    fn drop_drained(&mut self, resource: &ResourceName, digest: SessionDigest, expired: bool) {
        let lease = self
            .resources
            .get_mut(resource)
            .and_then(|s| s.lease.take())
            .expect("a draining session's lease is held");
        assert_eq!(lease.session, Some(digest), "drained by its own session");
        let (token, holder) = (lease.token, lease.holder);
        self.effects.writes.push(Write::DeleteLease {
            resource: resource.clone(),
        });
        self.effects.events.push(if expired {
            Event::Expired {
                resource: resource.clone(),
                token,
                holder,
            }
        } else {
            Event::Released {
                resource: resource.clone(),
                token,
                holder,
            }
        });
    }

    /// Leases of ended sessions still to be dropped (O(sessions draining)).
    pub fn n_draining(&self) -> usize {
        self.draining.values().map(|d| d.leases.len()).sum()
    }

    /// Drops at most `n` of an ended session's leases per step, instead of
    /// [`SESSION_ENDS_PER_STEP`] (tests use 1, so that every end is
    /// partial).
    pub fn set_ends_per_step(&mut self, n: usize) {
        assert!(n > 0, "a step must drop at least one lease");
        self.ends_per_step = n;
    }
}
