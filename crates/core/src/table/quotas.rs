//! What each quota's prefix (or principal) uses, counted as leases,
//! waiters and sessions come and go, and the checks made before a grant,
//! a wait or a session would exceed one (`crate::quota` holds the rules).
//!
//! A lease counts from its grant until the table drops it: an expired
//! lease or an ended session's is dropped within milliseconds at the
//! expiry pace (`expiry.rs`, `drain.rs`), or by the first call that
//! touches its resource, so for that while it still counts. The counts are
//! derived from the table: [`LeaseTable::set_quotas`] recounts them, and a
//! recovered table is recounted when the server hands it its rules, so they
//! are exact after a restart or a failover. With no rules nothing is
//! counted and every check is one branch.

use super::repeats::RequestKey;
use super::*;
use crate::quota::{OverQuota, QuotaKind, QuotaRules};

/// The rules in force and what each uses.
#[derive(Debug, Default)]
pub(super) struct Quotas {
    rules: QuotaRules,
    /// Per prefix quota (by index): live leases, waiting requests.
    leases: Vec<u64>,
    waiters: Vec<u64>,
    /// Waiting requests with a name under no waiters quota.
    shared_waiters: u64,
    /// Open sessions per principal with a sessions quota.
    sessions: HashMap<String, u64>,
}

impl Quotas {
    /// The rules in force.
    #[cfg(test)]
    pub(super) fn rules(&self) -> &QuotaRules {
        &self.rules
    }

    /// Whether any quota is in force (else nothing is counted).
    pub(super) fn on(&self) -> bool {
        !self.rules.is_empty()
    }
}

/// One prefix quota's use, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaUse {
    /// The quota's prefix.
    pub prefix: String,
    /// Live leases under it.
    pub n_leases: u64,
    /// Waiting requests under it.
    pub n_waiters: u64,
}

impl LeaseTable {
    /// Puts `rules` in force and recounts every quota from the table
    /// (O(leases + waiters + sessions)). Nothing held or waiting is
    /// revoked: a lowered quota refuses new requests until use falls
    /// under it.
    pub fn set_quotas(&mut self, rules: QuotaRules) {
        let n = rules.prefixes().len();
        self.quotas = Quotas {
            rules,
            leases: vec![0; n],
            waiters: vec![0; n],
            shared_waiters: 0,
            sessions: HashMap::new(),
        };
        if self.quotas.rules.is_empty() {
            return;
        }
        let held: Vec<ResourceName> = self
            .resources
            .iter()
            .filter(|(_, s)| s.lease.is_some())
            .map(|(r, _)| r.clone())
            .collect();
        for resource in &held {
            self.count_lease(resource, true);
        }
        let waiting: Vec<Vec<ResourceName>> = self
            .waiters
            .values()
            .map(|w| w.claims.iter().map(|c| c.resource.clone()).collect())
            .collect();
        for claims in &waiting {
            self.count_waiter(claims.iter(), true);
        }
        let openers: Vec<String> = self
            .sessions
            .values()
            .filter_map(|s| s.opener.clone())
            .collect();
        for opener in &openers {
            self.count_session(Some(opener), true);
        }
    }

    /// Each prefix quota's use, in the rules' order (for metrics), and the
    /// waiting requests in the shared pool.
    pub fn quota_use(&self) -> (Vec<QuotaUse>, u64) {
        let q = &self.quotas;
        let uses = q
            .rules
            .prefixes()
            .iter()
            .enumerate()
            .map(|(i, p)| QuotaUse {
                prefix: p.prefix.clone(),
                n_leases: q.leases[i],
                n_waiters: q.waiters[i],
            })
            .collect();
        (uses, q.shared_waiters)
    }

    /// Open sessions of each principal with a sessions quota.
    pub fn quota_sessions(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .quotas
            .sessions
            .iter()
            .map(|(p, n)| (p.clone(), *n))
            .collect();
        v.sort();
        v
    }

    /// Counts a lease on `resource` in (granted) or out (dropped).
    pub(super) fn count_lease(&mut self, resource: &ResourceName, add: bool) {
        let q = &mut self.quotas;
        if q.rules.is_empty() {
            return;
        }
        for (i, p) in q.rules.matching(resource.as_str()) {
            if p.leases_max.is_some() {
                q.leases[i] = if add {
                    q.leases[i] + 1
                } else {
                    q.leases[i] - 1
                };
            }
        }
    }

