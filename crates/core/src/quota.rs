//! Quotas: per name prefix, the most live leases, waiting requests and
//! open watches, and a request rate; per principal, the most sessions.
//!
//! The rules are values: the server reads them from its quota file and
//! hands them to the table ([`crate::LeaseTable::set_quotas`]), which counts
//! what each prefix uses as leases and waiters come and go. Every quota
//! whose prefix starts a name applies to it, so a team's quota bounds its
//! sub-prefixes too. Prefixes are compared byte for byte with canonical
//! (NFC) names. Finding the quotas of a name costs one hash lookup per
//! distinct prefix length, never a scan of the rules.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// What a quota bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Live leases under the prefix (a lease counts until the table drops it).
    Leases,
    /// Waiting acquire requests naming a resource under the prefix.
    Waiters,
    /// Open watches whose prefix lies under the prefix.
    Watches,
    /// Requests per second under the prefix, from everyone.
    Rate,
    /// Requests per second under the prefix, from one principal.
    RatePerPrincipal,
    /// Open sessions of one principal.
    Sessions,
    /// Waiting requests on names under no waiter quota: what `--max-waiters`
    /// leaves after the waiter quotas.
    SharedWaiters,
}

impl QuotaKind {
    /// The key that sets it in the quota file (and names it in metrics).
    pub fn key(self) -> &'static str {
        match self {
            QuotaKind::Leases => "leases",
            QuotaKind::Waiters => "waiters",
            QuotaKind::Watches => "watches",
            QuotaKind::Rate => "rate",
            QuotaKind::RatePerPrincipal => "rate_per_principal",
            QuotaKind::Sessions => "sessions",
            QuotaKind::SharedWaiters => "shared_waiters",
        }
    }
}

/// A request over a quota: which one, whose, and its limit. Refused with
/// nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverQuota {
    /// The quota.
    pub kind: QuotaKind,
    /// The prefix (or, for sessions, the principal) it belongs to; empty
    /// for the shared waiter pool.
    pub scope: String,
    /// Its limit (for a rate, requests per second).
    pub limit: u64,
}

impl fmt::Display for OverQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scope, limit) = (&self.scope, self.limit);
        match self.kind {
            QuotaKind::Leases => write!(f, "over the leases quota of prefix {scope:?}: at most {limit} live leases under it"),
            QuotaKind::Waiters => write!(f, "over the waiters quota of prefix {scope:?}: at most {limit} waiting requests under it"),
            QuotaKind::Watches => write!(f, "over the watches quota of prefix {scope:?}: at most {limit} open watches under it"),
            QuotaKind::Rate => write!(f, "over the rate quota of prefix {scope:?}: at most {limit} requests per second under it"),
            QuotaKind::RatePerPrincipal => write!(f, "over the rate_per_principal quota of prefix {scope:?}: at most {limit} requests per second under it from one principal"),
            QuotaKind::Sessions => write!(f, "over the sessions quota of principal {scope:?}: at most {limit} open sessions"),
            QuotaKind::SharedWaiters => write!(f, "over the shared waiter pool: names under no waiters quota may have at most {limit} waiting requests in all (--max-waiters less the waiters quotas)"),
        }
    }
}

/// A rate: `per_s` requests a second on average, `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Sustained requests per second.
    pub per_s: u32,
    /// Requests allowed at once after a quiet spell (the bucket's size).
    pub burst: u32,
}

/// The quotas of one name prefix; `None` is unbounded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixQuota {
    /// The prefix; every name that starts with it falls under the quota.
    pub prefix: String,
    /// Most live leases.
    pub leases_max: Option<u64>,
    /// Most waiting requests.
    pub waiters_max: Option<u64>,
    /// Most open watches of a prefix under this one.
    pub watches_max: Option<u64>,
    /// Requests per second from everyone.
    pub rate: Option<Rate>,
    /// Requests per second from each principal.
    pub rate_per_principal: Option<Rate>,
}

/// Rules that cannot stand together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)] // variants carry their message
pub enum QuotaRuleError {
    #[error("prefix {0:?} has two quotas; give each prefix one")]
    DuplicatePrefix(String),
    #[error("principal {0:?} has two quotas; give each principal one")]
    DuplicatePrincipal(String),
    #[error("the waiters quotas add up to {n_waiters} (counting each outermost prefix once), above --max-waiters {n_waiters_max}: lower them or raise --max-waiters")]
    WaitersAboveServerLimit { n_waiters: u64, n_waiters_max: u64 },
    #[error("a rate of {0} requests per second is not a rate: it must be at least 1 (set waiters or leases to 0 to close a prefix)")]
    ZeroRate(u32),
}

