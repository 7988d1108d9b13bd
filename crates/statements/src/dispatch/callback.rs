//! The endpoint a receiver calls to confirm a delivery it accepted:
//! `POST /callback` with `{"idempotency_key": KEY, "status":
//! "delivered" | "failed", "detail": TEXT}`. A callback for a delivery
//! that is already final changes nothing. Every callback carries
//! `Authorization: Bearer TOKEN` (the dispatcher's
//! `--callback-token-file`); any other is refused with 401.

use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::store::{self, Location, Result};

type Request = (String, bool, String, oneshot::Sender<Result<String>>);

/// Serves callbacks on `listen`; a thread of its own owns the database
/// connection (the store's futures are not `Send`).
pub async fn serve(
    listen: std::net::SocketAddr,
    target: Location,
    token: String,
) -> Result<std::net::SocketAddr> {
    let (tx, mut rx) = mpsc::channel::<Request>(64);
    std::thread::Builder::new()
        .name("callbacks".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("callback runtime");
            rt.block_on(async move {
                let mut db = None;
                while let Some((key, delivered, detail, reply)) = rx.recv().await {
                    if db.is_none() {
                        db = store::open(&target).await.ok();
                    }
                    let answer = match db.as_mut() {
                        Some(db) => db
                            .outbox()
                            .confirm(&key, delivered, &detail)
                            .await
                            .map(|s| s.outcome.label().to_string()),
                        None => Err(anyhow::anyhow!("the database is unavailable")),
                    };
                    if answer.is_err() {
                        db = None;
                    }
                    let _ = reply.send(answer);
                }
            });
        })?;
    let app = axum::Router::new()
        .route("/callback", axum::routing::post(callback))
        .with_state(Gate {
            tx,
            token: std::sync::Arc::new(token),
        });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for callbacks on {listen}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}

#[derive(Clone)]
struct Gate {
    tx: mpsc::Sender<Request>,
    token: std::sync::Arc<String>,
}

/// Whether the request presents the token, compared in constant time.
fn authorized(headers: &axum::http::HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    presented.len() == token.len() && bool::from(presented.as_bytes().ct_eq(token.as_bytes()))
}

async fn callback(
    State(gate): State<Gate>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, Json<Value>) {
    if !authorized(&headers, &gate.token) {
        crate::events::emit("callback_refused", json!({"why": "no valid bearer token"}));
        return (
            StatusCode::UNAUTHORIZED,
            Json(
                json!({"error": "a callback needs Authorization: Bearer TOKEN, the token in the dispatcher's --callback-token-file"}),
            ),
        );
    }
    let tx = gate.tx;
    let bad = |why: &str| (StatusCode::BAD_REQUEST, Json(json!({"error": why})));
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body must be JSON: {\"idempotency_key\": KEY, \"status\": \"delivered\" | \"failed\", \"detail\": TEXT}");
    };
    let Some(key) = v
        .get("idempotency_key")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
    else {
        return bad("idempotency_key is missing or empty");
    };
    let delivered = match v.get("status").and_then(Value::as_str) {
        Some("delivered") => true,
        Some("failed") => false,
        _ => return bad("status must be \"delivered\" or \"failed\""),
    };
    let detail = v
        .get("detail")
        .and_then(Value::as_str)
        .unwrap_or("callback")
        .to_string();
    let (reply, answer) = oneshot::channel();
    if tx
        .send((key.to_string(), delivered, detail, reply))
        .await
        .is_err()
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "shutting down"})),
        );
    }
    match answer.await {
        Ok(Ok(outcome)) if outcome == "missing" => {
            (StatusCode::NOT_FOUND, Json(json!({"outcome": outcome})))
        }
        Ok(Ok(outcome)) => (StatusCode::OK, Json(json!({"outcome": outcome}))),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": format!("{e:#}")})),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "no answer"})),
        ),
    }
}
