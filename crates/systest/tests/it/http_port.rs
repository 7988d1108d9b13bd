//! The HTTP port as strict as the gRPC port, tried as a hostile page
//! would: DNS rebinding (a foreign `Host` and `Origin` on a request that
//! reaches 127.0.0.1), tokens told apart by their answers, invalid UTF-8
//! in queries, and the page's security headers.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use baton_client::{Acquired, Client, ConnectOptions};
use baton_systest::{Server, TempDir, BIN};
use baton_testkit::pki::token_sha256;

const OPS: &str = "ops-token-0c4f";
const BILLING: &str = "billing-token-77e1";

/// One HTTP/1.1 request: the status, the head and the body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: 0\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn auth_file(dir: &std::path::Path) -> std::path::PathBuf {
    let auth = dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"ops\"\ntoken_sha256 = \"{}\"\nrules = {{ \"\" = [\"read\", \"lease\", \"fence\"] }}\n\n[[principal]]\nname = \"billing\"\ntoken_sha256 = \"{}\"\nrules = {{ \"billing:\" = [\"read\"] }}\n",
            token_sha256(OPS),
            token_sha256(BILLING)
        ),
    )
    .unwrap();
    auth
}

async fn hold(s: &Server, token: Option<&str>, name: &str) -> u64 {
    let mut options = ConnectOptions::default();
    if let Some(t) = token {
        options = options.token(t).unwrap();
    }
    let mut c = Client::connect_with(&s.url(), options).await.unwrap();
    match c
        .acquire(name, Some(Duration::from_secs(60)), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l.token.get(),
        other => panic!("{other:?}"),
    }
}

/// A page on evil.example whose name resolves to 127.0.0.1 sends the
/// confirm header from the operator's browser: refused by its `Host`, and
/// by its `Origin`, with and without an auth file (with one, even carrying
/// the operator's token); nothing is fenced. The page still works through
/// its own address, `localhost` and a `--http-allow-host` name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_cannot_fence_or_read_with_or_without_auth() {
    let dir = TempDir::new("http-rebind");
    let auth = auth_file(dir.path());
    for with_auth in [false, true] {
        let mut extra = vec!["--http-allow-host", "ops.example"];
        if with_auth {
            extra.extend(["--auth-file", auth.to_str().unwrap()]);
        }
        let s = Server::start(&BIN, &dir.path().join(format!("data-{with_auth}")), &extra);
        let token = with_auth.then_some(OPS);
        let held = hold(&s, token, "rebind:1").await;
        let bearer = format!("Bearer {OPS}");
        let mut base = vec![("x-baton-confirm", "fence")];
        if with_auth {
            base.push(("authorization", bearer.as_str()));
        }
        let port = s.http.port();
        let evil_host = format!("evil.example:{port}");
        let evil_origin = format!("http://evil.example:{port}");
        let fence = "/api/fence?resource=rebind:1";
        for (host, origin) in [
            (evil_host.as_str(), Some(evil_origin.as_str())),
            (evil_host.as_str(), None),
            ("localhost", Some(evil_origin.as_str())),
        ] {
            let mut h = base.clone();
            h.push(("host", host));
            if let Some(o) = origin {
                h.push(("origin", o));
            }
            let (status, _, body) = request(s.http, "POST", fence, &h);
            assert_eq!(
                status, 403,
                "auth {with_auth}, host {host}, origin {origin:?}: {body}"
            );
            assert!(
                body.contains("is not a name of this server")
                    || body.contains("is not a page of this server"),
                "{body}"
            );
            let (status, _, _) = request(s.http, "GET", "/api/leases", &h);
            assert_eq!(status, 403, "reading through a rebound name");
        }
        let mut reader = Client::connect_with(
            &s.url(),
            token.map_or_else(ConnectOptions::default, |t| {
                ConnectOptions::default().token(t).unwrap()
            }),
        )
        .await
        .unwrap();
        assert_eq!(
            reader
                .status("rebind:1")
                .await
                .unwrap()
                .holder_token
                .map(|t| t.get()),
            Some(held)
        );
        // The page through its own names; a fence from its own origin.
        for host in [
            s.http.to_string(),
            format!("localhost:{port}"),
            format!("ops.example:{port}"),
        ] {
            let (status, head, _) = request(s.http, "GET", "/", &[("host", &host)]);
            assert_eq!(status, 200, "{host}");
            assert!(
                head.contains("content-security-policy: default-src 'none'"),
                "{head}"
            );
        }
        let own_origin = format!("http://localhost:{port}");
        let mut h = base.clone();
        h.push(("host", "localhost"));
        h.push(("origin", &own_origin));
        let (status, _, body) = request(s.http, "POST", fence, &h);
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            reader.status("rebind:1").await.unwrap().holder_token,
            None,
            "fenced"
        );
        // Probes and scrapers dial by address: any Host.
        assert_eq!(
            request(s.http, "GET", "/healthz", &[("host", "evil.example")]).0,
            200
        );
    }
}

