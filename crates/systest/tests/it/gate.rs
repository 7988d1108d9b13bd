//! One gate for every entry point: a unary call, a request on the session
//! stream and a scrape of `/metrics` are refused the same way, each with
//! its audit line, and a peer that keeps failing to authenticate is slowed
//! whichever port it tries. `/metrics` does not tell a valid token from an
//! unknown one.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use baton_client::{Client, ClientError, ConnectOptions};
use baton_systest as common;
use baton_testkit::pki::token_sha256;
use common::{Server, TempDir, BIN};

const BILLING: &str = "billing-token-7f3a";
const READER: &str = "reader-token-21c9";

fn auth_file() -> String {
    format!(
        r#"
[[principal]]
name = "billing"
token_sha256 = "{}"
rules = {{ "statement:" = ["read", "lease"] }}

[[principal]]
name = "reader"
token_sha256 = "{}"
rules = {{ "" = ["read"] }}
"#,
        token_sha256(BILLING),
        token_sha256(READER),
    )
}

fn serve(dir: &Path) -> Server {
    let auth = dir.join("auth.toml");
    std::fs::write(&auth, auth_file()).unwrap();
    let audit = dir.join("audit.jsonl");
    let flags = [
        "--auth-file",
        auth.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ];
    Server::start_logged(&BIN, &dir.join("data"), &flags, &dir.join("server.log"))
}

async fn client(s: &Server, token: &str) -> Client {
    Client::connect_with(&s.url(), ConnectOptions::default().token(token).unwrap())
        .await
        .unwrap()
}

/// `GET /metrics` with an optional bearer token: status code and body.
fn scrape(s: &Server, token: Option<&str>) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(s.http).unwrap();
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    write!(stream, "GET /metrics HTTP/1.1\r\nhost: x\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

fn audit_lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_refuses_and_audits_the_same_way() {
    let dir = TempDir::new("gate-same");
    let s = serve(dir.path());

    // The same principal, the same rule, refused on a unary call and on
    // the session stream with the same message.
    let reader = client(&s, READER).await;
    let unary = reader
        .clone()
        .acquire("statement:1", Some(Duration::from_secs(5)), Duration::ZERO)
        .await
        .unwrap_err();
    let session = reader.open_session(Duration::from_secs(5)).await.unwrap();
    let streamed = session
        .acquire("statement:1", Duration::ZERO)
        .await
        .unwrap_err();
    let (ClientError::PermissionDenied(a), ClientError::PermissionDenied(b)) = (&unary, &streamed)
    else {
        panic!("{unary:?} / {streamed:?}")
    };
    assert!(a.contains("`lease` on a prefix of \"statement:1\""), "{a}");
    assert_eq!(a, b, "one rule, one message");

    // /metrics: an unknown token and a valid one without `read` on every
    // name get one and the same answer; a reader scrapes.
    let (unknown, unknown_body) = scrape(&s, Some("no-such-token"));
    let (billing, billing_body) = scrape(&s, Some(BILLING));
    let (none, none_body) = scrape(&s, None);
    assert_eq!((unknown, billing, none), (401, 401, 401));
    assert_eq!(unknown_body, billing_body, "no token-validity oracle");
    assert_eq!(unknown_body, none_body);
    let (ok, text) = scrape(&s, Some(READER));
    assert_eq!(ok, 200, "{text}");
    assert!(text.contains("baton_auth_refused"), "{text}");

    let audit = audit_lines(dir.path());
    let refused = |action: &str, principal: &str, outcome: &str| {
        audit
            .iter()
            .filter(|l| {
                l["action"] == action && l["principal"] == principal && l["outcome"] == outcome
            })
            .count()
    };
    assert_eq!(
        refused("acquire", "reader", "permission_denied"),
        2,
        "one line per refusal, the same on both transports: {audit:?}"
    );
    assert_eq!(
        refused("metrics_scrape", "unauthenticated", "unauthenticated"),
        2
    );
    assert_eq!(refused("metrics_scrape", "billing", "permission_denied"), 1);
    for line in &audit {
        let text = line.to_string();
        assert!(
            !text.contains(BILLING) && !text.contains("no-such-token"),
            "{text}"
        );
    }
}

/// 64 failed authentications are free per address; the 65th starts the
/// penalty, wherever it lands. Guess on /metrics, then fail once on gRPC:
/// the server says the penalty started, so the two ports share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guesser_is_slowed_on_every_port_alike() {
    let dir = TempDir::new("gate-penalty");
    let s = serve(dir.path());
    for i in 0..64 {
        assert_eq!(scrape(&s, Some(&format!("guess-{i}"))).0, 401);
    }
    let log = || std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(
        !log().contains("repeated authentication failures"),
        "64 are free"
    );
    let mut guesser = client(&s, "guess-grpc").await;
    let refused = guesser.status("statement:1").await.unwrap_err();
    assert!(
        matches!(refused, ClientError::Unauthenticated(_)),
        "{refused:?}"
    );
    common::eventually(Duration::from_secs(5), async || {
        log().contains("repeated authentication failures from this address")
    })
    .await;
    // And the other way round: the next scrape with a bad token waits.
    let started = std::time::Instant::now();
    assert_eq!(scrape(&s, Some("guess-again")).0, 401);
    assert!(
        started.elapsed() >= baton_server_delay(66),
        "the 66th failure waits its penalty"
    );
}

