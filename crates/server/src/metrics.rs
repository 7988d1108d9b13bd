//! The server's counters, gauges and acquire-latency histogram, in a
//! prometheus-client registry of their own (one per server, so servers
//! embedded in one process do not mix), rendered for `/metrics`; and the
//! arithmetic of the page's headline figures ([`Totals`], [`Figures`]),
//! whose series is kept with the page's other state (`observed.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::quota::Quotas;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Upper bounds of the acquire-latency buckets, in seconds.
const LATENCY_BUCKETS_S: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The server's counters and gauges, rendered for `/metrics`.
pub struct Metrics {
    registry: Registry,
    pub(crate) acquire_requests: Counter,
    pub(crate) grants: Counter,
    pub(crate) grants_after_wait: Counter,
    pub(crate) not_acquired: Counter,
    pub(crate) wait_timeouts: Counter,
    pub(crate) renewals: Counter,
    pub(crate) renewals_failed: Counter,
    pub(crate) releases: Counter,
    pub(crate) expiries: Counter,
    pub(crate) expiries_deferred: Counter,
    pub(crate) ownership_transfers: Counter,
    pub(crate) fences: Counter,
    pub(crate) commits: Counter,
    pub(crate) store_errors: Counter,
    pub(crate) leader_changes: Counter,
    pub(crate) connections_refused: Counter,
    pub(crate) auth_refused: Counter,
    pub(crate) connections_closed_idle: Counter,
    pub(crate) connections_evicted: Counter,
    pub(crate) session_expiries: Counter,
    pub(crate) sessions: Gauge,
    pub(crate) leases: Gauge,
    pub(crate) waiters: Gauge,
    /// Open connections; the connection limit reads it too.
    pub(crate) connections: Gauge,
    pub(crate) leader_term: Gauge,
    pub(crate) is_leader: Gauge,
    pub(crate) store_fold_backlog: Gauge,
    pub(crate) commit_queue_writes: Gauge,
    pub(crate) leases_ending: Gauge,
    acquire_latency_s: Histogram,
    commit_latency_s: Histogram,
    /// The same observations, counted per bucket for the page's p99
    /// (prometheus-client does not expose its buckets).
    acquire_buckets: Buckets,
    commit_buckets: Buckets,
    /// Filled from the quotas in force when rendered (`quota.rs`).
    quota_use: Family<QuotaLabels, Gauge>,
    quota_limit: Family<QuotaLabels, Gauge>,
    quota_refusals: Family<QuotaLabels, Counter>,
    quota_sources: Mutex<QuotaSources>,
}

