//! The lease-history checker: what clients were granted, against the
//! three promises of the lease service. One checker for every test that
//! records grants (the crash test, the cluster's leader kills), so that
//! they all mean the same by "safe".
//!
//! A grant is recorded with the instant its request was sent and the
//! instant its answer arrived, on the test's monotonic clock, and, when
//! known, the earliest instant its lease could have ended: when its release
//! was sent, or, for a lease left to expire (a holder that crashed or
//! abandoned it), the send time of the request that last extended it plus
//! its TTL (the server counted the TTL from no earlier than that).
//!
//! The promises:
//! - **no token twice**: every grant carries a token no other grant has;
//! - **tokens follow real time**: per resource, a grant answered before
//!   another was asked for carries the lower token;
//! - **one holder at a time**: per resource, in token order, a grant is
//!   answered no earlier than the earliest instant the grant before it
//!   could have ended.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// One grant as a client saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The resource.
    pub resource: String,
    /// Its token.
    pub token: u64,
    /// When the acquire was sent.
    pub invoked: Instant,
    /// When its answer arrived.
    pub answered: Instant,
    /// The earliest instant the lease could have ended, if known (see the
    /// module docs); a grant without one is not checked against the next.
    pub earliest_end: Option<Instant>,
}

/// What the checker found; every list empty means the history is safe.
#[derive(Clone, Debug, Default)]
pub struct GrantVerdict {
    /// Tokens granted more than once.
    pub reissued: Vec<u64>,
    /// `(resource, earlier, later)`: `earlier` was answered before `later`
    /// was asked for, yet its token is not lower.
    pub out_of_order: Vec<(String, u64, u64)>,
    /// `(resource, before, after, by)`: `after` was granted `by` before
    /// `before`'s lease could have ended.
    pub overlapping: Vec<(String, u64, u64, Duration)>,
    /// Grants checked against the one after them for exclusion.
    pub exclusion_checked: usize,
}

impl GrantVerdict {
    /// Whether every promise held.
    pub fn is_safe(&self) -> bool {
        self.reissued.is_empty() && self.out_of_order.is_empty() && self.overlapping.is_empty()
    }
}

/// Checks `grants` against the three promises.
pub fn check(grants: &[Grant]) -> GrantVerdict {
    let mut verdict = GrantVerdict::default();
    let mut seen = HashSet::new();
    for g in grants {
        if !seen.insert(g.token) {
            verdict.reissued.push(g.token);
        }
    }
    let mut by_resource: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        by_resource.entry(&g.resource).or_default().push(g);
    }
    for (resource, mut held) in by_resource {
        held.sort_by_key(|g| g.token);
        // Real time: from the highest token down, a grant asked for after
        // the earliest answer among the higher tokens is out of order.
        let mut earliest_answer_above: Option<(Instant, u64)> = None;
        for g in held.iter().rev() {
            if let Some((answered, token)) = earliest_answer_above {
                if answered < g.invoked {
                    verdict
                        .out_of_order
                        .push((resource.to_string(), token, g.token));
                }
            }
            if earliest_answer_above.is_none_or(|(a, _)| g.answered < a) {
                earliest_answer_above = Some((g.answered, g.token));
            }
        }
        for pair in held.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let Some(end) = before.earliest_end else {
                continue;
            };
            verdict.exclusion_checked += 1;
            if after.answered < end {
                verdict.overlapping.push((
                    resource.to_string(),
                    before.token,
                    after.token,
                    end - after.answered,
                ));
            }
        }
    }
    verdict
}

/// The most grants of one resource whose leases were certainly held at
/// the same instant: each from its answer until the earliest instant it
/// could have ended (a grant without one is not counted). For a semaphore
/// of N permits it must never be above N; a test that means to prove that
/// must also see it reach N, or it proved nothing.
pub fn max_concurrent(grants: &[Grant]) -> BTreeMap<String, usize> {
    let mut edges: BTreeMap<&str, Vec<(Instant, i32)>> = BTreeMap::new();
    for g in grants {
        let Some(end) = g.earliest_end.filter(|end| *end > g.answered) else {
            continue;
        };
        let e = edges.entry(&g.resource).or_default();
        e.push((g.answered, 1));
        e.push((end, -1));
    }
    edges
        .into_iter()
        .map(|(resource, mut e)| {
            // An end at the same instant as a start comes first: the two
            // were not held together.
            e.sort();
            let (mut now, mut most) = (0i32, 0i32);
            for (_, step) in e {
                now += step;
                most = most.max(now);
            }
            (resource.to_string(), most as usize)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn grant(t0: Instant, token: u64, invoked: u64, answered: u64, end: Option<u64>) -> Grant {
        Grant {
            resource: "r".into(),
            token,
            invoked: at(t0, invoked),
            answered: at(t0, answered),
            earliest_end: end.map(|e| at(t0, e)),
        }
    }

    #[test]
    fn a_clean_history_is_safe() {
        let t0 = Instant::now();
        let v = check(&[grant(t0, 1, 0, 5, Some(100)), grant(t0, 2, 50, 120, None)]);
        assert!(v.is_safe(), "{v:?}");
        assert_eq!(v.exclusion_checked, 1);
    }

    #[test]
    fn each_broken_promise_is_reported() {
        let t0 = Instant::now();
        // Token 7 twice.
        let v = check(&[grant(t0, 7, 0, 5, None), grant(t0, 7, 10, 15, None)]);
        assert_eq!(v.reissued, [7]);
        // Token 9 was answered before token 8 was asked for.
        let v = check(&[grant(t0, 9, 0, 5, None), grant(t0, 8, 10, 15, None)]);
        assert_eq!(v.out_of_order, [("r".to_string(), 9, 8)]);
        // Token 2 granted 30 ms before token 1's lease could have ended.
        let v = check(&[grant(t0, 1, 0, 5, Some(100)), grant(t0, 2, 20, 70, None)]);
        assert_eq!(
            v.overlapping,
            [("r".to_string(), 1, 2, Duration::from_millis(30))]
        );
        assert!(!v.is_safe());
    }

    #[test]
    fn concurrent_holders_are_counted_per_resource() {
        let t0 = Instant::now();
        let mut other = grant(t0, 9, 0, 10, Some(100));
        other.resource = "s".into();
        let held = [
            grant(t0, 1, 0, 10, Some(100)),
            grant(t0, 2, 0, 20, Some(50)),
            // Starts as the second ends: not together.
            grant(t0, 3, 0, 50, Some(90)),
            grant(t0, 4, 0, 60, None),
            other,
        ];
        let most = max_concurrent(&held);
        assert_eq!(most["r"], 2);
        assert_eq!(most["s"], 1);
    }

    #[test]
    fn grants_on_other_resources_never_conflict() {
        let t0 = Instant::now();
        let mut other = grant(t0, 2, 20, 30, None);
        other.resource = "s".into();
        let v = check(&[grant(t0, 1, 0, 5, Some(100)), other]);
        assert!(v.is_safe(), "{v:?}");
    }
}
