//! What the worker runtime counts, through the `metrics` facade: the
//! application installs the recorder (a Prometheus exporter, say) and the
//! names below appear there; with none installed they cost a no-op.
//!
//! - [`ACQUIRE_SECONDS`]: each acquire request, from send to answer
//!   (time spent waiting in line included), by `outcome` (`granted`,
//!   `not_acquired`, `error`);
//! - [`RENEWAL_FAILURES_TOTAL`]: keeper renewals and session heartbeats
//!   that did not extend ownership, by `reason`;
//! - [`OWNERSHIP_LOSSES_TOTAL`]: leases a keeper gave up, by `reason`
//!   (`deadline_passed`, `not_owner`, `refused`).

use std::time::Duration;

use baton_telemetry::TRACE_TARGET;
use tracing::field::Empty;
use tracing::Span;

use crate::worker::LossReason;
use crate::{AcquiredAll, ClientError};

/// Acquire requests by outcome, with their time from send to answer.
pub const ACQUIRE_SECONDS: &str = "baton_client_acquire_seconds";
/// Renewals (and session heartbeats) that failed, by reason.
pub const RENEWAL_FAILURES_TOTAL: &str = "baton_client_renewal_failures_total";
/// Leases given up by a keeper, by reason.
pub const OWNERSHIP_LOSSES_TOTAL: &str = "baton_client_ownership_losses_total";

/// Describes the runtime's metrics to the installed recorder; call once
/// after installing one.
pub fn describe() {
    metrics::describe_histogram!(
        ACQUIRE_SECONDS,
        metrics::Unit::Seconds,
        "acquire requests from send to answer (waiting in line included), by outcome"
    );
    metrics::describe_counter!(
        RENEWAL_FAILURES_TOTAL,
        "renewals and session heartbeats that did not extend ownership, by reason"
    );
    metrics::describe_counter!(
        OWNERSHIP_LOSSES_TOTAL,
        "leases a keeper gave up (work cancelled), by reason"
    );
    // Every reason at 0 from the start, so that a rate or an increase
    // sees the first failure as a change, not as a new series.
    for reason in RENEWAL_FAILURE_REASONS {
        metrics::counter!(RENEWAL_FAILURES_TOTAL, "reason" => reason).increment(0);
    }
    for reason in LOSS_REASONS {
        metrics::counter!(OWNERSHIP_LOSSES_TOTAL, "reason" => reason).increment(0);
    }
}

/// The `reason` labels of [`RENEWAL_FAILURES_TOTAL`].
const RENEWAL_FAILURE_REASONS: [&str; 5] = [
    "error",
    "not_owner",
    "refused",
    "timeout",
    "heartbeat_refused",
];
/// The `reason` labels of [`OWNERSHIP_LOSSES_TOTAL`].
const LOSS_REASONS: [&str; 3] = ["deadline_passed", "not_owner", "refused"];

/// The client's span of a request for `op` (`acquire`, `renew`,
/// `release`) on `resources`, for OpenTelemetry export (see the
/// `baton-telemetry` crate): the server's span of the request is its child.
pub(crate) fn span(op: &'static str, resources: &[&str]) -> Span {
    match op {
        "acquire" => {
            tracing::debug_span!(target: TRACE_TARGET, "acquire", resource = ?resources, token = Empty, outcome = Empty)
        }
        "renew" => tracing::debug_span!(target: TRACE_TARGET, "renew", resource = ?resources),
        _ => tracing::debug_span!(target: TRACE_TARGET, "release", resource = ?resources),
    }
}

/// An acquire answered (or failed) `took` after it was sent: counted, and
/// recorded on its span.
pub(crate) fn acquired(span: &Span, answer: &Result<AcquiredAll, ClientError>, took: Duration) {
    let outcome = match answer {
        Ok(AcquiredAll::Granted { leases, .. }) => {
            if let Some(l) = leases.first() {
                span.record("token", l.token.get());
            }
            "granted"
        }
        Ok(AcquiredAll::NotAcquired(_)) => "not_acquired",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    metrics::histogram!(ACQUIRE_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
}

/// A renewal or heartbeat that did not extend ownership.
pub(crate) fn renewal_failed(reason: &'static str) {
    metrics::counter!(RENEWAL_FAILURES_TOTAL, "reason" => reason).increment(1);
}

/// A lease a keeper gave up.
pub(crate) fn lost(why: &LossReason) {
    let reason = match why {
        LossReason::DeadlinePassed => LOSS_REASONS[0],
        LossReason::NotOwner => LOSS_REASONS[1],
        LossReason::Refused(_) => LOSS_REASONS[2],
    };
    metrics::counter!(OWNERSHIP_LOSSES_TOTAL, "reason" => reason).increment(1);
}