/// `kind` (the quota file's key) and `scope` (its prefix or principal).
type QuotaLabels = Vec<(&'static str, String)>;

fn set_quota(family: &Family<QuotaLabels, Gauge>, kind: &'static str, scope: &str, n: u64) {
    family
        .get_or_create(&quota_labels(kind, scope))
        .set(n as i64);
}

fn quota_labels(kind: &'static str, scope: &str) -> QuotaLabels {
    vec![("kind", kind.to_owned()), ("scope", scope.to_owned())]
}

/// What the table of the engine in office has counted: per prefix quota,
/// the shared waiter pool, per principal's sessions. `None` when no
/// engine is in office (a follower).
pub(crate) type QuotaUseRead =
    Box<dyn Fn() -> Option<(Vec<baton_core::QuotaUse>, u64, Vec<(String, u64)>)> + Send + Sync>;

#[derive(Default)]
struct QuotaSources {
    quotas: Option<Arc<Quotas>>,
    table: Option<QuotaUseRead>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            // prometheus-client appends `_total` to counter names.
            registry.register(name, help, c.clone());
            c
        };
        let acquire_requests = counter("baton_acquire_requests", "acquire requests received");
        let grants = counter("baton_grants", "leases granted (one per resource)");
        let grants_after_wait = counter(
            "baton_grants_after_wait",
            "acquire requests granted after waiting in line",
        );
        let not_acquired = counter(
            "baton_not_acquired",
            "try-once acquire requests refused because a resource was held",
        );
        let wait_timeouts = counter(
            "baton_wait_timeouts",
            "waiting acquire requests whose wait ran out",
        );
        let renewals = counter("baton_renewals", "successful renewals");
        let renewals_failed = counter("baton_renewals_failed", "renewals refused as not owner");
        let releases = counter("baton_releases", "leases released by their holder");
        let expiries = counter("baton_expiries", "leases that expired");
        let expiries_deferred = counter(
            "baton_expiries_deferred",
            "expired leases a step left to later bounded steps (gone already; dropped from the table after)",
        );
        let ownership_transfers = counter(
            "baton_ownership_transfers",
            "hand-offs of a resource to a waiter",
        );
        let fences = counter("baton_fences", "operator fences");
        let commits = counter("baton_store_commits", "durable commits of the lease store");
        let store_errors = counter(
            "baton_store_errors",
            "failed store commits (each ends the engine: a single server stops, a cluster leader steps down)",
        );
        let leader_changes = counter(
            "baton_leader_changes",
            "leadership terms this server started (clusters only)",
        );
        let connections_refused = counter(
            "baton_connections_refused",
            "connections over the limit, answered RESOURCE_EXHAUSTED",
        );
        let auth_refused = counter(
            "baton_auth_refused",
            "calls refused UNAUTHENTICATED or PERMISSION_DENIED (each also has an audit line)",
        );
        let connections_closed_idle = counter(
            "baton_connections_closed_idle",
            "connections closed for sending no request in time or idling with no request in flight",
        );
        let connections_evicted = counter(
            "baton_connections_evicted",
            "connections that had not sent a request yet, closed to admit a new one at the limit",
        );
        let session_expiries = counter(
            "baton_session_expiries",
            "sessions that ran out without a heartbeat (their leases expired with them)",
        );
        let mut gauge = |name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let leases = gauge("baton_leases", "leases currently held");
        let waiters = gauge("baton_waiters", "acquire requests currently waiting");
        let sessions = gauge("baton_sessions", "sessions currently open");
        let connections = gauge("baton_connections", "open client connections");
        let leader_term = gauge(
            "baton_leader_term",
            "the leadership term this server last saw (clusters; 0 for a single server)",
        );
        let is_leader = gauge(
            "baton_is_leader",
            "1 while this server leads and answers lease requests",
        );
        let store_fold_backlog = gauge(
            "baton_store_fold_backlog",
            "keys in the store's frozen log not yet folded into its file, after the last commit (0 with no fold running; growing across log switches: the fold cannot keep up)",
        );
        let leases_ending = gauge(
            "baton_leases_ending",
            "leases that ended (their deadline came, or their session ended) and are gone for every caller, not yet dropped from the table with their deletion and event (0 but for a mass expiry or a big session's end)",
        );
        let commit_queue_writes = gauge(
            "baton_commit_queue_writes",
            "writes handed to the store's committer and not yet committed (above a few thousand: commits are behind, and expired leases are dropped more slowly until they catch up)",
        );
        registry.register(
            "baton_build",
            "the build of this process (always 1; the labels say which)",
            prometheus_client::metrics::info::Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("process", "baton serve"),
            ]),
        );
        let commit_latency_s = Histogram::new(LATENCY_BUCKETS_S);
        registry.register(
            "baton_store_commit_latency_seconds",
            "time of each durable commit of the lease store",
            commit_latency_s.clone(),
        );
        let acquire_latency_s = Histogram::new(LATENCY_BUCKETS_S);
        registry.register(
            "baton_acquire_latency_seconds",
            "service time of acquire requests answered without waiting in line, unary calls and session requests alike",
            acquire_latency_s.clone(),
        );
        let quota_use = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "baton_quota_use",
            "what each quota bounds is using now (kind: leases, waiters, watches, sessions, shared_waiters; scope: its prefix or principal)",
            quota_use.clone(),
        );
        let quota_limit = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "baton_quota_limit",
            "each quota's limit in the quota file in force (rates in requests per second)",
            quota_limit.clone(),
        );
        let quota_refusals = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "baton_quota_refusals",
            "requests refused RESOURCE_EXHAUSTED by a quota, per quota",
            quota_refusals.clone(),
        );
        Self {
            registry,
            acquire_requests,
            grants,
            grants_after_wait,
            not_acquired,
            wait_timeouts,
            renewals,
            renewals_failed,
            releases,
            expiries,
            expiries_deferred,
            ownership_transfers,
            fences,
            commits,
            store_errors,
            leader_changes,
            connections_refused,
            auth_refused,
            connections_closed_idle,
            connections_evicted,
            session_expiries,
            sessions,
            leases,
            waiters,
            connections,
            leader_term,
            is_leader,
            store_fold_backlog,
            commit_queue_writes,
            leases_ending,
            acquire_latency_s,
            commit_latency_s,
            acquire_buckets: Buckets::default(),
            commit_buckets: Buckets::default(),
            quota_use,
            quota_limit,
            quota_refusals,
            quota_sources: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Records the service time of an acquire answered without waiting in line.
    pub(crate) fn observe_acquire_latency_us(&self, us: u64) {
        self.acquire_latency_s.observe(us as f64 / 1e6);
        self.acquire_buckets.observe_us(us);
    }

    /// Records the time of one store commit.
    pub(crate) fn observe_commit_latency_us(&self, us: u64) {
        self.commit_latency_s.observe(us as f64 / 1e6);
        self.commit_buckets.observe_us(us);
    }

    /// The running totals the page's figures are differences of.
    pub(crate) fn totals(&self) -> Totals {
        Totals {
            grants: self.grants.get(),
            hand_offs: self.ownership_transfers.get(),
            expiries: self.expiries.get(),
            fences: self.fences.get(),
            acquire: self.acquire_buckets.counts(),
            commit: self.commit_buckets.counts(),
        }
    }

    /// The quota file whose limits, watches and refusals `/metrics` shows.
    pub(crate) fn watch_quotas(&self, quotas: Arc<Quotas>) {
        lock(&self.quota_sources).quotas = Some(quotas);
    }

    /// How `/metrics` reads the table's quota counts: set by each engine
    /// as it takes office.
    pub(crate) fn read_quota_use(&self, read: QuotaUseRead) {
        lock(&self.quota_sources).table = Some(read);
    }

    /// Sets the quota families from their sources, just before rendering.
    fn fill_quotas(&self) {
        let sources = lock(&self.quota_sources);
        let Some(quotas) = sources.quotas.as_ref().filter(|q| q.is_on()) else {
            return;
        };
        let rules = quotas.rules();
        self.quota_use.clear();
        self.quota_limit.clear();
        let watches = quotas.watch_use();
        for (i, q) in rules.prefixes().iter().enumerate() {
            let bounds = [
                ("leases", q.leases_max),
                ("waiters", q.waiters_max),
                ("watches", q.watches_max),
                ("rate", q.rate.map(|r| u64::from(r.per_s))),
                (
                    "rate_per_principal",
                    q.rate_per_principal.map(|r| u64::from(r.per_s)),
                ),
            ];
            for (kind, max) in bounds {
                if let Some(max) = max {
                    set_quota(&self.quota_limit, kind, &q.prefix, max);
                }
            }
            if q.watches_max.is_some() {
                let n = watches.get(i).copied().unwrap_or(0);
                set_quota(&self.quota_use, "watches", &q.prefix, n);
            }
        }
        for (principal, max) in rules.principals() {
            set_quota(&self.quota_limit, "sessions", principal, max);
        }
        if let Some(counted) = sources.table.as_ref().and_then(|read| read()) {
            self.fill_table_use(&rules, counted);
        }
        for (kind, scope, n) in quotas.refusals() {
            let c = self
                .quota_refusals
                .get_or_create(&quota_labels(kind.key(), &scope));
            c.inc_by(n.saturating_sub(c.get()));
        }
    }

    /// The table's counts: leases and waiters per prefix, the shared
    /// waiter pool, sessions per principal.
    fn fill_table_use(
        &self,
        rules: &baton_core::quota::QuotaRules,
        (table, shared, sessions): (Vec<baton_core::QuotaUse>, u64, Vec<(String, u64)>),
    ) {
        for (u, q) in table.iter().zip(rules.prefixes()) {
            if u.prefix != q.prefix {
                continue; // the engine has not taken this reload yet
            }
            if q.leases_max.is_some() {
                set_quota(&self.quota_use, "leases", &q.prefix, u.n_leases);
            }
            if q.waiters_max.is_some() {
                set_quota(&self.quota_use, "waiters", &q.prefix, u.n_waiters);
            }
        }
        if rules.waiters_reserved() > 0 {
            set_quota(&self.quota_use, "shared_waiters", "", shared);
        }
        for (principal, n) in sessions {
            set_quota(&self.quota_use, "sessions", &principal, n);
        }
    }

    /// The text exposition of every metric (OpenMetrics, which Prometheus reads).
    pub fn render(&self) -> String {
        self.fill_quotas();
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Latency observations per bucket of [`LATENCY_BUCKETS_S`] (the last
/// slot counts those above the largest bound).
#[derive(Default)]
struct Buckets([AtomicU64; LATENCY_BUCKETS_S.len() + 1]);

impl Buckets {
    fn observe_us(&self, us: u64) {
        let s = us as f64 / 1e6;
        let i = LATENCY_BUCKETS_S
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self) -> [u64; LATENCY_BUCKETS_S.len() + 1] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// Running totals at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Totals {
    grants: u64,
    hand_offs: u64,
    expiries: u64,
    fences: u64,
    acquire: [u64; LATENCY_BUCKETS_S.len() + 1],
    commit: [u64; LATENCY_BUCKETS_S.len() + 1],
}

/// One point of the page's series: rates over the last interval, and the
/// 99th percentile of the latencies observed in it (the upper bound of
/// the bucket it falls in; `None` with no observation, and the largest
/// bound doubled for one above every bucket).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Figures {
    pub grants_per_s: f64,
    pub hand_offs_per_s: f64,
    pub expiries_per_s: f64,
    pub fences_per_s: f64,
    pub acquire_p99_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
}

impl Figures {
    /// What happened between the totals `a` and `b`, `elapsed_ms` apart.
    pub(crate) fn between(a: &Totals, b: &Totals, elapsed_ms: u64) -> Self {
        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 * 1000.0 / elapsed_ms as f64;
        Self {
            grants_per_s: rate(a.grants, b.grants),
            hand_offs_per_s: rate(a.hand_offs, b.hand_offs),
            expiries_per_s: rate(a.expiries, b.expiries),
            fences_per_s: rate(a.fences, b.fences),
            acquire_p99_ms: p99_ms(&a.acquire, &b.acquire),
            commit_p99_ms: p99_ms(&a.commit, &b.commit),
        }
    }
}

/// The 99th percentile of the observations between two bucket counts.
fn p99_ms(a: &[u64], b: &[u64]) -> Option<f64> {
    let counts: Vec<u64> = a.iter().zip(b).map(|(x, y)| y.saturating_sub(*x)).collect();
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return None;
    }
    // The smallest bucket holding at least 99% of the observations.
    let rank = n - n / 100;
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            let bound_s = LATENCY_BUCKETS_S
                .get(i)
                .copied()
                .unwrap_or(LATENCY_BUCKETS_S[LATENCY_BUCKETS_S.len() - 1] * 2.0);
            return Some(bound_s * 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histogram_buckets_render_under_their_names() {
        let m = Metrics::default();
        m.grants.inc();
        m.leases.set(3);
        m.observe_acquire_latency_us(90);
        m.observe_acquire_latency_us(1_500);
        m.observe_acquire_latency_us(5_000_000);
        let text = m.render();
        for line in [
            "baton_grants_total 1",
            "baton_leases 3",
            "baton_acquire_latency_seconds_bucket{le=\"0.0001\"} 1",
            "baton_acquire_latency_seconds_bucket{le=\"0.002\"} 2",
            "baton_acquire_latency_seconds_bucket{le=\"+Inf\"} 3",
            "baton_acquire_latency_seconds_count 3",
            "baton_build_info{version=\"",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
