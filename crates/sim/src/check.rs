//! The checker: the fault suite's grant checker (`baton_faults::grants`)
//! over every acknowledged grant, extended with what only a simulator can
//! see: when the server really ended each lease, what each keeper claimed
//! and when, what the resources accepted, and what a restart recovered.
//!
//! The promises checked:
//! - per resource, tokens strictly increase across every grant, restart,
//!   restore and failover, and no token is answered twice (grants);
//! - one holder at a time, measured in true time, allowing each clock
//!   its drift bound (grants);
//! - no acknowledged grant is lost: a restart or takeover recovers every
//!   lease that was granted, acknowledged and not yet ended;
//! - no stale write is accepted: a resource accepts no token below one
//!   it accepted before, nor one at or below a cancellation; on the shared
//!   lock, a shared write no token below the last exclusive write's (other
//!   readers' writes, higher or lower, do not count);
//! - a keeper never claims a lease past the moment the server ended it
//!   by expiry (a fence or a restore may end it sooner, by design);
//! - the semaphore's permits: every permit in a slot below N, one holder
//!   per slot at a time, and never more than N leases certainly held at
//!   once (each slot's writes are fenced as a resource of its own);
//! - the shared lock: one holder per slot at a time, and never an
//!   exclusive lease certainly held beside any other lease of it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_core::{Epoch, Event, FencingToken, ResourceName};
use baton_faults::grants;
use baton_store::Stored;

use baton_fence::Side;

use crate::resources::Key;
use crate::world::{Ms, DRIFT_PPM_MAX};

struct GrantRec {
    resource: u8,
    /// A permit's slot.
    slot: Option<u32>,
    token: FencingToken,
    invoked: Ms,
    answered: Ms,
    ttl_ms: u64,
    /// The send time of the last acknowledged request that extended it.
    extended: Ms,
    released: Option<Ms>,
    /// A fence or restore ended it at this time, by design.
    revoked: Option<Ms>,
}

/// The name of resource `r` in the simulation.
pub fn resource_name(r: u8) -> String {
    format!("sim:r{r}")
}

/// The name a lease is kept under in the server's table and events: the
/// resource's, or a permit's holder's name (`ResourceName::slot`).
fn lease_name((r, slot): Key) -> String {
    match slot {
        Some(k) => format!("{}{}{k}", resource_name(r), baton_core::SLOT_SEPARATOR),
        None => resource_name(r),
    }
}

#[derive(Default)]
pub struct Checker {
    grants: Vec<GrantRec>,
    by_token: BTreeMap<u64, usize>,
    /// Tokens issued by fences: (resource, token, invoked, answered).
    fences: Vec<(u8, FencingToken, Ms, Ms)>,
    /// When the server ended each lease (resource, token), as its
    /// authoritative table saw it. A token that never became durable may
    /// be issued again, for another lease, after a crash or a failover.
    server_end: BTreeMap<(String, u64), Ms>,
    last_granted: BTreeMap<String, u64>,
    /// Leases (resource, token) an operator's fence revoked, and when.
    revocations: BTreeMap<(String, u64), Ms>,
    /// Acknowledged grants not yet ended: resource name to token.
    live: BTreeMap<String, u64>,
    accepted: BTreeMap<Key, FencingToken>,
    /// The highest token an exclusive write was accepted under.
    accepted_exclusive: BTreeMap<Key, FencingToken>,
    /// The restores so far: when, and the epoch each started.
    restores: Vec<(Ms, Epoch)>,
    cancelled: BTreeMap<Key, FencingToken>,
    pub violations: Vec<String>,
    pub ops_started: u64,
    pub ops_indeterminate: u64,
    pub writes_accepted: u64,
    pub stale_refused: u64,
    pub claims: u64,
    pub recoveries: u64,
    pub sessions_opened: u64,
    /// Acknowledged session heartbeats.
    pub heartbeats: u64,
    /// Claims of leases held by a session.
    pub session_claims: u64,
    /// The most permits of the semaphore certainly held at once.
    pub most_permits: usize,
    /// The most shared leases of the shared lock certainly held at once.
    pub most_readers: usize,
}