/// The penalty the server applies before its `failures`-th refusal in a
/// row (64 free, then 1 ms doubling).
fn baton_server_delay(failures: u32) -> Duration {
    Duration::from_millis(1 << (failures - 64).min(10))
}

/// An auth file others may read, or one that grants nothing (on a reload),
/// is warned about loudly; a token file others may read, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_token_files_kept_carelessly_are_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("gate-files");
    let s = serve(dir.path());
    let log = || std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    let auth = dir.path().join("auth.toml");
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        log().contains("readable or writable by other users (mode 644)"),
        "{}",
        log()
    );
    assert!(!log().contains("grants nothing"));
    std::fs::write(&auth, "[[principal]]\nname = \"idle\"\nrules = {}\n").unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    s.signal(nix::sys::signal::Signal::SIGHUP);
    common::eventually(Duration::from_secs(5), async || {
        log().contains("the auth file grants nothing to anybody")
    })
    .await;

    let token = dir.path().join("token");
    std::fs::write(&token, READER).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let status_stderr = || {
        let out = common::cli(&[
            "status",
            "x",
            "--server",
            &s.url(),
            "--token-file",
            token.to_str().unwrap(),
        ]);
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = status_stderr();
    assert!(
        err.contains("token file") && err.contains("mode 644"),
        "{err}"
    );
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!status_stderr().contains("warning"));
}

/// A watch goes through the same gate: `read` on the prefix, refused (and
/// audited) before anything is streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_needs_read_on_its_prefix() {
    let dir = TempDir::new("gate-watch");
    let s = serve(dir.path());
    let billing = client(&s, BILLING).await;
    let watch = billing.watch("statement:").await.unwrap();
    assert!(watch.holders.is_empty());
    let refused = billing.watch("invoice:").await.unwrap_err();
    let ClientError::PermissionDenied(why) = &refused else {
        panic!("{refused:?}")
    };
    assert!(why.contains("`read` on a prefix of \"invoice:\""), "{why}");
    let stranger = client(&s, "no-such-token").await;
    assert!(matches!(
        stranger.watch("statement:").await.unwrap_err(),
        ClientError::Unauthenticated(_)
    ));
    let audit = audit_lines(dir.path());
    let watch_refusals = audit.iter().filter(|l| l["action"] == "watch").count();
    assert_eq!(watch_refusals, 2, "{audit:?}");
}

/// A unary call with `token`, raw: the server's answer, unvalidated by a client.
async fn unary_acquire(
    s: &Server,
    token: &str,
    r: baton_proto::v1::AcquireRequest,
) -> Result<(), (tonic::Code, String)> {
    let mut c = baton_proto::v1::leases_client::LeasesClient::connect(s.url())
        .await
        .unwrap();
    let mut request = tonic::Request::new(r);
    let bearer = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    c.acquire(request)
        .await
        .map(|_| ())
        .map_err(|e| (e.code(), e.message().to_string()))
}