/// Every quota in force, validated; cheap to match a name against.
#[derive(Clone, Debug, Default)]
pub struct QuotaRules {
    prefixes: Vec<PrefixQuota>,
    by_prefix: HashMap<String, usize>,
    /// Distinct prefix lengths, ascending.
    lengths: Vec<usize>,
    sessions_max: BTreeMap<String, u64>,
    /// What the outermost waiters quotas take out of `--max-waiters`.
    waiters_reserved: u64,
}

impl QuotaRules {
    /// Validates the rules against the server's `n_waiters_max`: each
    /// prefix and principal once, rates of at least 1 a second, and waiters
    /// quotas (each outermost one once: a sub-prefix's waiters count against
    /// the prefix that contains it) that fit in `n_waiters_max`.
    pub fn new(
        prefixes: Vec<PrefixQuota>,
        sessions_max: Vec<(String, u64)>,
        n_waiters_max: u64,
    ) -> Result<Self, QuotaRuleError> {
        let mut by_prefix = HashMap::new();
        for (i, q) in prefixes.iter().enumerate() {
            if by_prefix.insert(q.prefix.clone(), i).is_some() {
                return Err(QuotaRuleError::DuplicatePrefix(q.prefix.clone()));
            }
            for rate in [q.rate, q.rate_per_principal].into_iter().flatten() {
                if rate.per_s == 0 {
                    return Err(QuotaRuleError::ZeroRate(rate.per_s));
                }
            }
        }
        let mut principals = BTreeMap::new();
        for (name, n) in sessions_max {
            if principals.insert(name.clone(), n).is_some() {
                return Err(QuotaRuleError::DuplicatePrincipal(name));
            }
        }
        let mut lengths: Vec<usize> = prefixes.iter().map(|q| q.prefix.len()).collect();
        lengths.sort_unstable();
        lengths.dedup();
        let mut rules = Self {
            prefixes,
            by_prefix,
            lengths,
            sessions_max: principals,
            waiters_reserved: 0,
        };
        let n_waiters: u64 = rules
            .prefixes
            .iter()
            .filter(|q| {
                q.waiters_max.is_some()
                    && !rules.matching(&q.prefix).any(|(_, outer)| {
                        outer.waiters_max.is_some() && outer.prefix.len() < q.prefix.len()
                    })
            })
            .filter_map(|q| q.waiters_max)
            .sum();
        if n_waiters > n_waiters_max {
            return Err(QuotaRuleError::WaitersAboveServerLimit {
                n_waiters,
                n_waiters_max,
            });
        }
        rules.waiters_reserved = n_waiters;
        Ok(rules)
    }

    /// No quota at all: nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty() && self.sessions_max.is_empty()
    }

    /// The prefix quotas, in the order given; indexes are stable until
    /// the rules are replaced.
    pub fn prefixes(&self) -> &[PrefixQuota] {
        &self.prefixes
    }

    /// Every quota whose prefix starts `name`, shortest prefix first, with
    /// its index.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (usize, &'a PrefixQuota)> + 'a {
        self.lengths
            .iter()
            .take_while(move |&&n| n <= name.len())
            .filter_map(move |&n| {
                let i = *self.by_prefix.get(name.get(..n)?)?;
                Some((i, &self.prefixes[i]))
            })
    }

    /// The most sessions `principal` may hold open, if bounded.
    pub fn sessions_max(&self, principal: &str) -> Option<u64> {
        self.sessions_max.get(principal).copied()
    }

    /// The principals with a sessions quota, and it.
    pub fn principals(&self) -> impl Iterator<Item = (&str, u64)> {
        self.sessions_max.iter().map(|(p, n)| (p.as_str(), *n))
    }

    /// The waiters the waiters quotas set apart; names under none share
    /// the rest of the server's limit.
    pub fn waiters_reserved(&self) -> u64 {
        self.waiters_reserved
    }
}