impl Checker {
    pub fn granted(
        &mut self,
        (resource, slot): Key,
        token: FencingToken,
        invoked: Ms,
        answered: Ms,
        ttl_ms: u64,
    ) -> usize {
        if resource == crate::SEMAPHORE && slot.is_none_or(|k| k >= crate::SEMAPHORE_PERMITS) {
            self.violations.push(format!(
                "permit {token} on r{resource} in slot {slot:?} of {} at {answered}",
                crate::SEMAPHORE_PERMITS
            ));
        }
        if let Some(i) = self.by_token.get(&token.get()) {
            let g = &self.grants[*i];
            self.violations.push(format!(
                "token {token} answered twice (first for r{} at {})",
                g.resource, g.answered
            ));
        }
        // Answered after a restore from a store that does not hold it.
        let restored = self
            .restores
            .iter()
            .find(|(_, epoch)| token.epoch() < *epoch)
            .map(|(at, _)| *at);
        // Fenced before its answer arrived.
        let fenced = self
            .revocations
            .get(&(lease_name((resource, slot)), token.get()))
            .copied();
        let revoked = restored.into_iter().chain(fenced).min();
        self.grants.push(GrantRec {
            resource,
            slot,
            token,
            invoked,
            answered,
            ttl_ms,
            extended: invoked,
            released: None,
            revoked,
        });
        self.by_token.insert(token.get(), self.grants.len() - 1);
        if revoked.is_none() {
            self.live.insert(lease_name((resource, slot)), token.get());
        }
        self.grants.len() - 1
    }

    pub fn extended(&mut self, grant: usize, sent: Ms) {
        let g = &mut self.grants[grant];
        g.extended = g.extended.max(sent);
    }

    pub fn released(&mut self, now: Ms, grant: usize) {
        let g = &mut self.grants[grant];
        g.released.get_or_insert(now);
    }

    /// A keeper claimed the lease at `now` (it sent a write under it).
    pub fn claimed(&mut self, now: Ms, grant: usize) {
        self.claims += 1;
        let g = &self.grants[grant];
        if g.revoked.is_some() {
            return;
        }
        if let Some(end) = self
            .server_end
            .get(&(lease_name((g.resource, g.slot)), g.token.get()))
        {
            if now > *end {
                self.violations.push(format!(
                    "a keeper claimed {} on r{} at {now}, after the server ended it at {end}",
                    g.token, g.resource
                ));
            }
        }
    }

    pub fn fenced(
        &mut self,
        resource: u8,
        token: FencingToken,
        revoked: Option<FencingToken>,
        invoked: Ms,
        answered: Ms,
    ) {
        self.fences.push((resource, token, invoked, answered));
        if let Some(i) = revoked.and_then(|r| self.by_token.get(&r.get())) {
            self.grants[*i].revoked.get_or_insert(invoked);
        }
    }

    /// A restore ends every lease granted so far (the backup may not hold it).
    pub fn restored(&mut self, now: Ms, epoch: Epoch) {
        self.restores.push((now, epoch));
        for g in &mut self.grants {
            g.revoked.get_or_insert(now);
        }
        self.live.clear();
    }

    /// What a server's authoritative table did, at true time `now`.
    pub fn server_event(&mut self, now: Ms, e: &Event) {
        match e {
            Event::Granted {
                resource, token, ..
            } => {
                let name = resource.as_str().to_string();
                let prev = self.last_granted.insert(name.clone(), token.get());
                if let Some(prev) = prev.filter(|p| *p != token.get()) {
                    self.server_end.entry((name, prev)).or_insert(now);
                }
            }
            Event::Expired {
                resource, token, ..
            }
            | Event::Released {
                resource, token, ..
            } => {
                let key = (resource.as_str().to_string(), token.get());
                self.server_end.entry(key).or_insert(now);
                self.end_live(resource, *token);
            }
            Event::Fenced {
                resource,
                revoked: Some(token),
                ..
            } => {
                // A revocation: the holder may hear of it only later.
                let key = (resource.as_str().to_string(), token.get());
                self.revocations.entry(key).or_insert(now);
                if let Some(i) = self.by_token.get(&token.get()) {
                    self.grants[*i].revoked.get_or_insert(now);
                }
                self.end_live(resource, *token);
            }
            _ => {}
        }
    }

    fn end_live(&mut self, resource: &ResourceName, token: FencingToken) {
        let key = resource.as_str().to_string();
        if self.live.get(&key) == Some(&token.get()) {
            self.live.remove(&key);
        }
    }

