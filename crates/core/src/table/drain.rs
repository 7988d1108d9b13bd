//! An ended session's leases, dropped in bounded steps.
//!
//! A session can hold many leases (100,000 is a benchmark row), and all of
//! them end when the session does. Dropping them all in the step that ends
//! the session would hold the table (and the engine's lock) for as long as
//! that takes, and stall every other caller. So the step that ends a
//! session drops at most [`ENDS_PER_STEP`] of them and leaves the
//! rest *draining*: a timer one millisecond later takes the next batch.
//!
//! The rule that keeps this invisible: a draining session's lease is gone
//! for every caller from the step that ended the session. It is not
//! counted in [`LeaseTable::n_leases`], listed, reported by
//! [`LeaseTable::status`] or renewable, and every per-resource call drops
//! the lease it touches first (`settle`), handing the
//! resource to its next waiter before the call is judged, exactly as if the
//! whole session had been dropped at once (`gone.rs` holds the rule, for
//! expired leases as well).

use super::state::Lease;
use super::{Event, LeaseTable, MonoMs, Timer};
use crate::{ResourceName, SessionDigest};

/// At most this many of an ended session's leases, or of the leases whose
/// deadline came, are dropped in one step (about a millisecond of work on
/// the reference machine).
pub const ENDS_PER_STEP: usize = 1_024;

impl LeaseTable {
    /// Drops the next batch of the draining session's leases, handing each
    /// resource on, and sets a timer for the batch after it, if any.
    /// The batch shares the expiry's pace (`drop_budget`): it may be empty
    /// while the store is behind, and the timer comes back a millisecond
    /// later.
    pub(super) fn drain_session(&mut self, now: MonoMs, digest: SessionDigest) {
        let budget = self.drop_budget(now);
        let mut dropped = 0;
        while dropped < budget {
            // Refetched each time: a hand-off below may settle (and so take
            // out) another lease of this session.
            let Some((resource, expired)) = self
                .draining
                .get_mut(&digest)
                .and_then(|d| Some((d.leases.pop_first()?, d.expired)))
            else {
                break;
            };
            let (lease, next) = self
                .take_ended(resource.clone(), |l| l.session() == Some(digest))
                .expect("a draining session's lease is held");
            self.report_drained(&resource, lease, expired);
            if let Some(next) = next {
                self.pump(now, &next);
            }
            dropped += 1;
        }
        self.drops.1 += dropped;
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

    /// Takes out the lease of an ended session on `resource` (already
    /// taken out of its draining set, and already uncounted).
    pub(super) fn drop_drained(
        &mut self,
        resource: &ResourceName,
        digest: SessionDigest,
        expired: bool,
    ) {
        let lease = self
            .resources
            .get_mut(resource)
            .and_then(|s| s.lease.take())
            .expect("a draining session's lease is held");
        self.count_lease(resource, false);
        assert_eq!(lease.session(), Some(digest), "drained by its own session");
        self.report_drained(resource, lease, expired);
    }

    /// Writes the deletion of an ended session's lease on `resource`,
    /// taken out of the table, and reports it released or expired.
    fn report_drained(&mut self, resource: &ResourceName, lease: Lease, expired: bool) {
        self.write_end(resource, &lease);
        let (token, holder) = lease.into_token_and_holder();
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

    /// Drops at most `n` of an ended session's leases, and `n` of the
    /// expired ones, per step, instead of [`ENDS_PER_STEP`] (tests use 1,
    /// so that every end is partial).
    pub fn set_ends_per_step(&mut self, n: usize) {
        assert!(n > 0, "a step must drop at least one lease");
        self.ends_per_step = n;
    }
}
