//! `init`: the log layer and, with an OTLP endpoint, the trace layer.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
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
    let client = Reporting::new(&endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(&endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(client)
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

/// How long one export may take: OTLP's default.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's HTTP client (the one it builds by default), logging why
/// an export failed: the exporter itself says only "network error" and
/// keeps the cause for a debug event. Once per run of failures, the URL
/// and the cause's chain at `warn`; at `info` when the collector answers
/// again.
#[derive(Debug)]
struct Reporting {
    client: reqwest::blocking::Client,
    url: String,
    failing: AtomicBool,
}

impl Reporting {
    fn new(url: &str) -> Result<Self, TelemetryError> {
        let refused = |e: &dyn std::fmt::Display| {
            TelemetryError(format!("--otlp-endpoint {url}: its HTTP client: {e}"))
        };
        // As the exporter does: a blocking client is built off any async
        // runtime the caller may be on.
        let client = std::thread::spawn(|| {
            reqwest::blocking::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .build()
        })
        .join()
        .map_err(|_| refused(&"its thread panicked"))?
        .map_err(|e| refused(&e))?;
        Ok(Self {
            client,
            url: url.to_string(),
            failing: AtomicBool::new(false),
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for Reporting {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let sent = self.client.send_bytes(request).await;
        let failure = match &sent {
            Ok(answer) if answer.status().is_success() => None,
            Ok(answer) => Some(format!("the collector answered {}", answer.status())),
            Err(e) => Some(crate::error_chain(e.as_ref())),
        };
        match failure {
            Some(why) if !self.failing.swap(true, Relaxed) => tracing::warn!(
                "OTLP export to {} failed: {why}; spans are dropped until it succeeds",
                self.url
            ),
            None if self.failing.swap(false, Relaxed) => {
                tracing::info!("OTLP export to {} succeeds again", self.url)
            }
            _ => {}
        }
        sent
    }
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

    /// A refused connection is named with its URL and its cause, not as
    /// "network error".
    #[test]
    fn a_failed_send_names_the_url_and_the_cause() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", closed.local_addr().unwrap());
        drop(closed);
        crate::use_ring_for_https();
        let client = Reporting::new(&url).unwrap();
        let request = Request::post(&url).body(Bytes::new()).unwrap();
        // The blocking client's send is done when first polled, as the
        // exporter's thread polls it.
        let mut send = std::pin::pin!(client.send_bytes(request));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(sent) = std::future::Future::poll(send.as_mut(), &mut cx) else {
            panic!("the blocking client's send was not done at once");
        };
        let e = sent.unwrap_err();
        let text = crate::error_chain(e.as_ref());
        assert!(text.contains(&url), "{text}");
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
        assert!(client.failing.load(Relaxed));
    }

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