    /// Whether granting `claims` now (all of them new leases) stays within
    /// every leases quota.
    pub(super) fn check_leases<'a>(
        &self,
        claims: impl Iterator<Item = &'a ResourceName>,
    ) -> Result<(), OverQuota> {
        let q = &self.quotas;
        if q.rules.is_empty() {
            return Ok(());
        }
        let mut adds: Vec<(usize, u64)> = Vec::new();
        for resource in claims {
            for (i, p) in q.rules.matching(resource.as_str()) {
                let Some(max) = p.leases_max else { continue };
                let n = match adds.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, n)) => {
                        *n += 1;
                        *n
                    }
                    None => {
                        adds.push((i, 1));
                        1
                    }
                };
                if q.leases[i] + n > max {
                    return Err(over(QuotaKind::Leases, &p.prefix, max));
                }
            }
        }
        Ok(())
    }

    /// Whether the head waiter `head`, whose turn came, would take a
    /// leases quota over its limit: then it is answered with the quota's
    /// refusal and withdrawn, and each of its resources goes to its next
    /// waiter.
    pub(super) fn refused_over_quota(&mut self, now: MonoMs, head: WaiterId) -> bool {
        let claims: Vec<ResourceName> = self.waiters[&head]
            .claims
            .iter()
            .map(|c| c.resource.clone())
            .collect();
        // Its ended leases are dropped first: they no longer count.
        for r in &claims {
            self.settle(r);
        }
        let Err(over) = self.check_leases(claims.iter()) else {
            return false;
        };
        let deadline = self.waiters[&head].deadline;
        self.timers.remove(&(deadline, Timer::WaitDeadline(head)));
        self.remove_waiter(now, head);
        self.effects.woken.push((head, WaitResult::OverQuota(over)));
        true
    }

    /// Refuses an acquire over a leases quota that would be granted at
    /// once (`key`: its request id, remembered as not granted).
    pub(super) fn check_grant(
        &mut self,
        now: MonoMs,
        claims: &[Claim],
        key: Option<RequestKey>,
    ) -> Result<(), AcquireError> {
        let over = self.check_leases(claims.iter().map(|c| &c.resource));
        if let (Err(_), Some(key)) = (&over, key) {
            self.repeats.not_granted(now, key);
        }
        over.map_err(AcquireError::OverQuota)
    }

    /// The waiters quotas a request on `claims` counts against (each once),
    /// and whether it counts in the shared pool (a name under none).
    fn waiter_quotas<'a>(
        &self,
        claims: impl Iterator<Item = &'a ResourceName>,
    ) -> (Vec<usize>, bool) {
        let mut hit = Vec::new();
        let mut shared = false;
        for resource in claims {
            let mut any = false;
            for (i, p) in self.quotas.rules.matching(resource.as_str()) {
                if p.waiters_max.is_some() {
                    any = true;
                    if !hit.contains(&i) {
                        hit.push(i);
                    }
                }
            }
            shared |= !any;
        }
        (hit, shared)
    }

    /// Whether one more request waiting on `claims` stays within every
    /// waiters quota and the shared pool.
    pub(super) fn check_waiters<'a>(
        &self,
        claims: impl Iterator<Item = &'a ResourceName>,
    ) -> Result<(), OverQuota> {
        let q = &self.quotas;
        if q.rules.is_empty() {
            return Ok(());
        }
        let (hit, shared) = self.waiter_quotas(claims);
        for i in hit {
            let p = &q.rules.prefixes()[i];
            let max = p.waiters_max.expect("hit only where set");
            if q.waiters[i] >= max {
                return Err(over(QuotaKind::Waiters, &p.prefix, max));
            }
        }
        let reserved = q.rules.waiters_reserved();
        if shared && reserved > 0 {
            let pool = (self.limits.n_waiters_max as u64).saturating_sub(reserved);
            if q.shared_waiters >= pool {
                return Err(over(QuotaKind::SharedWaiters, "", pool));
            }
        }
        Ok(())
    }

    /// Counts a request waiting on `claims` in (queued) or out (granted,
    /// withdrawn or timed out).
    pub(super) fn count_waiter<'a>(
        &mut self,
        claims: impl Iterator<Item = &'a ResourceName>,
        add: bool,
    ) {
        if self.quotas.rules.is_empty() {
            return;
        }
        let (hit, shared) = self.waiter_quotas(claims);
        let q = &mut self.quotas;
        let step = |n: &mut u64| *n = if add { *n + 1 } else { *n - 1 };
        for i in hit {
            step(&mut q.waiters[i]);
        }
        if shared {
            step(&mut q.shared_waiters);
        }
    }

    /// Whether `opener` may open one more session.
    pub(super) fn check_session(&self, opener: Option<&str>) -> Result<(), OverQuota> {
        let q = &self.quotas;
        let Some((p, max)) = opener.and_then(|p| Some((p, q.rules.sessions_max(p)?))) else {
            return Ok(());
        };
        if q.sessions.get(p).copied().unwrap_or(0) >= max {
            return Err(over(QuotaKind::Sessions, p, max));
        }
        Ok(())
    }

    /// Counts a session of `opener` in (opened) or out (ended).
    pub(super) fn count_session(&mut self, opener: Option<&str>, add: bool) {
        let q = &mut self.quotas;
        let Some(p) = opener.filter(|p| q.rules.sessions_max(p).is_some()) else {
            return;
        };
        let n = q.sessions.entry(p.to_owned()).or_default();
        *n = if add { *n + 1 } else { *n - 1 };
        if *n == 0 {
            q.sessions.remove(p);
        }
    }
}

fn over(kind: QuotaKind, scope: &str, limit: u64) -> OverQuota {
    OverQuota {
        kind,
        scope: scope.to_owned(),
        limit,
    }
}
