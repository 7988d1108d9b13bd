//! `init`: the log layer and, with an OTLP endpoint, the trace layer.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::TRACE_TARGET;

/// Why telemetry could not start.
#[derive(Debug)]
pub struct TelemetryError(String);

impl std::fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TelemetryError {}

/// Flushes and stops the trace exporter when dropped (at the end of
/// `main`): spans still in the batch are sent.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Where and how this process logs and traces.
pub struct Settings<'a> {
    /// The `service.name` of every span.
    pub service: &'static str,
    /// The log filter when `RUST_LOG` is unset, like `info`.
    pub default_filter: &'a str,
    /// Colours in the log lines.
    pub ansi: bool,
    /// An OTLP/HTTP collector, like `http://127.0.0.1:4318`; spans go to
    /// its `/v1/traces`. `None`: no traces.
    pub otlp_endpoint: Option<&'a str>,
}

/// Installs the log layer and, with an endpoint, the trace layer, as the
/// process's global subscriber.
pub fn init(s: &Settings<'_>) -> Result<Telemetry, TelemetryError> {
    crate::use_ring_for_https();
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(s.default_filter))
        .add_directive(
            format!("{TRACE_TARGET}=off")
                .parse()
                .expect("a literal directive"),
        );
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(s.ansi)
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let Some(endpoint) = s.otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let endpoint = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(&endpoint)
        .build()
        .map_err(|e| TelemetryError(format!("--otlp-endpoint {endpoint}: {e}")))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(s.service)
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(s.service))
        .with_filter(Targets::new().with_target(TRACE_TARGET, tracing::Level::DEBUG));
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The collector's traces URL: `ENDPOINT/v1/traces`, as OTLP/HTTP names it.
fn traces_url(endpoint: &str) -> Result<String, TelemetryError> {
    let base = endpoint.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://"))
        || base.len() <= "https://".len()
    {
        return Err(TelemetryError(format!(
            "--otlp-endpoint {endpoint:?}: write the collector's OTLP/HTTP address, like http://127.0.0.1:4318"
        )));
    }
    Ok(if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_a_url_and_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").unwrap(),
            "http://c:4318/v1/traces"
        );
        for bad in ["127.0.0.1:4318", "", "http://", "ftp://x"] {
            assert!(
                traces_url(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("OTLP/HTTP address"),
                "{bad}"
            );
        }
    }
}
