//! A stand-in for a third-party webhook provider, backed by a real
//! PostgreSQL table: the idempotent, queryable receiver of the outbox.
//!
//! Its contract, which `statements dispatch` relies on:
//! - `POST /hooks` with a JSON body and an `Idempotency-Key` header applies
//!   the body once per key: the first request applies it and answers `200
//!   {"status":"applied"}`; a repeat with the same body answers the same
//!   without applying again; the same key with another body is `422`.
//!   Without the header every request is applied (as a provider that does
//!   not deduplicate would), which is how duplicates become visible.
//! - `GET /hooks/status?key=KEY`: `200 {"status":"applied"}` if the key was
//!   applied, `404 {"status":"unknown"}` if never seen.
//! - With `--accept-async`, a new key is answered `202` and confirmed later
//!   by `POST CALLBACK {"idempotency_key", "status":"delivered"}`.
//! - `GET /stats`: requests, applications, and `duplicates` (operations,
//!   by the body's `operation` field, applied more than once).
//!
//! Faults for tests: `--fail-first N` answers `503` to the first N posts,
//! `--refuse` answers `400` to every post.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use sha2::Digest;

/// `statements webhook-receiver`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReceiverArgs {
    /// The PostgreSQL database that holds the applied keys.
    #[arg(long)]
    pub database_url: String,
    /// The schema of its tables (one per receiver).
    #[arg(long, default_value = "webhook_receiver")]
    pub schema: String,
    /// Where to listen; the bound address is printed as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Answer `202` to new keys and confirm them later at this URL.
    #[arg(long, value_name = "URL")]
    pub accept_async: Option<String>,
    /// The bearer token to present with each confirmation, from a file.
    #[arg(long, value_name = "PATH")]
    pub callback_token_file: Option<std::path::PathBuf>,
    /// How long after a `202` the confirmation is sent.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub confirm_after: Duration,
    /// Answer `503` to the first N posts.
    #[arg(long, default_value_t = 0)]
    pub fail_first: u64,
    /// Answer `400` to every post.
    #[arg(long)]
    pub refuse: bool,
}

struct Receiver {
    db: tokio_postgres::Client,
    args: ReceiverArgs,
    posts: AtomicU64,
    replays: AtomicU64,
    http: reqwest::Client,
}

fn schema_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Runs the receiver until killed.
pub async fn run(args: ReceiverArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if !schema_ok(&args.schema) {
        return Err(format!(
            "schema {:?}: use 1 to 63 lowercase letters, digits and underscores",
            args.schema
        )
        .into());
    }
    let (db, conn) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let s = &args.schema;
    db.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.keys (
             key text PRIMARY KEY, payload_sha256 text NOT NULL, confirmed boolean NOT NULL DEFAULT true,
             applied_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE IF NOT EXISTS {s}.applications (
             id bigserial PRIMARY KEY, key text, operation text, at timestamptz NOT NULL DEFAULT now());"
    ))
    .await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    let state = Arc::new(Receiver {
        db,
        args,
        posts: AtomicU64::new(0),
        replays: AtomicU64::new(0),
        http: {
            baton_telemetry::use_ring_for_https();
            reqwest::Client::new()
        },
    });
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(post))
        .route("/hooks/status", axum::routing::get(status))
        .route("/stats", axum::routing::get(stats))
        .with_state(state);
    axum::serve(listener, app).await?;
    Ok(())
}

type Answer = (StatusCode, Json<Value>);

fn fail(e: impl std::fmt::Display) -> Answer {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": e.to_string()})),
    )
}