/// Every page endpoint answers an unknown token and a known token without
/// the permission with the same status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_token_and_one_without_permission_get_the_same_answer() {
    let dir = TempDir::new("http-oracle");
    let auth = auth_file(dir.path());
    let s = Server::start(
        &BIN,
        &dir.path().join("data"),
        &["--auth-file", auth.to_str().unwrap()],
    );
    let held = hold(&s, Some(OPS), "payroll:1").await;
    for (method, path) in [
        ("GET", "/api/leases?prefix=payroll:"),
        ("GET", "/api/history?resource=payroll:1"),
        ("POST", "/api/fence?resource=payroll:1"),
        ("POST", "/api/fence?resource=billing:1"),
    ] {
        let answer = |token: &str| {
            let bearer = format!("Bearer {token}");
            let (status, _, body) = request(
                s.http,
                method,
                path,
                &[("authorization", &bearer), ("x-baton-confirm", "fence")],
            );
            (status, body)
        };
        let unknown = answer("not-a-token-at-all");
        let unpermitted = answer(BILLING);
        assert_eq!(unknown, unpermitted, "{method} {path}");
        assert_eq!(unknown.0, 401, "{method} {path}: {}", unknown.1);
    }
    let mut ops = Client::connect_with(&s.url(), ConnectOptions::default().token(OPS).unwrap())
        .await
        .unwrap();
    assert_eq!(
        ops.status("payroll:1")
            .await
            .unwrap()
            .holder_token
            .map(|t| t.get()),
        Some(held),
        "nothing was fenced"
    );
}

/// Invalid UTF-8 in any query is a 400 naming the rule (never U+FFFD), and
/// nothing is fenced; the page's answers carry its security headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_query_is_refused_and_nothing_is_fenced() {
    let dir = TempDir::new("http-utf8");
    let s = Server::start(&BIN, &dir.path().join("data"), &[]);
    hold(&s, None, "\u{fffd}").await;
    for (method, path) in [
        ("GET", "/api/leases?after=%FF%FE"),
        ("GET", "/api/leases?prefix=%C3%28"),
        ("GET", "/api/history?resource=a%FF"),
        ("POST", "/api/fence?resource=%FF"),
    ] {
        let (status, _, body) = request(s.http, method, path, &[("x-baton-confirm", "fence")]);
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert!(body.contains("not valid UTF-8"), "{body}");
    }
    assert_eq!(
        s.metric("baton_fences_total"),
        0,
        "the resource named U+FFFD was not fenced"
    );
    for path in ["/", "/api/overview"] {
        let (status, head, _) = request(s.http, "GET", path, &[]);
        assert_eq!(status, 200, "{path}");
        for header in [
            "content-security-policy: default-src 'none'; script-src 'sha256-",
            "x-frame-options: deny",
            "referrer-policy: no-referrer",
        ] {
            assert!(head.contains(header), "{path}: {header} in {head}");
        }
        assert!(!head.contains("unsafe-inline"), "{head}");
    }
}

/// A bad --http-allow-host is a usage error naming the rule.
#[test]
fn a_bad_allowed_host_name_is_refused_at_start() {
    let out = std::process::Command::new(&*BIN)
        .args([
            "serve",
            "--http-allow-host",
            "ops.example:7701",
            "--data-dir",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("without a port or scheme"), "{err}");
}