    /// A restart or takeover loaded `stored`: every acknowledged lease not
    /// ended must be in it, and no token above its position was answered.
    pub fn recovered(&mut self, now: Ms, stored: &Stored) {
        self.recoveries += 1;
        let held: BTreeMap<&str, u64> = stored
            .leases
            .iter()
            .map(|(r, l)| (r.as_str(), l.token.get()))
            .collect();
        let position = FencingToken::new(stored.epoch, stored.counter)
            .map(|t| t.get())
            .unwrap_or(0);
        for (resource, token) in &self.live {
            let ended = self.server_end.contains_key(&(resource.clone(), *token));
            if held.get(resource.as_str()) != Some(token) && !ended {
                self.violations.push(format!(
                    "acknowledged grant {token} on {resource} lost at {now}"
                ));
            }
        }
        // A token above the position was never durable: its number may be
        // issued again, for another lease, so its history ends here.
        self.server_end.retain(|(_, t), _| *t <= position);
        self.last_granted.retain(|_, t| *t <= position);
        self.revocations.retain(|(_, t), _| *t <= position);
        if let Some((token, _)) = self.by_token.range(position + 1..).next() {
            self.violations.push(format!(
                "token {token} was answered, but the store loaded at {now} is at {position}"
            ));
        }
    }

    pub fn accepted(&mut self, now: Ms, resource: Key, token: FencingToken, side: Side) {
        self.writes_accepted += 1;
        let floors = match side {
            Side::Exclusive => &mut self.accepted,
            Side::Shared => &mut self.accepted_exclusive,
        };
        if let Some(top) = floors.get(&resource) {
            if token < *top {
                self.violations.push(format!(
                    "stale write accepted on {resource:?} at {now}: {token} after {top}"
                ));
            }
        }
        if let Some(c) = self.cancelled.get(&resource) {
            if token <= *c {
                self.violations.push(format!(
                    "write accepted on {resource:?} at {now} under {token}, cancelled at {c}"
                ));
            }
        }
        let top = self.accepted.entry(resource).or_insert(token);
        *top = (*top).max(token);
        if side == Side::Exclusive {
            let top = self.accepted_exclusive.entry(resource).or_insert(token);
            *top = (*top).max(token);
        }
    }

    pub fn cancelled(&mut self, resource: Key, at: FencingToken) {
        let c = self.cancelled.entry(resource).or_insert(at);
        *c = (*c).max(at);
    }

    /// The fault suite's checker over every grant and fence, in true time.
    pub fn finish(&mut self) {
        let base = Instant::now();
        let at = |ms: Ms| base + Duration::from_millis(ms);
        // A permit's grants are checked per slot: each slot is one holder
        // at a time; the semaphore as a whole holds up to N.
        let slot_name = |r: u8, slot: Option<u32>| match slot {
            Some(k) => format!("r{r}/slot-{k}"),
            None => format!("r{r}"),
        };
        let mut list: Vec<grants::Grant> = self
            .grants
            .iter()
            .map(|g| {
                // The server counted the TTL on a clock at most DRIFT fast.
                let ttl_true = g.ttl_ms * 1_000_000 / (1_000_000 + DRIFT_PPM_MAX as u64);
                let end = [Some(g.extended + ttl_true), g.released, g.revoked]
                    .into_iter()
                    .flatten()
                    .min();
                grants::Grant {
                    resource: slot_name(g.resource, g.slot),
                    token: g.token.get(),
                    invoked: at(g.invoked),
                    answered: at(g.answered),
                    earliest_end: end.map(at),
                }
            })
            .collect();
        // `list` holds one entry per grant, in order: the semaphore's whole.
        let permits: Vec<grants::Grant> = self
            .grants
            .iter()
            .zip(&list)
            .filter(|(g, _)| g.resource == crate::SEMAPHORE)
            .map(|(_, l)| grants::Grant {
                resource: format!("r{}", crate::SEMAPHORE),
                ..l.clone()
            })
            .collect();
        let most = grants::max_concurrent(&permits)
            .values()
            .copied()
            .max()
            .unwrap_or(0);
        self.most_permits = self.most_permits.max(most);
        if most > crate::SEMAPHORE_PERMITS as usize {
            self.violations.push(format!(
                "{most} permits of r{} held at once, of {}",
                crate::SEMAPHORE,
                crate::SEMAPHORE_PERMITS
            ));
        }
        self.check_shared_lock(&list);
        // A fence is a grant that ends at once (a semaphore's permits are
        // checked by slot, beside it: a token is one grant's).
        list.extend(self.fences.iter().map(|(r, t, i, a)| grants::Grant {
            resource: format!("r{r}"),
            token: t.get(),
            invoked: at(*i),
            answered: at(*a),
            earliest_end: Some(at(*i)),
        }));
        let verdict = grants::check(&list);
        if !verdict.is_safe() {
            self.violations.push(format!("grant checker: {verdict:?}"));
        }
    }

