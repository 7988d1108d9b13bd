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
use crate::seat::Seat;

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    seat: Arc<Seat>,
}

/// How long one HTTP connection may take, request and answer.
const CONNECTION_TIME_MAX: Duration = Duration::from_secs(5);
/// The largest request head the port reads.
const REQUEST_HEAD_LEN_BYTES_MAX: usize = 8 * 1024;

fn router(metrics: Arc<Metrics>, seat: Arc<Seat>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(HttpState { metrics, seat })
}

/// Alive; in a cluster also the role: `ok leader term N` or `ok follower`.
async fn healthz(State(s): State<HttpState>) -> String {
    match s.seat.view() {
        None => "ok\n".into(),
        Some(v) if s.seat.is_leader() => format!("ok leader term {}\n", v.term),
        Some(v) => match v.leader {
            Some(l) => format!("ok follower term {} leader {l}\n", v.term),
            None => format!("ok follower term {} leader unknown\n", v.term),
        },
    }
}

/// 200 once the leases are loaded and this server grants: on a cluster,
/// the leader only.
async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.metrics.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else if s.seat.view().is_some() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: a follower (or a leader still loading the leases)\n",
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: recovering the lease state\n",
        )
    }
}

async fn render_metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let metrics = s.metrics;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

/// Serves the port until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, seat: Arc<Seat>) {
    let app = router(metrics, seat);
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
