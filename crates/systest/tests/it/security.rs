//! TLS, authentication, per-prefix permissions and the audit log, against
//! a real `baton serve` process over TLS with certificates made here.
//!
//! - the authorization matrix: principals × actions × resources inside and
//!   outside their prefixes, every cell asserted;
//! - TLS refusals (wrong CA, expired certificates, a client certificate of
//!   an unknown CA, plain text on the TLS port), each with a clear error
//!   while the server keeps serving;
//! - wrong tokens never reach the logs;
//! - a session id alone does not let another principal resume (or close)
//!   a session holding leases outside its rules;
//! - SIGHUP: a removed permission applies to the next call, the held
//!   lease is untouched until it expires, and a session's heartbeats no
//!   longer keep a lease its principal may not hold.

use std::path::Path;
use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, ConnectOptions, Renewal};
use baton_core::AcquisitionId;
use baton_systest as common;
use baton_testkit::pki::{token_sha256, Ca, Pair};
use common::{Server, TempDir, BIN};

const TOKENS: [(&str, &str); 3] = [
    ("billing", "billing-token-7f3a"),
    ("reader", "reader-token-21c9"),
    ("fencer", "fencer-token-99e0"),
];

fn token(name: &str) -> &'static str {
    TOKENS.iter().find(|(n, _)| *n == name).unwrap().1
}

/// `ops` has no token: it is proven by its client certificate's name.
fn auth_file(billing_rules: &str) -> String {
    format!(
        r#"
[[principal]]
name = "billing"
token_sha256 = "{}"
rules = {billing_rules}

[[principal]]
name = "reader"
token_sha256 = "{}"
rules = {{ "" = ["read"] }}

[[principal]]
name = "fencer"
token_sha256 = "{}"
rules = {{ "statement:" = ["fence"] }}

[[principal]]
name = "ops"
rules = {{ "" = ["read", "fence", "admin"] }}
"#,
        token_sha256(token("billing")),
        token_sha256(token("reader")),
        token_sha256(token("fencer")),
    )
}

const BILLING_RULES: &str = r#"{ "statement:" = ["read", "lease"] }"#;

struct Pki {
    ca: Ca,
    server: Pair,
    /// CN `stranger`: no principal of that name (callers with a token).
    stranger: Pair,
    /// CN `ops`: a principal.
    ops: Pair,
}

fn pki(dir: &Path) -> Pki {
    let ca = Ca::new(dir, "ca");
    Pki {
        server: ca.server("server", false),
        stranger: ca.client("stranger", "stranger", false),
        ops: ca.client("ops", "ops", false),
        ca,
    }
}

/// The serve flags for TLS, client certificates of `pki`'s CA and `auth`.
fn guard_flags(pki: &Pki, auth: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_str().unwrap().to_string();
    vec![
        "--tls-cert".into(),
        path(&pki.server.cert),
        "--tls-key".into(),
        path(&pki.server.key),
        "--tls-client-ca".into(),
        path(&pki.ca.cert),
        "--auth-file".into(),
        path(auth),
    ]
}

fn serve(dir: &Path, pki: &Pki, auth: &Path, log: &Path) -> Server {
    std::fs::write(auth, auth_file(BILLING_RULES)).unwrap();
    let data = dir.join("data");
    let audit = dir.join("audit.jsonl");
    let mut flags = guard_flags(pki, auth);
    flags.extend(["--require-auth".into(), "--audit-log".into()]);
    flags.push(audit.to_str().unwrap().to_string());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Server::start_logged(&BIN, &data, &flags, log)
}

fn options(ca: &Path, cert: &Pair, token: Option<&str>) -> ConnectOptions {
    let read = |p: &Path| std::fs::read(p).unwrap();
    let options = ConnectOptions::default()
        .ca_pem(&read(ca))
        .identity_pem(&read(&cert.cert), &read(&cert.key));
    match token {
        Some(t) => options.token(t).unwrap(),
        None => options,
    }
}

