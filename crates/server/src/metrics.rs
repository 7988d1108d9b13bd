//! Counters and gauges, rendered in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the acquire-latency buckets, in microseconds.
const LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// The server's counters and gauges, rendered for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub(crate) acquire_requests: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) grants_after_wait: AtomicU64,
    pub(crate) not_acquired: AtomicU64,
    pub(crate) wait_timeouts: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) renewals_failed: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) expiries: AtomicU64,
    pub(crate) ownership_transfers: AtomicU64,
    pub(crate) fences: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) leases: AtomicU64,
    pub(crate) waiters: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) connections_closed_idle: AtomicU64,
    pub(crate) connections_evicted: AtomicU64,
    /// 1 once recovery is done and the server grants (`/readyz`).
    pub(crate) ready: std::sync::atomic::AtomicBool,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
}

impl Metrics {
    /// Records the service time of an acquire answered without waiting in line.
    pub(crate) fn observe_acquire_latency_us(&self, us: u64) {
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|b| us <= *b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &AtomicU64); 15] = [
            (
                "baton_acquire_requests_total",
                "acquire requests received",
                &self.acquire_requests,
            ),
            (
                "baton_grants_total",
                "leases granted (one per resource)",
                &self.grants,
            ),
            (
                "baton_grants_after_wait_total",
                "acquire requests granted after waiting in line",
                &self.grants_after_wait,
            ),
            (
                "baton_not_acquired_total",
                "try-once acquire requests refused because a resource was held",
                &self.not_acquired,
            ),
            (
                "baton_wait_timeouts_total",
                "waiting acquire requests whose wait ran out",
                &self.wait_timeouts,
            ),
            (
                "baton_renewals_total",
                "successful renewals",
                &self.renewals,
            ),
            (
                "baton_renewals_failed_total",
                "renewals refused as not owner",
                &self.renewals_failed,
            ),
            (
                "baton_releases_total",
                "leases released by their holder",
                &self.releases,
            ),
            (
                "baton_expiries_total",
                "leases that expired",
                &self.expiries,
            ),
            (
                "baton_ownership_transfers_total",
                "leases handed directly to a waiting request",
                &self.ownership_transfers,
            ),
            (
                "baton_fences_total",
                "operator fence operations",
                &self.fences,
            ),
            (
                "baton_store_commits_total",
                "durable commits of the lease store",
                &self.commits,
            ),
            (
                "baton_connections_refused_total",
                "connections over the limit, answered RESOURCE_EXHAUSTED",
                &self.connections_refused,
            ),
            (
                "baton_connections_closed_idle_total",
                "connections closed for sending no request in time or idling with no request in flight",
                &self.connections_closed_idle,
            ),
            (
                "baton_connections_evicted_total",
                "connections that had not sent a request yet, closed to admit a new one at the limit",
                &self.connections_evicted,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Relaxed)
            );
        }
        let gauges: [(&str, &str, &AtomicU64); 3] = [
            ("baton_leases", "leases currently held", &self.leases),
            (
                "baton_waiters",
                "acquire requests currently waiting",
                &self.waiters,
            ),
            (
                "baton_connections",
                "open client connections",
                &self.connections,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                value.load(Relaxed)
            );
        }
        let name = "baton_acquire_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} service time of acquire requests answered without waiting in line"
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound_us, bucket) in LATENCY_BUCKETS_US.iter().zip(&self.latency_buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                *bound_us as f64 / 1e6
            );
        }
        let count = self.latency_count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.latency_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe_acquire_latency_us(90);
        m.observe_acquire_latency_us(1_500);
        m.observe_acquire_latency_us(5_000_000);
        let text = m.render();
        assert!(
            text.contains("baton_acquire_latency_seconds_bucket{le=\"0.0001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("baton_acquire_latency_seconds_bucket{le=\"0.002\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("baton_acquire_latency_seconds_bucket{le=\"+Inf\"} 3"),
            "{text}"
        );
    }
}
