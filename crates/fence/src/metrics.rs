//! Process-wide counters of fenced-write outcomes, and the log line per write.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{FenceRequest, Outcome};

static COUNTS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
const LABELS: [&str; 9] = [
    "applied",
    "replayed",
    "stale",
    "conflict",
    "cancelled",
    "deleted",
    "missing",
    "generation_used",
    "out_of_order",
];

/// Counts by outcome label since the process started.
pub fn outcome_counts() -> Vec<(&'static str, u64)> {
    LABELS
        .iter()
        .zip(&COUNTS)
        .map(|(l, c)| (*l, c.load(Relaxed)))
        .collect()
}

/// Prometheus text for the counters (`baton_fence_outcomes_total{outcome=...}`).
pub fn render_prometheus() -> String {
    let mut out = String::from("# HELP baton_fence_outcomes_total fenced writes by outcome\n# TYPE baton_fence_outcomes_total counter\n");
    for (label, n) in outcome_counts() {
        out.push_str(&format!(
            "baton_fence_outcomes_total{{outcome=\"{label}\"}} {n}\n"
        ));
    }
    out
}

/// Counts and logs one judged write. Logs carry identities and tokens, never payloads.
pub(crate) fn record(req: &FenceRequest, outcome: &Outcome) {
    let label = outcome.label();
    if let Some(i) = LABELS.iter().position(|l| *l == label) {
        COUNTS[i].fetch_add(1, Relaxed);
    }
    match outcome {
        Outcome::Applied { .. } | Outcome::Replayed { .. } => {
            tracing::debug!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = label, "fenced write")
        }
        _ => {
            tracing::info!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = ?outcome_summary(outcome), "fenced write refused")
        }
    }
}

fn outcome_summary(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Stale { presented, current } => format!("stale: {presented} < {current}"),
        Outcome::Cancelled {
            presented,
            cancelled_at,
        } => format!("cancelled: {presented} <= {cancelled_at}"),
        Outcome::Deleted { presented, floor } => {
            format!("deleted: floor {floor}, presented {presented}")
        }
        other => other.label().to_string(),
    }
}