/// Who calls, and how it proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Billing,
    Reader,
    Fencer,
    /// By client certificate.
    Ops,
    WrongToken,
    /// A certificate of no principal and no token.
    Nobody,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Acquire,
    Renew,
    Release,
    Status,
    List,
    Fence,
    SessionAcquire,
    Backup,
    ClusterStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Unauthenticated,
}

/// The matrix as the auth file above means it.
fn expected(who: Who, action: Action, inside: bool) -> Outcome {
    use Action::*;
    use Outcome::*;
    let allowed = match who {
        Who::WrongToken | Who::Nobody => return Unauthenticated,
        Who::Billing => {
            inside
                && matches!(
                    action,
                    Acquire | Renew | Release | Status | List | SessionAcquire
                )
        }
        Who::Reader => matches!(action, Status | List),
        Who::Fencer => inside && action == Fence,
        Who::Ops => matches!(action, Status | List | Fence | Backup | ClusterStatus),
    };
    if allowed {
        Allowed
    } else {
        Denied
    }
}

fn outcome<T: std::fmt::Debug>(r: Result<T, ClientError>, cell: &str) -> (Outcome, String) {
    match r {
        Ok(_) => (Outcome::Allowed, String::new()),
        Err(ClientError::PermissionDenied(m)) => (Outcome::Denied, m),
        Err(ClientError::Unauthenticated(m)) => (Outcome::Unauthenticated, m),
        Err(e) => panic!("{cell}: not an auth outcome: {e:?}"),
    }
}

async fn client_for(url: &str, pki: &Pki, who: Who) -> Client {
    let o = match who {
        Who::Billing => options(&pki.ca.cert, &pki.stranger, Some(token("billing"))),
        Who::Reader => options(&pki.ca.cert, &pki.stranger, Some(token("reader"))),
        Who::Fencer => options(&pki.ca.cert, &pki.stranger, Some(token("fencer"))),
        Who::Ops => options(&pki.ca.cert, &pki.ops, None),
        Who::WrongToken => options(&pki.ca.cert, &pki.ops, Some("not-a-token-of-anyone")),
        Who::Nobody => options(&pki.ca.cert, &pki.stranger, None),
    };
    Client::connect_with(url, o).await.unwrap()
}

