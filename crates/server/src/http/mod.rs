//! The HTTP port: `GET /healthz` (alive), `GET /readyz` (recovered and
//! granting), `GET /metrics`, and the operator page at `/` with the data
//! it polls under `/api/` (see `page.rs`), routed by axum and served one request per
//! connection by hyper, each connection bounded in time so an idle or slow
//! client cannot hold it. With TLS on, the port speaks HTTPS (no client
//! certificates: probes and scrapers need none); with an auth file,
//! `/metrics` needs the bearer token of a principal with `read` on every
//! name, checked by the server's one gate (audited, counted, and slowed
//! for a peer that keeps failing, as on the gRPC port), while `/healthz`
//! and `/readyz` stay open.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tracing::debug;

use crate::access::auth::Permission;
use crate::access::Action;
use crate::access::{Caller, Gate};
use crate::cluster::seat::Seat;
use crate::metrics::Metrics;
use crate::observed::Observed;
use crate::service::LeaseService;

mod guard;
mod page;
mod query;

pub use guard::{check_allowed_name, AllowedHosts, BadHostName};

/// What the port answers from.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) metrics: Arc<Metrics>,
    /// The page's history and series, and readiness.
    pub(crate) observed: Arc<Observed>,
    pub(crate) seat: Arc<Seat>,
    pub(crate) gate: Gate,
    /// The lease service the page's calls go through (list and fence).
    pub(crate) service: LeaseService,
}

/// The address a request's connection comes from.
#[derive(Clone, Copy)]
struct Peer(std::net::SocketAddr);

/// How long one HTTP connection may take, request and answer.
const CONNECTION_TIME_MAX: Duration = Duration::from_secs(5);
/// The largest request head the port reads.
const REQUEST_HEAD_LEN_BYTES_MAX: usize = 8 * 1024;

/// How often the page's headline series takes a point.
const FIGURES_INTERVAL: Duration = Duration::from_secs(1);

/// The page and its API behind the Host/Origin rule and the page's
/// headers; the probes and `/metrics` answer any `Host`.
fn router(state: HttpState, allowed: AllowedHosts) -> Router {
    let page = Router::new()
        .route("/", get(page::page))
        .route("/api/overview", get(page::overview))
        .route("/api/leases", get(page::leases))
        .route("/api/history", get(page::history))
        .route("/api/fence", post(page::fence))
        .layer(axum::middleware::from_fn(guard::security_headers))
        .layer(axum::middleware::from_fn_with_state(
            allowed,
            guard::only_our_names,
        ));
    Router::new()
        .merge(page)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(state)
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
    if s.observed.ready.load(Ordering::Acquire) {
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

/// The one answer to a refused scrape, whatever the reason: an unknown
/// token and a known one without `read` look the same from the port, so
/// it cannot be used to learn which tokens are valid (the audit line says
/// which it was).
const METRICS_REFUSED: &str = "unauthenticated or not permitted: /metrics needs `authorization: Bearer TOKEN` of a principal with `read` on every name (a rule on the empty prefix)\n";

async fn render_metrics(
    State(s): State<HttpState>,
    axum::Extension(Peer(peer)): axum::Extension<Peer>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let caller = Caller::http(authorization, Some(peer), s.gate.is_on());
    let admitted = match s.gate.let_in(&caller, Action::MetricsScrape).await {
        Ok(who) => who.may_everything(Permission::Read),
        Err(refused) => Err(refused),
    };
    if admitted.is_err() {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            METRICS_REFUSED,
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// Serves the port until the process ends; over TLS with `tls`. The
/// page's calls go through `service`, guarded by `gate`; the page answers
/// only the names in `allowed`.
pub(crate) async fn serve(
    listener: TcpListener,
    state: HttpState,
    tls: Option<crate::net::tls::Tls>,
    allowed: AllowedHosts,
) {
    tokio::spawn(take_figures(state.metrics.clone(), state.observed.clone()));
    let app = router(state, allowed);
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else {
            continue;
        };
        let service = TowerToHyperService::new(app.clone().layer(axum::Extension(Peer(peer))));
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = async {
                let Some(tls) = tls else {
                    return serve_one(stream, service).await;
                };
                if !crate::net::tls::starts_tls(&mut stream, crate::net::tls::PlainAnswer::Http1)
                    .await?
                {
                    return Ok(());
                }
                let (stream, _) = crate::net::tls::accept(&tls, stream).await?;
                serve_one(stream, service).await
            };
            match tokio::time::timeout(CONNECTION_TIME_MAX, served).await {
                Ok(Err(e)) => debug!(error = %e, "http connection failed"),
                Err(_) => debug!("http connection timed out"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// Adds a point to the page's headline series every second, for the
/// process's life.
async fn take_figures(metrics: Arc<Metrics>, observed: Arc<Observed>) {
    let mut ticks = tokio::time::interval(FIGURES_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut totals = metrics.totals();
    let mut at = tokio::time::Instant::now();
    loop {
        ticks.tick().await;
        let now = tokio::time::Instant::now();
        totals = observed.sample(&metrics, &totals, (now - at).as_millis() as u64);
        at = now;
    }
}

async fn serve_one<IO>(
    io: IO,
    service: TowerToHyperService<Router>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(REQUEST_HEAD_LEN_BYTES_MAX)
        .serve_connection(TokioIo::new(io), service)
        .await?;
    Ok(())
}
