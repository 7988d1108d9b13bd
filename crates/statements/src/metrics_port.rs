//! `statements worker|dispatch --metrics-listen ADDR`: the process's metrics in the
//! Prometheus text format at `http://ADDR/metrics`. The fence kit and the
//! client's worker runtime emit through the `metrics` facade; this
//! process installs the exporter's recorder (no listener of its own: the
//! port is served here with axum) and adds `baton_build_info`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Histogram buckets, in seconds, for every `_seconds` histogram here
/// (fenced writes take a millisecond or so, an acquire may wait seconds).
const BUCKETS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];
/// How often the recorder drains its histogram samples.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the recorder and serves `/metrics` on `listen` for the life of
/// the process; returns the bound address.
pub async fn serve(listen: SocketAddr, process: &'static str) -> anyhow::Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&BUCKETS_S)
        .context("the histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    baton_fence::metrics::describe();
    baton_client::observe::describe();
    metrics::describe_gauge!(
        "baton_build_info",
        "the build of this process (always 1; the labels say which)"
    );
    metrics::gauge!(
        "baton_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "process" => process
    )
    .set(1.0);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding --metrics-listen {listen}"))?;
    let bound = listener.local_addr().context("the metrics address")?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics port stopped");
        }
    });
    Ok(bound)
}
