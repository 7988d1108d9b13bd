//! The idempotent, queryable receiver: an HTTP webhook.
//!
//! The contract (the test kit's receiver implements it): `POST URL` with the
//! payload and an `Idempotency-Key` header applies it once per key, whatever
//! the number of requests; `2xx` says it is applied (`202`: accepted, to be
//! confirmed by a callback or a status query); `GET URL/status?key=KEY`
//! answers `200` if the key was applied, `202` if it was taken and awaits
//! confirmation, and `404` if it was never seen.

use std::time::Duration;

use super::Sent;

/// What a status query learned.
pub enum Status {
    Applied(String),
    /// Taken, to be confirmed (`202`).
    Accepted(String),
    NotApplied,
    Unreachable(String),
}

fn status_url(url: &str, key: &str) -> Result<reqwest::Url, impl std::fmt::Display> {
    reqwest::Url::parse(&format!("{}/status", url.trim_end_matches('/'))).map(|mut u| {
        u.query_pairs_mut().append_pair("key", key);
        u
    })
}

fn answer(code: reqwest::StatusCode, body: &str) -> String {
    let body: String = body.chars().take(300).collect();
    format!("HTTP {}: {}", code.as_u16(), body.trim())
}

/// Sends the payload; without a key (the negative control) the receiver
/// cannot deduplicate.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    payload: Vec<u8>,
    timeout: Duration,
) -> Sent {
    let mut req = http
        .post(url)
        .timeout(timeout)
        .header("content-type", "application/json")
        .body(payload);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    match req.send().await {
        Ok(resp) => {
            let code = resp.status();
            let body = resp.text().await.unwrap_or_default();
            let said = answer(code, &body);
            match code.as_u16() {
                202 => Sent::Accepted(said),
                200..=299 => Sent::Delivered(said),
                408 | 425 | 429 | 500..=599 => Sent::NeverArrived(said),
                _ => Sent::Refused(said),
            }
        }
        // Never connected: the request cannot have arrived.
        Err(e) if e.is_connect() || e.is_builder() => {
            Sent::NeverArrived(baton_telemetry::error_chain(&e))
        }
        // Sent, and no answer: it may have been applied.
        Err(e) => Sent::Unknown(baton_telemetry::error_chain(&e)),
    }
}

/// Asks the receiver whether `key` was applied.
pub async fn status(http: &reqwest::Client, url: &str, key: &str, timeout: Duration) -> Status {
    let u = match status_url(url, key) {
        Ok(u) => u,
        Err(e) => return Status::Unreachable(format!("webhook URL {url:?}: {e}")),
    };
    match http.get(u).timeout(timeout).send().await {
        Ok(resp) if resp.status().as_u16() == 200 => {
            let code = resp.status();
            Status::Applied(answer(code, &resp.text().await.unwrap_or_default()))
        }
        Ok(resp) if resp.status().as_u16() == 202 => {
            let code = resp.status();
            Status::Accepted(answer(code, &resp.text().await.unwrap_or_default()))
        }
        Ok(resp) if resp.status().as_u16() == 404 => Status::NotApplied,
        Ok(resp) => {
            let code = resp.status();
            Status::Unreachable(answer(code, &resp.text().await.unwrap_or_default()))
        }
        Err(e) => Status::Unreachable(baton_telemetry::error_chain(&e)),
    }
}