async fn post(
    State(r): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    let n = r.posts.fetch_add(1, Ordering::SeqCst);
    if r.args.refuse {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "this receiver refuses every request"})),
        );
    }
    if n < r.args.fail_first {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "try again later"})),
        );
    }
    let operation = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("operation")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let s = &r.args.schema;
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let Some(key) = key else {
        return apply_unkeyed(&r, &operation).await;
    };
    let digest: String = sha2::Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let confirmed = r.args.accept_async.is_none();
    let inserted = r
        .db
        .query_opt(
            &format!(
                "WITH k AS (INSERT INTO {s}.keys (key, payload_sha256, confirmed) VALUES ($1, $2, $4)
                            ON CONFLICT (key) DO NOTHING RETURNING key)
                 INSERT INTO {s}.applications (key, operation) SELECT key, $3 FROM k RETURNING id"
            ),
            &[&key, &digest, &operation, &confirmed],
        )
        .await;
    match inserted {
        Ok(Some(_)) => {}
        Ok(None) => return replay(&r, key, &digest).await,
        Err(e) => return fail(e),
    }
    if let Some(callback) = r.args.accept_async.clone() {
        tokio::spawn(confirm_later(r.clone(), key.to_string(), callback));
        return (StatusCode::ACCEPTED, Json(json!({"status": "accepted"})));
    }
    (StatusCode::OK, Json(json!({"status": "applied"})))
}

/// No key: applied every time.
async fn apply_unkeyed(r: &Receiver, operation: &str) -> Answer {
    let s = &r.args.schema;
    match r
        .db
        .execute(
            &format!("INSERT INTO {s}.applications (key, operation) VALUES (NULL, $1)"),
            &[&operation],
        )
        .await
    {
        Ok(_) => (StatusCode::OK, Json(json!({"status": "applied"}))),
        Err(e) => fail(e),
    }
}

/// A key seen before: the saved answer if the payload is the same, a
/// refusal if it is not.
async fn replay(r: &Receiver, key: &str, digest: &str) -> Answer {
    r.replays.fetch_add(1, Ordering::SeqCst);
    let s = &r.args.schema;
    let row = match r
        .db
        .query_one(
            &format!("SELECT payload_sha256 FROM {s}.keys WHERE key = $1"),
            &[&key],
        )
        .await
    {
        Ok(row) => row,
        Err(e) => return fail(e),
    };
    let stored: String = row.get(0);
    if stored != digest {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "idempotency key reused with a different payload"})),
        );
    }
    (
        StatusCode::OK,
        Json(json!({"status": "applied", "replayed": true})),
    )
}

/// `--accept-async`: confirms the delivery after a while, then calls back.
async fn confirm_later(r: Arc<Receiver>, key: String, callback: String) {
    tokio::time::sleep(r.args.confirm_after).await;
    let _ =
        r.db.execute(
            &format!(
                "UPDATE {}.keys SET confirmed = true WHERE key = $1",
                r.args.schema
            ),
            &[&key],
        )
        .await;
    let token = r
        .args
        .callback_token_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let _ = r
        .http
        .post(&callback)
        .bearer_auth(token.trim())
        .json(&json!({"idempotency_key": key, "status": "delivered", "detail": "confirmed by the receiver"}))
        .send()
        .await;
}

async fn status(
    State(r): State<Arc<Receiver>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Answer {
    let Some(key) = q.get("key") else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "ask with ?key=KEY"})),
        );
    };
    let s = &r.args.schema;
    match r
        .db
        .query_opt(
            &format!("SELECT confirmed FROM {s}.keys WHERE key = $1"),
            &[key],
        )
        .await
    {
        Ok(Some(row)) if row.get::<_, bool>(0) => {
            (StatusCode::OK, Json(json!({"status": "applied"})))
        }
        Ok(Some(_)) => (StatusCode::ACCEPTED, Json(json!({"status": "accepted"}))),
        Ok(None) => (StatusCode::NOT_FOUND, Json(json!({"status": "unknown"}))),
        Err(e) => fail(e),
    }
}

async fn stats(State(r): State<Arc<Receiver>>) -> Answer {
    let s = &r.args.schema;
    let row = r
        .db
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {s}.applications),
                        (SELECT count(*) FROM (SELECT operation FROM {s}.applications GROUP BY operation HAVING count(*) > 1) d),
                        (SELECT count(DISTINCT operation) FROM {s}.applications)"
            ),
            &[],
        )
        .await;
    match row {
        Ok(row) => (
            StatusCode::OK,
            Json(json!({
                "posts": r.posts.load(Ordering::SeqCst),
                "replays": r.replays.load(Ordering::SeqCst),
                "applications": row.get::<_, i64>(0),
                "duplicates": row.get::<_, i64>(1),
                "operations": row.get::<_, i64>(2),
            })),
        ),
        Err(e) => fail(e),
    }
}
