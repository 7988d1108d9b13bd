//! `statements console --listen ADDR`: the incident procedure as a page.
//! `GET /` is a static page (script inline, no build step) that asks
//! `GET /api/inspect?account=A&date=D` for the same [`Inspection`] that
//! `statements inspect --json` prints. The page is the application's own:
//! the lease server never depends on it. It is read-only and has no
//! authentication of its own: bind it to loopback or put it behind the
//! proxy that guards your other consoles.
//!
//! [`Inspection`]: crate::inspect::Inspection

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use serde::Deserialize;

use crate::args::{parse_date, Paths};
use crate::{inspect, NoSuchJob};

const PAGE_HTML: &str = include_str!("console.html");

struct Console {
    paths: Paths,
    server: String,
}

#[derive(Deserialize)]
struct Which {
    account: String,
    date: String,
}

/// Serves the page on `listen` until the process is stopped.
pub async fn serve(paths: Paths, server: String, listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding --listen {listen}"))?;
    let bound = listener.local_addr().context("the console's address")?;
    eprintln!("console on http://{bound}/");
    let app = axum::Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    PAGE_HTML,
                )
            }),
        )
        .route("/api/inspect", get(inspect_one))
        .with_state(Arc::new(Console { paths, server }));
    axum::serve(listener, app)
        .await
        .context("serving the console")
}

async fn inspect_one(State(c): State<Arc<Console>>, Query(w): Query<Which>) -> Response {
    let refuse = |code: StatusCode, error: String| {
        (code, Json(serde_json::json!({ "error": error }))).into_response()
    };
    if w.account.is_empty() || w.account.len() > 200 || w.account.chars().any(char::is_control) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "account must be 1 to 200 bytes with no control characters".into(),
        );
    }
    if let Err(e) = parse_date(&w.date) {
        return refuse(StatusCode::BAD_REQUEST, e.to_string());
    }
    // The store's handle is not shared across threads (SQLite): the
    // gathering runs on a blocking thread of its own.
    let handle = tokio::runtime::Handle::current();
    let gathered = tokio::task::spawn_blocking(move || {
        handle.block_on(inspect::gather(
            &c.paths,
            &w.account,
            &w.date,
            Some(&c.server),
        ))
    })
    .await;
    let gathered = match gathered {
        Ok(g) => g,
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    match gathered {
        Ok(shown) => Json(shown).into_response(),
        Err(e) if e.downcast_ref::<NoSuchJob>().is_some() => {
            refuse(StatusCode::NOT_FOUND, format!("{e:#}"))
        }
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}