/// A session opened with `token`, then `op` on it, raw: the refusal of
/// the open or of the request, if any.
async fn session_call(
    s: &Server,
    token: &str,
    op: baton_proto::v1::session_request::Op,
) -> Result<(), (tonic::Code, String)> {
    use baton_proto::v1::{session_request::Op, session_response::Body, OpenSession};
    let req = |id, op| baton_proto::v1::SessionRequest {
        id,
        op: Some(op),
        traceparent: String::new(),
    };
    let open = Op::Open(OpenSession {
        ttl_ms: Some(5_000),
        resume: vec![],
        batches: false,
    });
    let mut c = baton_proto::v1::leases_client::LeasesClient::connect(s.url())
        .await
        .unwrap();
    // The sender stays open until the answer: a half-close ends the stream.
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(req(1, open)).await.unwrap();
    tx.send(req(2, op)).await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let bearer = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    let status = |e: tonic::Status| (e.code(), e.message().to_string());
    let mut stream = c.session(request).await.map_err(status)?.into_inner();
    while let Some(m) = stream.message().await.map_err(status)? {
        match m.body {
            Some(Body::Error(e)) if m.id == 2 => {
                return Err((tonic::Code::from_i32(e.code), e.message));
            }
            Some(_) if m.id == 2 => return Ok(()),
            _ => {}
        }
    }
    panic!("the stream ended before request 2 was answered")
}

fn acquire_latency_count(s: &Server) -> u64 {
    let (code, text) = scrape(s, Some(READER));
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("baton_acquire_latency_seconds_count "))
        .expect("the acquire latency histogram")
        .trim()
        .parse()
        .unwrap()
}

/// One operation, one answer: the same bad input gets the same status and
/// message on a unary call and on the session stream, in the same order
/// (the gate first: a caller that is not let in learns nothing of its
/// input), and a grant feeds the acquire latency histogram on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_answers_an_operation_alike() {
    use baton_proto::v1::{session_request::Op, AcquireRequest, SessionAcquire};
    let dir = TempDir::new("gate-ops");
    let s = serve(dir.path());
    let unary =
        |resources: Vec<String>, holder: Option<String>, request_id: Vec<u8>| AcquireRequest {
            resources,
            ttl_ms: Some(5_000),
            wait_ms: 0,
            holder,
            request_id,
            first_sent_ms_ago: None,
            shapes: Vec::new(),
        };
    let streamed = |r: &AcquireRequest| {
        Op::Acquire(SessionAcquire {
            resources: r.resources.clone(),
            ttl_ms: r.ttl_ms,
            wait_ms: r.wait_ms,
            holder: r.holder.clone(),
            request_id: r.request_id.clone(),
            first_sent_ms_ago: r.first_sent_ms_ago,
            shapes: Vec::new(),
        })
    };
    let bad = [
        unary(vec![" statement:x".into()], None, vec![]),
        unary(vec!["statement:x".into()], Some("a\u{7}b".into()), vec![]),
        unary(vec!["statement:x".into()], None, vec![1, 2, 3]),
        unary(vec!["invoice:1".into()], None, vec![]),
    ];
    let mut refused = 0;
    for r in &bad {
        let a = unary_acquire(&s, BILLING, r.clone()).await.unwrap_err();
        let b = session_call(&s, BILLING, streamed(r)).await.unwrap_err();
        assert_eq!(a, b, "{r:?}");
        // Not let in: the same refusal, whatever the input.
        let a = unary_acquire(&s, "no-such-token", r.clone())
            .await
            .unwrap_err();
        let b = session_call(&s, "no-such-token", streamed(r))
            .await
            .unwrap_err();
        assert_eq!(a.0, tonic::Code::Unauthenticated, "{a:?}");
        assert_eq!(a, b, "{r:?}");
        refused += 1;
    }
    let release = Op::Release(baton_proto::v1::ReleaseRequest {
        resource: "statement:x".into(),
        acquisition_id: vec![1],
    });
    let b = session_call(&s, BILLING, release).await.unwrap_err();
    assert!(b.1.starts_with("acquisition_id is 1 bytes"), "{b:?}");

    let before = acquire_latency_count(&s);
    let ok = unary(vec!["statement:unary".into()], None, vec![]);
    unary_acquire(&s, BILLING, ok).await.unwrap();
    let ok = unary(vec!["statement:stream".into()], None, vec![]);
    session_call(&s, BILLING, streamed(&ok)).await.unwrap();
    assert_eq!(
        acquire_latency_count(&s),
        before + 2,
        "a grant counts on both transports"
    );
    println!(
        "{refused} bad inputs answered alike on both transports, with and without a principal"
    );
}
