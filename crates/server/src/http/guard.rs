//! What the operator page and its API (`/`, `/api/*`) demand of a request
//! before a handler sees it, and what every answer of theirs carries.
//!
//! **Host.** A page elsewhere whose name resolves to this server (DNS
//! rebinding) makes the browser's requests same-origin, so the confirm
//! header no longer proves anything. The name the browser asked for still
//! shows in `Host`: only the names this server is known by are answered
//! (the `--http-listen` address, `localhost`/127.0.0.1/[::1] when it
//! listens on loopback, the `--advertise` host, and `--http-allow-host`).
//! **Origin.** A browser's POST (and cross-origin read) carries the page's
//! origin; a request with one must come from one of those names too (a
//! client that sends no `Origin` is not a browser). `/healthz`, `/readyz` and `/metrics` answer any `Host`:
//! probes and scrapers dial by address.
//!
//! **Headers.** The page's one inline script and style are allowed by
//! hash (no `unsafe-inline`); nothing else loads, nothing may frame it, no
//! referrer leaves it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};

/// The host names the page answers to, lowercase, IPv6 in brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHosts(Arc<Vec<String>>);

impl AllowedHosts {
    /// The names of a page served on `http_listen`, plus `extra` (the
    /// `--advertise` host and `--http-allow-host` names).
    pub fn new(http_listen: SocketAddr, extra: &[String]) -> Self {
        let mut names = vec![ip_host(http_listen.ip())];
        if http_listen.ip().is_loopback() {
            names.extend(["localhost", "127.0.0.1", "[::1]"].map(String::from));
        }
        names.extend(extra.iter().map(|n| n.to_ascii_lowercase()));
        names.sort();
        names.dedup();
        Self(Arc::new(names))
    }

    /// The names, for messages.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// Whether a `Host` header's value (`NAME` or `NAME:PORT`) names this
    /// server.
    pub fn allows_host(&self, value: &str) -> bool {
        host_of(value).is_some_and(|h| self.0.contains(&h))
    }

    /// Whether an `Origin` header's value (`SCHEME://NAME[:PORT]`) is a
    /// page of this server.
    pub fn allows_origin(&self, value: &str) -> bool {
        match value.split_once("://") {
            Some(("http" | "https", authority)) => self.allows_host(authority),
            _ => false,
        }
    }
}

fn ip_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The host of `NAME`, `NAME:PORT`, `[V6]` or `[V6]:PORT`, lowercase,
/// without a trailing dot; `None` if it is not one of those.
fn host_of(authority: &str) -> Option<String> {
    let host = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let rest = &authority[end + 1..];
        if !(rest.is_empty() || rest.starts_with(':')) {
            return None;
        }
        &authority[..=end]
    } else {
        authority.split(':').next()?
    };
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

/// A `--http-allow-host` value that is not a host name or an address.
#[derive(Debug, thiserror::Error)]
#[error("--http-allow-host {0:?}: write a host name (letters, digits, '-' and '.') or an IP address, without a port or scheme")]
pub struct BadHostName(pub String);

/// Checks a `--http-allow-host` value: a host name or an IP address, no
/// port, no scheme; the name as the page compares it (lowercase, IPv6 in
/// brackets).
pub fn check_allowed_name(name: &str) -> Result<String, BadHostName> {
    let lower = name.trim().to_ascii_lowercase();
    if let Ok(ip) = lower.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(ip_host(ip));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if lower.len() <= 253 && lower.split('.').all(label_ok) {
        return Ok(lower);
    }
    Err(BadHostName(name.to_string()))
}

/// Refuses a page or API request whose `Host` (or, on a POST, `Origin`)
/// does not name this server: 403 naming the rule.
pub async fn only_our_names(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    let (host, origin) = {
        let header_str = |name: header::HeaderName| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("\u{fffd}").to_string())
        };
        (
            header_str(header::HOST).unwrap_or_default(),
            header_str(header::ORIGIN),
        )
    };
    if !allowed.allows_host(&host) {
        return refused(format!(
            "Host {host:?} is not a name of this server: the page and /api answer only {}; add a name with --http-allow-host",
            allowed.names().join(", ")
        ));
    }
    // A browser sends `Origin` on every POST and on cross-origin reads;
    // a request that carries one must come from a page of this server.
    if let Some(origin) = origin {
        if !allowed.allows_origin(&origin) {
            return refused(format!(
                "Origin {origin:?} is not a page of this server: a request from a browser must come from a page on {}",
                allowed.names().join(", ")
            ));
        }
    }
    next.run(request).await
}

fn refused(message: String) -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

/// The page's Content-Security-Policy: its inline script and style by
/// hash, its own origin for data, nothing else.
fn content_security_policy(page: &str) -> String {
    let hash = |open: &str, close: &str| {
        let start = page.find(open).map(|i| i + open.len()).unwrap_or(0);
        let end = page[start..].find(close).map_or(start, |i| start + i);
        let digest = Sha256::digest(&page.as_bytes()[start..end]);
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        )
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash("<script>", "</script>"),
        hash("<style>", "</style>")
    )
}

static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    HeaderValue::from_str(&content_security_policy(super::page::PAGE_HTML))
        .expect("a policy is ASCII")
});

/// Adds the page's security headers to every answer of the page and API.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, CSP.clone());
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_page_answers_its_loopback_names_and_no_other() {
        let a = AllowedHosts::new("127.0.0.1:7701".parse().unwrap(), &["ops.example".into()]);
        for ok in [
            "127.0.0.1:7701",
            "localhost:7701",
            "LOCALHOST",
            "[::1]:7701",
            "ops.example:7701",
            "ops.example.",
        ] {
            assert!(a.allows_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:7701",
            "",
            "127.0.0.2:7701",
            "localhost.evil.example",
            "[::1]x",
            "ops.example.evil",
        ] {
            assert!(!a.allows_host(bad), "{bad}");
        }
        assert!(a.allows_origin("http://localhost:7701"));
        assert!(a.allows_origin("https://ops.example"));
        for bad in [
            "null",
            "http://evil.example:7701",
            "file://localhost",
            "localhost",
        ] {
            assert!(!a.allows_origin(bad), "{bad}");
        }
    }

    #[test]
    fn a_page_on_every_address_answers_only_the_names_it_was_given() {
        let a = AllowedHosts::new("0.0.0.0:7701".parse().unwrap(), &[]);
        assert!(!a.allows_host("localhost:7701"));
        assert!(!a.allows_host("192.168.1.10:7701"));
        let v6 = AllowedHosts::new("[::1]:7701".parse().unwrap(), &[]);
        assert!(v6.allows_host("[::1]:7701") && v6.allows_host("localhost"));
    }

    #[test]
    fn allowed_names_are_host_names_or_addresses() {
        assert_eq!(check_allowed_name("Ops.Example").unwrap(), "ops.example");
        assert_eq!(check_allowed_name("::1").unwrap(), "[::1]");
        assert_eq!(check_allowed_name("10.0.0.5").unwrap(), "10.0.0.5");
        for bad in ["ops.example:7701", "http://ops", "", "a..b", "-a.b", "a b"] {
            assert!(check_allowed_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_policy_allows_the_pages_own_script_and_style_by_hash() {
        let csp = content_security_policy(super::super::page::PAGE_HTML);
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(csp.matches("'sha256-").count(), 2, "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    }
}