/// One call of `action` on `resource` by `client`; an allowed renew or
/// release uses a random acquisition id (the answer is "not owner").
async fn call(client: &mut Client, action: Action, resource: &str) -> Result<(), ClientError> {
    let ttl = Duration::from_secs(5);
    let id = AcquisitionId::from_bytes([7; 16]);
    match action {
        Action::Acquire => {
            if let Acquired::Granted(l) =
                client.acquire(resource, Some(ttl), Duration::ZERO).await?
            {
                client.release(&l.resource, &l.acquisition_id).await?;
            }
        }
        Action::Renew => drop(client.renew(resource, &id).await?),
        Action::Release => drop(client.release(resource, &id).await?),
        Action::Status => drop(client.status(resource).await?),
        Action::List => {
            let prefix = resource.split_inclusive(':').next().unwrap();
            drop(client.list(prefix, None, 10).await?)
        }
        Action::Fence => drop(client.fence(resource).await?),
        Action::SessionAcquire => {
            let session = client.open_session(ttl).await?;
            let out = session.acquire(resource, Duration::ZERO).await;
            let _ = session.close().await;
            drop(out?)
        }
        Action::Backup => drop(client.backup().await?),
        Action::ClusterStatus => drop(client.cluster_status().await?),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_authorization_matrix() {
    let dir = TempDir::new("security-matrix");
    let pki = pki(dir.path());
    let log = dir.path().join("server.log");
    let server = serve(dir.path(), &pki, &dir.path().join("auth.toml"), &log);
    let url = server.https_url();
    let whos = [
        Who::Billing,
        Who::Reader,
        Who::Fencer,
        Who::Ops,
        Who::WrongToken,
        Who::Nobody,
    ];
    let actions = [
        Action::Acquire,
        Action::Renew,
        Action::Release,
        Action::Status,
        Action::List,
        Action::Fence,
        Action::SessionAcquire,
        Action::Backup,
        Action::ClusterStatus,
    ];
    // A resource held by someone else, to see that a refusal says nothing
    // of the holder: its message is the same as for a free one.
    let mut holder = client_for(&url, &pki, Who::Billing).await;
    let held = match holder
        .acquire(
            "statement:held",
            Some(Duration::from_secs(60)),
            Duration::ZERO,
        )
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    let mut cells = 0;
    let mut tally = [0usize; 3];
    for who in whos {
        let mut client = client_for(&url, &pki, who).await;
        for action in actions {
            for inside in [true, false] {
                let resource = if inside { "statement:1" } else { "invoice:1" };
                let cell = format!("{who:?} × {action:?} × {resource}");
                let (got, message) = outcome(call(&mut client, action, resource).await, &cell);
                assert_eq!(got, expected(who, action, inside), "{cell}: {message}");
                tally[got as usize] += 1;
                cells += 1;
                if got == Outcome::Denied {
                    assert!(
                        message.contains("may not") && message.contains("rule"),
                        "{cell}: the message names the rule: {message}"
                    );
                    if action != Action::Backup
                        && action != Action::ClusterStatus
                        && action != Action::List
                    {
                        // Same refusal for a held resource: nothing leaks.
                        let (again, held_message) =
                            outcome(call(&mut client, action, "statement:held").await, &cell);
                        if again == Outcome::Denied {
                            assert_eq!(
                                held_message.replace("statement:held", "X"),
                                call_message(&message, resource),
                                "{cell}: a refusal reveals nothing of the holder"
                            );
                            assert!(!held_message.contains(&held.token.get().to_string()));
                        }
                    }
                }
            }
        }
    }
    println!(
        "authorization matrix: {cells} cells ({} principals × {} actions × 2 resources): {} allowed, {} permission denied, {} unauthenticated",
        whos.len(),
        actions.len(),
        tally[0],
        tally[1],
        tally[2]
    );
    assert_eq!(cells, 108);
    // The audit log has the fences and backups, and every refusal, by principal.
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let count = |f: &dyn Fn(&serde_json::Value) -> bool| lines.iter().filter(|l| f(l)).count();
    assert!(
        count(&|l| l["action"] == "fence"
            && l["outcome"] == "ok"
            && l["principal"] == "ops"
            && l["resource"] == "invoice:1"
            && l["token"].as_u64().is_some())
            == 1,
        "ops's fence of invoice:1 is audited with its token: {audit}"
    );
    assert_eq!(
        count(&|l| l["action"] == "backup" && l["outcome"] == "ok"),
        2
    );
    assert!(count(&|l| l["outcome"] == "permission_denied") >= tally[1]);
    assert!(count(&|l| l["outcome"] == "unauthenticated") >= tally[2]);
    // Guessing: past 64 failures from one address, refusals wait (a timer,
    // not the CPU); the correct clients above were never delayed.
    let guesser = client_for(&url, &pki, Who::WrongToken).await;
    let guesses: Vec<_> = (0..80)
        .map(|_| {
            let mut c = guesser.clone();
            tokio::spawn(async move { c.status("statement:1").await })
        })
        .collect();
    for g in guesses {
        assert!(matches!(
            g.await.unwrap(),
            Err(ClientError::Unauthenticated(_))
        ));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("repeated authentication failures from this address"),
        "the penalty engaged and said so once"
    );
    for (_, t) in TOKENS {
        assert!(
            !log.contains(t) && !audit.contains(t),
            "a token in the logs"
        );
    }
    assert!(!log.contains("not-a-token-of-anyone") && !audit.contains("not-a-token-of-anyone"));
    drop(server);
}

/// The refusal message for `resource`, with the name replaced by `X`.
fn call_message(message: &str, resource: &str) -> String {
    message.replace(resource, "X")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_are_refused_clearly_and_the_server_keeps_serving() {
    let dir = TempDir::new("security-tls");
    let pki = pki(dir.path());
    let log = dir.path().join("server.log");
    let server = serve(dir.path(), &pki, &dir.path().join("auth.toml"), &log);
    let url = server.https_url();
    let other = Ca::new(dir.path(), "other-ca");
    let rogue = other.client("rogue", "ops", false);
    let expired_client = pki.ca.client("expired-client", "ops", true);
    let good = || options(&pki.ca.cert, &pki.ops, None);
    let still_serving = || async {
        let mut c = Client::connect_with(&url, good()).await.unwrap();
        c.status("statement:1")
            .await
            .expect("a good client is served");
    };
    still_serving().await;

    // The client does not trust the server's CA.
    let e = Client::connect_with(&url, options(&other.cert, &pki.ops, None))
        .await
        .unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
    assert!(m.contains("UnknownIssuer") && m.contains("--tls-ca"), "{m}");
    still_serving().await;

    // A client certificate of another CA, and an expired one.
    for (pair, says) in [(&rogue, "UnknownIssuer"), (&expired_client, "expired")] {
        let mut c = Client::connect_with(&url, options(&pki.ca.cert, pair, None))
            .await
            .unwrap();
        let e = c.status("statement:1").await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ClientError::Unauthenticated(_)), "{e:?}");
        assert!(
            m.contains("client certificate was refused") && m.contains(says),
            "{m}"
        );
        still_serving().await;
    }

    // No client certificate at all.
    let no_cert = ConnectOptions::default().ca_pem(&std::fs::read(&pki.ca.cert).unwrap());
    let mut c = Client::connect_with(&url, no_cert).await.unwrap();
    let e = c.status("statement:1").await.unwrap_err();
    assert!(
        e.to_string().contains("requires a client certificate"),
        "{e}"
    );

    // Plain text on the TLS port: the server waits for a TLS hello, so
    // the dial ends, definite, naming the likely cause.
    let plain = format!("http://{}", server.grpc);
    let e = Client::connect(&plain).await.unwrap_err();
    let m = e.to_string();
    assert!(e.is_definite(), "{e:?}");
    assert!(m.contains("a TLS port") && m.contains("https://"), "{m}");
    still_serving().await;

    // An expired server certificate.
    let expired_server = pki.ca.server("expired-server", true);
    let dir2 = TempDir::new("security-tls-expired");
    let expired = Server::start(
        &BIN,
        dir2.path(),
        &[
            "--tls-cert",
            expired_server.cert.to_str().unwrap(),
            "--tls-key",
            expired_server.key.to_str().unwrap(),
        ],
    );
    let e = Client::connect_with(&expired.https_url(), good())
        .await
        .unwrap_err();
    let m = e.to_string();
    assert!(m.contains("certificate expired"), "{m}");

    // And the HTTP port: plain text is told to use TLS; /healthz stays
    // open, /metrics needs a principal with `read` on every name.
    let answer = server.http_get("/healthz");
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("requires TLS"),
        "{answer}"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reload_applies_to_the_next_call_and_leaves_held_leases() {
    let dir = TempDir::new("security-reload");
    let pki = pki(dir.path());
    let auth = dir.path().join("auth.toml");
    let log = dir.path().join("server.log");
    let server = serve(dir.path(), &pki, &auth, &log);
    let url = server.https_url();
    let mut billing = client_for(&url, &pki, Who::Billing).await;
    let mut ops = client_for(&url, &pki, Who::Ops).await;
    let ttl = Duration::from_millis(1_500);
    let Acquired::Granted(lease) = billing
        .acquire("statement:7", Some(ttl), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    // And a lease tied to a session, kept by heartbeats alone.
    let session = billing.open_session(ttl).await.unwrap();
    let Acquired::Granted(bound) = session
        .acquire("statement:9", Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };

    // A file that does not parse changes nothing.
    std::fs::write(&auth, "[[principal]]\nname = 3").unwrap();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    common::eventually(Duration::from_secs(5), async || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("auth file not reloaded")
    })
    .await;
    assert!(matches!(
        billing.renew("statement:7", &lease.acquisition_id).await,
        Ok(Renewal::Renewed { .. })
    ));

    // billing loses `lease` on statement:, keeps `read`.
    std::fs::write(&auth, auth_file(r#"{ "statement:" = ["read"] }"#)).unwrap();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    common::eventually(Duration::from_secs(5), async || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("auth file reloaded")
    })
    .await;
    let e = billing
        .acquire("statement:8", Some(ttl), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::PermissionDenied(_)), "{e:?}");
    let e = billing
        .renew("statement:7", &lease.acquisition_id)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::PermissionDenied(_)), "{e:?}");
    // The held lease is untouched: same token, still held...
    let st = billing.status("statement:7").await.unwrap();
    assert_eq!(st.holder_token, Some(lease.token));
    let st = billing.status("statement:9").await.unwrap();
    assert_eq!(st.holder_token, Some(bound.token));
    // ...until it expires on its own (no renewals can reach it now).
    common::eventually(Duration::from_secs(10), async || {
        ops.status("statement:7")
            .await
            .unwrap()
            .holder_token
            .is_none()
    })
    .await;
    // The session's heartbeats no longer keep its lease either: the first
    // one under the new rules is refused and ends the stream, resuming is
    // refused, and the session with its lease runs out like a lease.
    common::eventually(Duration::from_secs(10), async || {
        session.state().health == baton_client::Health::Ended
    })
    .await;
    assert_eq!(ops.status("statement:9").await.unwrap().holder_token, None);
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"session_heartbeat\"") && l.contains("permission_denied")),
        "the refused heartbeat is audited:\n{audit}"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_only_for_a_principal_that_may_hold_its_leases() {
    let dir = TempDir::new("security-resume");
    let pki = pki(dir.path());
    let auth = dir.path().join("auth.toml");
    let log = dir.path().join("server.log");
    let server = serve(dir.path(), &pki, &auth, &log);
    let url = server.https_url();
    let billing = client_for(&url, &pki, Who::Billing).await;
    let session = billing.open_session(Duration::from_secs(30)).await.unwrap();
    let Acquired::Granted(lease) = session
        .acquire("statement:20", Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let id = session.id();

    // Principals without `lease` on statement:20, holding the session id,
    // are refused before anything changes, with a message that does not
    // say what the session holds.
    for who in [Who::Reader, Who::Fencer, Who::Ops] {
        let other = client_for(&url, &pki, who).await;
        match other.resume_session(id).await {
            Err(ClientError::PermissionDenied(m)) => {
                assert!(
                    m.contains("only with `lease` on every resource it holds"),
                    "{who:?}: {m}"
                );
                assert!(!m.contains("statement:20"), "{who:?}: {m}");
            }
            other => panic!("{who:?}: resume must be refused, got {other:?}"),
        }
    }
    let wrong = client_for(&url, &pki, Who::WrongToken).await;
    assert!(matches!(
        wrong.resume_session(id).await,
        Err(ClientError::Unauthenticated(_))
    ));

    // The session is untouched: its holder keeps the lease and the stream.
    let mut status = client_for(&url, &pki, Who::Reader).await;
    let st = status.status("statement:20").await.unwrap();
    assert_eq!(st.holder_token, Some(lease.token));
    assert!(matches!(
        session
            .renew("statement:20", &lease.acquisition_id)
            .await
            .unwrap(),
        Renewal::Renewed { .. }
    ));

    // Only the principal that opened a session (or an administrator) may
    // keep it alive: not even an empty one can be resumed by another
    // principal that learned its id.
    let empty = billing.open_session(Duration::from_secs(30)).await.unwrap();
    let reader = client_for(&url, &pki, Who::Reader).await;
    match reader.resume_session(empty.id()).await {
        Err(ClientError::PermissionDenied(m)) => {
            assert!(m.contains("only by the principal that opened it"), "{m}");
        }
        other => panic!("resuming another's session must be refused, got {other:?}"),
    }
    // `ops` holds `admin` on every name: it may resume (and close) a
    // session that holds nothing it may not hold.
    let ops = client_for(&url, &pki, Who::Ops).await;
    let rescued = ops.resume_session(empty.id()).await.unwrap();
    assert!(rescued.close().await.unwrap());
    assert!(matches!(
        ops.resume_session(empty.id()).await,
        Err(ClientError::SessionEnded)
    ));

    // The same principal on another connection resumes it and can end it.
    let again = client_for(&url, &pki, Who::Billing).await;
    let resumed = again.resume_session(id).await.unwrap();
    assert_eq!(resumed.id(), id);
    assert!(resumed.close().await.unwrap(), "the session was open");
    let st = status.status("statement:20").await.unwrap();
    assert_eq!(st.holder_token, None, "closing released its lease");
    assert!(matches!(
        again.resume_session(id).await,
        Err(ClientError::SessionEnded)
    ));
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let refused = audit
        .lines()
        .filter(|l| l.contains("\"session_open\"") && l.contains("denied"))
        .count();
    assert_eq!(refused, 4, "one audit line per refused resume:\n{audit}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_follows_its_leader_and_keeps_the_rules() {
    let db = baton_testkit::PgDb::create("security_cluster").await;
    let dir = TempDir::new("security-cluster");
    let pki = pki(dir.path());
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, auth_file(BILLING_RULES)).unwrap();
    let spawn = |listen: &str| {
        let mut extra: Vec<String> = ["--store", &db.url, "--leader-ttl", "1s"]
            .map(String::from)
            .to_vec();
        extra.extend(guard_flags(&pki, &auth));
        Server::spawn(&BIN, listen, dir.path(), extra).unwrap_or_else(|e| panic!("{e}"))
    };
    let mut nodes: Vec<Server> = (0..2)
        .map(|_| {
            spawn(&format!(
                "127.0.0.1:{}",
                baton_testkit::pg_cluster::free_port()
            ))
        })
        .collect();
    // Who leads, asked as ops (admin on everything) over TLS.
    let leader_of = |nodes: &[Server]| {
        let urls: Vec<String> = nodes.iter().map(|n| n.https_url()).collect();
        let ca = pki.ca.cert.clone();
        let ops = pki.ops.clone();
        async move {
            let mut found = None;
            common::eventually(Duration::from_secs(30), async || {
                for (i, url) in urls.iter().enumerate() {
                    let Ok(mut c) = Client::connect_with(url, options(&ca, &ops, None)).await
                    else {
                        continue;
                    };
                    if let Ok(s) = c.cluster_status().await {
                        if s.role == "leader" {
                            found = Some(i);
                            return true;
                        }
                    }
                }
                false
            })
            .await;
            found.unwrap()
        }
    };
    let leader = leader_of(&nodes).await;
    let follower = 1 - leader;
    // billing names the follower first: the follower checks its token and
    // rules, names the leader (https, its advertised address), and the
    // client follows with the same TLS settings.
    let urls = format!(
        "{},{}",
        nodes[follower].https_url(),
        nodes[leader].https_url()
    );
    let billing = options(&pki.ca.cert, &pki.stranger, Some(token("billing")));
    let mut c = Client::connect_with(&urls, billing.clone()).await.unwrap();
    let Acquired::Granted(first) = c
        .acquire(
            "statement:c1",
            Some(Duration::from_secs(30)),
            Duration::ZERO,
        )
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let e = c
        .acquire("invoice:c1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::PermissionDenied(_)), "{e:?}");
    let mut wrong = Client::connect_with(
        &nodes[follower].https_url(),
        options(&pki.ca.cert, &pki.stranger, Some("nobody-knows-this")),
    )
    .await
    .unwrap();
    let e = wrong.status("statement:c1").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Unauthenticated(_)),
        "a follower refuses before it names the leader: {e:?}"
    );

    // The leader dies; the follower takes over, and the same client's
    // next calls reach it, over TLS, under the same rules.
    nodes[leader].kill9();
    let survivors = std::slice::from_ref(&nodes[follower]);
    leader_of(survivors).await;
    let mut next = None;
    common::eventually(Duration::from_secs(30), async || {
        match c
            .acquire(
                "statement:c1",
                Some(Duration::from_secs(30)),
                Duration::ZERO,
            )
            .await
        {
            Ok(a) => {
                next = Some(a);
                true
            }
            Err(_) => false,
        }
    })
    .await;
    match next.unwrap() {
        // Still held for a full TTL after the failover (as leases are).
        Acquired::NotAcquired(n) => assert_eq!(n.holder_token, Some(first.token)),
        Acquired::Granted(l) => panic!("a lease held across the failover was granted again: {l:?}"),
    }
    let e = c
        .acquire("invoice:c2", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::PermissionDenied(_)), "{e:?}");
    drop(nodes);
}