/// A token bucket: up to `burst` requests at once, refilled at `per_s`
/// a second, on the caller's monotonic milliseconds.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// Tokens in thousandths, so that a refill of a few milliseconds counts.
    milli_tokens: u64,
    at_ms: u64,
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub fn full(rate: Rate, now_ms: u64) -> Self {
        Self {
            milli_tokens: u64::from(rate.burst.max(1)) * 1000,
            at_ms: now_ms,
        }
    }

    /// Takes one request's token at `now_ms`, if there is one.
    pub fn take(&mut self, rate: Rate, now_ms: u64) -> bool {
        self.refill(rate, now_ms);
        if self.milli_tokens < 1000 {
            return false;
        }
        self.milli_tokens -= 1000;
        true
    }

    /// Milliseconds from `now_ms` until the bucket holds a token again
    /// (0 if it does).
    pub fn ms_until_token(&mut self, rate: Rate, now_ms: u64) -> u64 {
        self.refill(rate, now_ms);
        let missing = 1000u64.saturating_sub(self.milli_tokens);
        missing.div_ceil(u64::from(rate.per_s.max(1)))
    }

    fn refill(&mut self, rate: Rate, now_ms: u64) {
        let cap = u64::from(rate.burst.max(1)) * 1000;
        let elapsed_ms = now_ms.saturating_sub(self.at_ms);
        self.at_ms = self.at_ms.max(now_ms);
        self.milli_tokens = cap.min(
            self.milli_tokens
                .saturating_add(elapsed_ms.saturating_mul(u64::from(rate.per_s))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(prefix: &str, waiters: Option<u64>) -> PrefixQuota {
        PrefixQuota {
            prefix: prefix.into(),
            waiters_max: waiters,
            ..PrefixQuota::default()
        }
    }

    #[test]
    fn every_prefix_that_starts_a_name_matches_it_and_no_other() {
        let rules = QuotaRules::new(
            vec![
                q("team-a:", None),
                q("team-a:jobs:", None),
                q("team-b:", None),
                q("é", None),
            ],
            vec![],
            100,
        )
        .unwrap();
        let hits: Vec<&str> = rules
            .matching("team-a:jobs:1")
            .map(|(_, q)| q.prefix.as_str())
            .collect();
        assert_eq!(hits, ["team-a:", "team-a:jobs:"]);
        assert_eq!(rules.matching("team-c:x").count(), 0);
        assert_eq!(rules.matching("team-a").count(), 0);
        // A length that falls inside a character is no match, not a panic.
        assert_eq!(rules.matching("éa").count(), 1);
        assert_eq!(rules.matching("\u{10000}").count(), 0);
    }

    #[test]
    fn waiter_quotas_count_each_outermost_prefix_once_against_the_server_limit() {
        let rules = QuotaRules::new(
            vec![q("a:", Some(60)), q("a:b:", Some(50)), q("c:", Some(40))],
            vec![],
            100,
        )
        .unwrap();
        assert_eq!(rules.waiters_reserved(), 100);
        let err =
            QuotaRules::new(vec![q("a:", Some(60)), q("c:", Some(41))], vec![], 100).unwrap_err();
        assert_eq!(
            err,
            QuotaRuleError::WaitersAboveServerLimit {
                n_waiters: 101,
                n_waiters_max: 100
            }
        );
        assert!(err.to_string().contains("--max-waiters 100"));
    }

    #[test]
    fn a_prefix_or_principal_given_twice_is_refused() {
        let err = QuotaRules::new(vec![q("a:", None), q("a:", None)], vec![], 10).unwrap_err();
        assert_eq!(err, QuotaRuleError::DuplicatePrefix("a:".into()));
        let err = QuotaRules::new(vec![], vec![("p".into(), 1), ("p".into(), 2)], 10).unwrap_err();
        assert_eq!(err, QuotaRuleError::DuplicatePrincipal("p".into()));
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let rate = Rate {
            per_s: 10,
            burst: 3,
        };
        let mut b = Bucket::full(rate, 0);
        assert_eq!((0..5).filter(|_| b.take(rate, 0)).count(), 3);
        assert!(
            !b.take(rate, 99),
            "a tenth of a second refills one, not yet"
        );
        assert_eq!(b.ms_until_token(rate, 99), 1);
        assert!(b.take(rate, 100));
        assert!(!b.take(rate, 100));
        assert_eq!(
            (0..10).filter(|_| b.take(rate, 10_000)).count(),
            3,
            "never above the burst"
        );
        assert!(!b.take(rate, 5_000), "time going back refills nothing");
    }
}
