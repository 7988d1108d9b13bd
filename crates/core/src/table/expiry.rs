//! Expiry in bounded steps.
//!
//! Many leases can reach their deadline in one step: leases granted in the
//! same millisecond, or every lease whose deadline passed while the server
//! was paused. Dropping them all in that step would hold the table (and
//! the engine's lock) for as long as that takes, write every deletion in
//! one batch, and stall every other caller. So a step only *reaches* the
//! leases whose deadline came: it splits them off the deadline set in one
//! piece (whole chunks moved and one cut, not a pop per lease), uncounts
//! them and queues the piece in `overdue`; then at most
//! [`ENDS_PER_STEP`](crate::ENDS_PER_STEP) of the queue are dropped
//! (written, reported, their resource handed on) per step, and the table
//! asks to be stepped again a millisecond later while any are left (as
//! `drain.rs` does, so that other callers take the engine's lock in
//! between).
//!
//! From the step that reached it, such a lease is gone for every caller
//! (`gone.rs`): the caller that touches its resource drops it first.

use super::state::Lease;
use super::{Event, LeaseTable, MonoMs};
use crate::ResourceName;

impl LeaseTable {
    /// Every lease whose deadline is at or before `now` is reached: split
    /// off the deadline set, uncounted, and queued to be dropped; gone for
    /// every caller once `expired_through` passes its deadline. Returns how
    /// many were reached.
    pub(super) fn reach_expiries(&mut self, now: MonoMs) -> usize {
        if self.expiries.first().is_none_or(|((at, _), ())| *at > now) {
            return 0;
        }
        let due = self
            .expiries
            .split_below(&(now.plus(1), ResourceName::below_all()));
        let reached = due.len();
        self.n_leases -= reached;
        self.n_overdue += reached;
        self.overdue.push_back(due);
        reached
    }

    /// The resources with waiters among the leases a step has just reached
    /// go to their waiters now, not when the overdue queue comes to them
    /// (a mass expiry is dropped over seconds at the pace).
    pub(super) fn hand_over_reached(&mut self, now: MonoMs) {
        let Some(piece) = self.overdue.back() else {
            return;
        };
        let waited = self.waiting_on_ended(piece.iter().map(|((_, r), ())| r), self.n_overdue);
        for resource in &waited {
            self.settle_and_pump(now, resource);
        }
    }

    /// Drops at most [`ENDS_PER_STEP`](crate::ENDS_PER_STEP) of the leases
    /// reached, oldest first, and no more in this millisecond than the
    /// pace allows ([`LeaseTable::set_expiry_drops_per_ms`]), handing each
    /// resource to its next waiter. An entry whose lease a caller already
    /// dropped (`settle`) is passed over and not counted. Of the `reached`
    /// leases this step reached, those still queued (the queue's newest)
    /// are reported as deferred.
    pub(super) fn expire_step(&mut self, now: MonoMs, reached: usize) {
        let budget = self.drop_budget(now);
        let mut dropped = 0;
        while dropped < budget {
            let Some(piece) = self.overdue.front_mut() else {
                break;
            };
            let Some(((at, resource), ())) = piece.pop_first() else {
                self.overdue.pop_front();
                continue;
            };
            self.n_overdue -= 1;
            // A lease granted since on the same resource ends later than
            // `at`: only the lease that was reached ends exactly then.
            let reached = |l: &Lease| l.session().is_none() && l.expires_at == at;
            if let Some((lease, next)) = self.take_ended(resource.clone(), reached) {
                self.report_expired(&resource, lease);
                if let Some(next) = next {
                    self.pump(now, &next);
                }
                dropped += 1;
            }
        }
        self.drops.1 += dropped;
        let n_leases = reached.min(self.n_overdue);
        if n_leases > 0 {
            self.effects
                .events
                .push(Event::ExpiriesDeferred { n_leases });
        }
    }

    /// How many ended leases (expired, or of an ended session) this step
    /// may drop: at most [`ENDS_PER_STEP`](crate::ENDS_PER_STEP), and what
    /// is left of this millisecond's pace. The caller adds what it dropped
    /// to `drops.1`.
    pub(super) fn drop_budget(&mut self, now: MonoMs) -> usize {
        if now > self.drops.0 {
            self.drops = (now, 0);
        }
        self.ends_per_step
            .min(self.drops_per_ms.saturating_sub(self.drops.1))
    }

    /// Takes out `resource`'s lease, reached by a step (already uncounted),
    /// and reports it expired.
    pub(super) fn drop_expired(&mut self, resource: &ResourceName) {
        let lease = self
            .resources
            .get_mut(resource)
            .and_then(|s| s.lease.take())
            .expect("an expired lease is still held");
        self.count_lease(resource, false);
        self.report_expired(resource, lease);
    }

    /// Writes the deletion of `resource`'s expired lease, taken out of the
    /// table, and reports it.
    fn report_expired(&mut self, resource: &ResourceName, lease: Lease) {
        assert!(
            lease.session().is_none() && lease.expires_at <= self.expired_through,
            "expired early"
        );
        self.write_end(resource, &lease);
        let (token, holder) = lease.into_token_and_holder();
        self.effects.events.push(Event::Expired {
            resource: resource.clone(),
            token,
            holder,
        });
    }

    /// Drops at most `n` ended leases (expired, or of ended sessions) per
    /// millisecond (at least one; by default
    /// [`ENDS_PER_STEP`](crate::ENDS_PER_STEP)). A shell lowers it while
    /// its store is behind: a reached lease, or a draining session's, is
    /// gone for every caller whenever its drop comes, so only the drop's
    /// write and event wait.
    pub fn set_expiry_drops_per_ms(&mut self, n: usize) {
        self.drops_per_ms = n.max(1);
    }

    /// Leases whose deadline a step reached, still to be dropped (O(1); may
    /// count some a caller has dropped since).
    pub fn n_overdue(&self) -> usize {
        self.n_overdue
    }
}
