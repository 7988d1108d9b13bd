//! The server's counters, gauges and acquire-latency histogram, in a
//! prometheus-client registry of their own (one per server, so servers
//! embedded in one process do not mix), rendered for `/metrics`.

use std::sync::atomic::AtomicBool;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
    acquire_latency_s: Histogram,
    commit_latency_s: Histogram,
    /// True once recovery is done and the server grants (`/readyz`).
    pub(crate) ready: AtomicBool,
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
        let commit_latency_s = Histogram::new(LATENCY_BUCKETS_S);
        registry.register(
            "baton_store_commit_latency_seconds",
            "time of each durable commit of the lease store",
            commit_latency_s.clone(),
        );
        let acquire_latency_s = Histogram::new(LATENCY_BUCKETS_S);
        registry.register(
            "baton_acquire_latency_seconds",
            "service time of acquire requests answered without waiting in line",
            acquire_latency_s.clone(),
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
            acquire_latency_s,
            commit_latency_s,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Records the service time of an acquire answered without waiting in line.
    pub(crate) fn observe_acquire_latency_us(&self, us: u64) {
        self.acquire_latency_s.observe(us as f64 / 1e6);
    }

    /// Records the time of one store commit.
    pub(crate) fn observe_commit_latency_us(&self, us: u64) {
        self.commit_latency_s.observe(us as f64 / 1e6);
    }

    /// The text exposition of every metric (OpenMetrics, which Prometheus reads).
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
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
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
