//! The HTTP port: `GET /healthz` (alive), `GET /readyz` (recovered and
//! granting) and `GET /metrics`, routed by axum and served one request per
//! connection by hyper, each connection bounded in time so an idle or slow
//! client cannot hold it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tracing::debug;

use crate::metrics::Metrics;

/// How long one HTTP connection may take, request and answer.
const CONNECTION_TIME_MAX: Duration = Duration::from_secs(5);
/// The largest request head the port reads.
const REQUEST_HEAD_LEN_BYTES_MAX: usize = 8 * 1024;

fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(metrics)
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: recovering the lease state\n",
        )
    }
}

async fn render_metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

/// Serves the port until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let app = router(metrics);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .max_buf_size(REQUEST_HEAD_LEN_BYTES_MAX)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIME_MAX, connection).await {
                Ok(Err(e)) => debug!(error = %e, "http connection failed"),
                Err(_) => debug!("http connection timed out"),
                Ok(Ok(())) => {}
            }
        });
    }
}