    /// The shared lock's grants (`list` in the order of `self.grants`):
    /// no exclusive lease certainly held while any other is. Each shared
    /// holder is checked per slot by the grant checker beside this.
    fn check_shared_lock(&mut self, list: &[grants::Grant]) {
        let held = |g: &grants::Grant| g.earliest_end.filter(|end| *end > g.answered);
        let mut readers = Vec::new();
        let mut writers = Vec::new();
        for (g, l) in self.grants.iter().zip(list) {
            if g.resource != crate::SHARED_LOCK || held(l).is_none() {
                continue;
            }
            if g.slot.is_some() {
                readers.push(grants::Grant {
                    resource: "readers".into(),
                    ..l.clone()
                });
            } else {
                writers.push(l);
            }
        }
        let most = grants::max_concurrent(&readers).values().copied().max();
        self.most_readers = self.most_readers.max(most.unwrap_or(0));
        // Every grant kept above is certainly held from `answered` to its
        // `earliest_end` (set and later, or it would not be kept).
        let overlap = |a: &grants::Grant, b: &grants::Grant| {
            a.answered < b.earliest_end.unwrap_or(b.answered)
                && b.answered < a.earliest_end.unwrap_or(a.answered)
        };
        for w in &writers {
            let beside = readers
                .iter()
                .chain(writers.iter().copied())
                .find(|o| o.token != w.token && overlap(w, o));
            if let Some(o) = beside {
                self.violations.push(format!(
                    "exclusive {} on r{} held beside {}",
                    w.token,
                    crate::SHARED_LOCK,
                    o.token
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(epoch: u32, counter: u64) -> FencingToken {
        FencingToken::new(Epoch::new(epoch).unwrap(), counter).unwrap()
    }

    fn name(r: u8) -> ResourceName {
        ResourceName::parse(&resource_name(r)).unwrap()
    }

    fn granted_event(r: u8, token: FencingToken) -> Event {
        Event::Granted {
            resource: name(r),
            token,
            acquisition_id: baton_core::AcquisitionId::from_bytes([1; 16]),
            after_wait: false,
            holder: None,
        }
    }

    #[test]
    fn a_claim_after_the_server_ended_the_lease_is_a_violation_and_one_before_is_not() {
        let mut c = Checker::default();
        c.server_event(10, &granted_event(0, t(1, 1)));
        let g = c.granted((0, None), t(1, 1), 5, 12, 1_000);
        c.claimed(500, g);
        assert!(c.violations.is_empty());
        c.server_event(
            1_100,
            &Event::Expired {
                resource: name(0),
                token: t(1, 1),
                holder: None,
            },
        );
        c.claimed(1_101, g);
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    }

    /// Found by the simulator: the operator's fence revoked a lease whose
    /// grant was still on its way to the holder.
    #[test]
    fn a_lease_fenced_before_its_answer_arrived_is_revoked_from_the_fence() {
        let mut c = Checker::default();
        c.server_event(10, &granted_event(0, t(1, 1)));
        c.server_event(
            11,
            &Event::Fenced {
                resource: name(0),
                token: t(1, 2),
                revoked: Some(t(1, 1)),
                holder: None,
            },
        );
        let g = c.granted((0, None), t(1, 1), 5, 20, 1_000);
        c.server_event(12, &granted_event(0, t(1, 3)));
        c.claimed(30, g);
        c.fenced(0, t(1, 2), Some(t(1, 1)), 9, 21);
        c.granted((0, None), t(1, 3), 11, 22, 1_000);
        c.finish();
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    /// Found by the simulator: a grant answered after two restores was
    /// taken as ended by the second, though the first dropped it.
    #[test]
    fn a_grant_answered_after_two_restores_ends_at_the_first() {
        let mut c = Checker::default();
        c.restored(100, Epoch::new(2).unwrap());
        c.restored(200, Epoch::new(3).unwrap());
        c.granted((0, None), t(1, 9), 50, 300, 5_000);
        c.granted((0, None), t(2, 1), 150, 160, 5_000);
        c.finish();
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    /// A token above what the store loaded was never durable: another
    /// lease may carry it next, and the old one's end is not the new one's.
    #[test]
    fn a_token_never_made_durable_may_be_issued_again_to_another_lease() {
        let mut c = Checker::default();
        c.server_event(10, &granted_event(0, t(1, 5)));
        c.server_event(
            900,
            &Event::Expired {
                resource: name(0),
                token: t(1, 5),
                holder: None,
            },
        );
        let stored = Stored {
            epoch: Epoch::FIRST,
            counter: 4,
            leases: Vec::new(),
            sessions: Vec::new(),
        };
        c.recovered(1_000, &stored);
        c.server_event(1_010, &granted_event(0, t(1, 5)));
        let g = c.granted((0, None), t(1, 5), 1_005, 1_012, 2_000);
        c.claimed(1_500, g);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }
}
