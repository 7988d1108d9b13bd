//! Logs and traces of Baton's processes (`baton serve`, `statements
//! worker`): structured logs on stderr as before, and with an OTLP
//! endpoint, OpenTelemetry spans exported over OTLP/HTTP (protobuf) to a
//! collector.
//!
//! Traced spans use the target [`TRACE_TARGET`] at `DEBUG`: the log layer
//! never shows them (its filter is `RUST_LOG`, `info` by default) and the
//! trace layer takes only them, so with no endpoint every span call site
//! is disabled and costs a cached check.
//!
//! A trace crosses processes as a W3C `traceparent`: [`traceparent`]
//! reads the current span's for a request (the client sends it as gRPC
//! metadata, or in a session request), [`adopt`] makes a server span its
//! child. One publication's path (the worker's acquire, the server's
//! acquire and grant, the renewals, the fenced write) is then one trace.
//!
//! Written by hand here: only the wiring of the maintained crates
//! (`opentelemetry-otlp`, `tracing-opentelemetry`) that no crate does for
//! this pair of filters.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

#[cfg(feature = "export")]
mod export;
#[cfg(feature = "export")]
pub use export::{init, Settings, Telemetry, TelemetryError};

/// Makes rustls on ring the process's TLS provider, unless one was set
/// first. Every HTTPS client here (the OTLP exporter, S3, the outbox's
/// webhooks: all `reqwest`) is built on rustls without a crypto library
/// of its own and takes the process's when it is built, so that each
/// binary carries one, ring, as its gRPC and PostgreSQL connections do.
/// Call it before building such a client; [`init`] does. Idempotent, and
/// keeps a provider the application installed before.
pub fn use_ring_for_https() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The target of every traced span (`tracing::debug_span!(target: ...)`).
pub const TRACE_TARGET: &str = "baton::trace";

/// The W3C header (and field) that carries a trace across processes.
pub const TRACEPARENT: &str = "traceparent";

/// An error and its sources on one line, outermost first, each message
/// once (reqwest's and tonic's errors repeat their source's text): what a
/// log line or a refusal says of a transport error.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        source = s.source();
    }
    message
}

/// The current span's W3C `traceparent`, when it is traced (an exporter
/// is installed and the span is sampled); `None` otherwise.
pub fn traceparent() -> Option<String> {
    // Every lease call asks: with no exporter, the span is disabled and
    // this is all it costs.
    let span = tracing::Span::current();
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` the child of the remote span a `traceparent` names; a
/// value that does not parse is ignored (the span starts its own trace).
pub fn adopt(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || span.is_disabled() {
        return;
    }
    let carrier: HashMap<String, String> =
        HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_nothing_is_propagated() {
        let span = tracing::debug_span!(target: TRACE_TARGET, "acquire");
        let _in = span.enter();
        assert_eq!(traceparent(), None);
        adopt(&span, "not a traceparent");
    }
}
