//! Spans of the lease path for OpenTelemetry export (see the
//! `baton-telemetry` crate): `acquire` (with a `grant` child per lease
//! granted), `renew` and `release`, each carrying the resource and the
//! token, and joined to the client's trace when the request names one (the
//! `traceparent` metadata of a unary call, the field of a session
//! request). With no exporter the spans are disabled and cost a check.

use baton_proto::v1;
use baton_telemetry::TRACE_TARGET;
use tracing::field::Empty;
use tracing::Span;

use crate::engine::AcquireReply;

/// The span of a request for `op` (`acquire`, `renew`, `release`) on
/// `resources`, child of the client's span `traceparent` if given.
pub(super) fn request_span(op: &'static str, resources: &[String], traceparent: &str) -> Span {
    let span = match op {
        "acquire" => {
            tracing::debug_span!(target: TRACE_TARGET, "acquire", resource = ?resources, token = Empty, outcome = Empty)
        }
        "renew" => {
            tracing::debug_span!(target: TRACE_TARGET, "renew", resource = ?resources, token = Empty, outcome = Empty)
        }
        _ => {
            tracing::debug_span!(target: TRACE_TARGET, "release", resource = ?resources, token = Empty, outcome = Empty)
        }
    };
    baton_telemetry::adopt(&span, traceparent);
    span
}

/// The `traceparent` metadata entry of a unary call, if any.
pub(super) fn traceparent_of(metadata: &tonic::metadata::MetadataMap) -> &str {
    metadata
        .get(baton_telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Records an acquire's outcome on its span, with a `grant` span per lease.
pub(super) fn acquired(span: &Span, reply: &AcquireReply) {
    if span.is_disabled() {
        return;
    }
    match reply {
        AcquireReply::Granted { grants, after_wait } => {
            span.record(
                "outcome",
                if *after_wait { "handed_off" } else { "granted" },
            );
            for g in grants {
                span.record("token", g.token.get());
                tracing::debug_span!(target: TRACE_TARGET, parent: span, "grant", resource = %g.resource, token = g.token.get(), after_wait = *after_wait, waited_ms = g.waited_ms)
                    .in_scope(|| {});
            }
        }
        AcquireReply::Repeated(grants) => {
            span.record("outcome", "repeated");
            for g in grants {
                span.record("token", g.token.get());
            }
        }
        AcquireReply::NotAcquired(_) => {
            span.record("outcome", "not_acquired");
        }
        AcquireReply::Ended => {
            span.record("outcome", "ended");
        }
        AcquireReply::TimedOut(_) => {
            span.record("outcome", "timed_out");
        }
        AcquireReply::SessionEnded => {
            span.record("outcome", "session_ended");
        }
    }
}

/// Records a renewal's outcome on its span.
pub(super) fn renewed(span: &Span, out: &v1::RenewResponse) {
    span.record("outcome", if out.renewed { "renewed" } else { "not_owner" });
    if out.renewed {
        span.record("token", out.token);
    }
}

/// Records a release's outcome on its span.
pub(super) fn released(span: &Span, out: &v1::ReleaseResponse) {
    span.record(
        "outcome",
        if out.released {
            "released"
        } else {
            "not_owner"
        },
    );
    if out.released {
        span.record("token", out.token);
    }
}
