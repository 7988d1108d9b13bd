//! Fenced-write outcomes: emitted through the `metrics` facade as
//! `baton_fence_outcomes_total{outcome="..."}` and the time each judgement
//! took as `baton_fence_write_seconds{outcome="..."}` (install any
//! recorder, such as a Prometheus exporter, and they appear there),
//! tallied in-process for [`outcome_counts`], and logged one line per
//! write.
//!
//! The names, with their help texts, are described once per process by
//! [`describe`].

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

/// Every fenced write judged, by `outcome`.
pub const OUTCOMES_TOTAL: &str = "baton_fence_outcomes_total";
/// The time each judgement took (the fence's round trip on PostgreSQL,
/// its reads and writes inside the transaction on SQLite), by `outcome`.
pub const WRITE_SECONDS: &str = "baton_fence_write_seconds";

/// Outbox outcomes recorded by dispatchers (`outbox_record`), by
/// `outcome`: delivered, accepted, retry, failed, needs_attention,
/// cancelled, or `stale` when a newer claim refused it.
pub const OUTBOX_RECORDS_TOTAL: &str = "baton_outbox_records_total";
const OUTBOX_LABELS: [&str; 9] = [
    "delivered",
    "accepted",
    "retry",
    "failed",
    "needs_attention",
    "cancelled",
    "stale",
    "final",
    "missing",
];

/// Counts one `outbox_record` call by what it recorded or why it was refused.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn outbox_recorded(report: crate::outbox::Report, step: &crate::outbox::Step) {
    let label = match step.outcome {
        crate::outbox::StepOutcome::Recorded => report.label(),
        other => other.label(),
    };
    metrics::counter!(OUTBOX_RECORDS_TOTAL, "outcome" => label).increment(1);
    if label == "needs_attention" {
        tracing::warn!(delivery = ?step.id, "a delivery needs attention: its outcome is unknown and its receiver cannot deduplicate");
    }
}

/// Describes the kit's metrics to the installed recorder (their help
/// texts and units); call once after installing one.
pub fn describe() {
    metrics::describe_counter!(
        OUTCOMES_TOTAL,
        "fenced writes judged at the resource, by outcome (stale: a token older than the resource's)"
    );
    metrics::describe_histogram!(
        WRITE_SECONDS,
        metrics::Unit::Seconds,
        "time to judge a fenced write at the resource, by outcome"
    );
    // Every outcome at 0 from the start, so that a rate or an increase
    // sees the first stale write as a change, not as a new series.
    for label in LABELS {
        metrics::counter!(OUTCOMES_TOTAL, "outcome" => label).increment(0);
    }
    metrics::describe_counter!(
        OUTBOX_RECORDS_TOTAL,
        "outbox delivery outcomes recorded, by outcome (needs_attention: unknown and unrepeatable; stale: a late dispatcher refused)"
    );
    for label in OUTBOX_LABELS {
        metrics::counter!(OUTBOX_RECORDS_TOTAL, "outcome" => label).increment(0);
    }
}

/// One judgement under way: its start, and its span for OpenTelemetry
/// export (`fenced write`, with the resource, token and operation; see the
/// `baton-telemetry` crate), which ends with [`record`].
pub(crate) struct Judging {
    started: std::time::Instant,
    span: tracing::Span,
}

impl Judging {
    pub(crate) fn start(req: &FenceRequest) -> Self {
        Self {
            started: std::time::Instant::now(),
            span: tracing::debug_span!(
                target: baton_telemetry::TRACE_TARGET,
                "fenced write",
                resource = %req.resource,
                token = req.token.get(),
                operation = %req.operation,
                outcome = tracing::field::Empty,
            ),
        }
    }

    /// The judgement's span, to run its statements in.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }
}

/// Counts and logs one judged write and ends its span. Logs carry
/// identities and tokens, never payloads.
pub(crate) fn record(req: &FenceRequest, outcome: &Outcome, judging: Judging) {
    let took = judging.started.elapsed();
    let label = outcome.label();
    judging.span.record("outcome", label);
    if let Some(i) = LABELS.iter().position(|l| *l == label) {
        COUNTS[i].fetch_add(1, Relaxed);
    }
    metrics::counter!(OUTCOMES_TOTAL, "outcome" => label).increment(1);
    metrics::histogram!(WRITE_SECONDS, "outcome" => label).record(took.as_secs_f64());
    match outcome {
        Outcome::Applied { .. } | Outcome::Replayed { .. } => {
            tracing::debug!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = label, "fenced write")
        }
        _ => {
            tracing::info!(resource = %req.resource, token = %req.token, operation = %req.operation, outcome = %outcome.describe(), "fenced write refused")
        }
    }
}
