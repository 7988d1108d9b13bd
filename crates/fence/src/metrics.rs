//! Fenced-write outcomes: emitted through the `metrics` facade as
//! `baton_fence_outcomes_total{outcome="..."}` (install any recorder, such
//! as a Prometheus exporter, and they appear there), tallied in-process for
//! [`outcome_counts`], and logged one line per write.

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

/// Counts and logs one judged write. Logs carry identities and tokens, never payloads.
pub(crate) fn record(req: &FenceRequest, outcome: &Outcome) {
    let label = outcome.label();
    if let Some(i) = LABELS.iter().position(|l| *l == label) {
        COUNTS[i].fetch_add(1, Relaxed);
    }
    metrics::counter!("baton_fence_outcomes_total", "outcome" => label).increment(1);
    match outcome {
        Outcome::Applied { .. } | Outcome::Replayed { .. } => {
            tracing::debug!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = label, "fenced write")
        }
        _ => {
            tracing::info!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = %outcome.describe(), "fenced write refused")
        }
    }
}