/// SIGHUP reloads the server certificate and key: new connections get the
/// new certificate, a connection made before keeps working, and a file
/// that does not parse or a key that does not match the certificate is
/// logged while the certificate in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_server_certificate_and_keeps_it_on_a_bad_file() {
    let dir = TempDir::new("tls-rotate");
    let old_ca = Ca::new(dir.path(), "old-ca");
    let new_ca = Ca::new(dir.path(), "new-ca");
    let old = old_ca.server("old-server", false);
    let new = new_ca.server("new-server", false);
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&old.cert, &cert).unwrap();
    std::fs::copy(&old.key, &key).unwrap();
    let log = dir.path().join("server.log");
    let s = Server::start_logged(
        &BIN,
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &log,
    );
    let trusting = |ca: &Path| ConnectOptions::default().ca_pem(&std::fs::read(ca).unwrap());
    let works = async |ca: &Path, name: &str| -> Result<(), String> {
        let mut c = Client::connect_with(&s.https_url(), trusting(ca))
            .await
            .map_err(|e| e.to_string())?;
        c.acquire(name, Some(Duration::from_secs(30)), Duration::ZERO)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let mut before = Client::connect_with(&s.https_url(), trusting(&old_ca.cert))
        .await
        .unwrap();
    assert!(matches!(
        before
            .acquire("rotate:0", Some(Duration::from_secs(30)), Duration::ZERO)
            .await,
        Ok(Acquired::Granted(_))
    ));
    let hup = async |needle: &str| common::sighup_until(&s, &log, needle).await;

    std::fs::copy(&new.cert, &cert).unwrap();
    std::fs::copy(&new.key, &key).unwrap();
    hup("TLS certificate, key and client CA reloaded").await;
    let e = works(&old_ca.cert, "rotate:1").await.unwrap_err();
    assert!(
        e.to_lowercase().contains("certificate") || e.contains("UnknownIssuer"),
        "{e}"
    );
    works(&new_ca.cert, "rotate:2").await.unwrap();
    assert!(
        before
            .acquire("rotate:3", Some(Duration::from_secs(30)), Duration::ZERO)
            .await
            .is_ok(),
        "a connection made before the reload keeps its certificate"
    );

    // A file that does not parse, then a key of another certificate: each
    // is logged, and the new certificate stays in force.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    hup("TLS material not reloaded").await;
    works(&new_ca.cert, "rotate:4").await.unwrap();
    std::fs::copy(&new.cert, &cert).unwrap();
    std::fs::copy(&old.key, &key).unwrap();
    hup("TLS material not reloaded").await;
    works(&new_ca.cert, "rotate:5").await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("--tls-cert"),
        "the log names the file: {text}"
    );
    assert!(
        text.contains("do not make a usable pair"),
        "and the mismatch: {text}"
    );
}
