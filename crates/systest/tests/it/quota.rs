//! Quotas against real `baton serve` processes: a tenant at its lease,
//! waiter, session, watch and rate quotas is refused naming the quota
//! while another tenant is served; the counts survive a `kill -9` and a
//! leader failover (they are the table's); a SIGHUP that lowers a quota
//! keeps what is held; a bad quota file is refused naming its line, at
//! start and at reload (the old one stays).

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, ConnectOptions, Release, Renewal};
use baton_systest as common;
use baton_testkit::pki::token_sha256;
use baton_testkit::PgDb;
use common::{Server, TempDir, BIN};

const ALPHA: &str = "alpha-token-5b1e";
const BETA: &str = "beta-token-c07d";
const TTL: Duration = Duration::from_secs(30);
const ALPHA_LEASES: &str = "leases quota of prefix \"alpha:\"";

fn auth_file() -> String {
    format!(
        r#"
[[principal]]
name = "alpha"
token_sha256 = "{}"
rules = {{ "" = ["read", "lease"] }}

[[principal]]
name = "beta"
token_sha256 = "{}"
rules = {{ "" = ["read", "lease"] }}
"#,
        token_sha256(ALPHA),
        token_sha256(BETA),
    )
}

fn quota_file(alpha_leases: u64) -> String {
    format!(
        r#"
[[prefix]]
prefix = "alpha:"
leases = {alpha_leases}
waiters = 1
watches = 1

[[prefix]]
prefix = "rated:"
rate_per_principal = {{ per_s = 1, burst = 3 }}

[[principal]]
name = "alpha"
sessions = 1
"#
    )
}

fn serve(dir: &Path) -> Server {
    let auth = dir.join("auth.toml");
    std::fs::write(&auth, auth_file()).unwrap();
    let quotas = dir.join("quotas.toml");
    std::fs::write(&quotas, quota_file(2)).unwrap();
    let flags = [
        "--auth-file",
        auth.to_str().unwrap(),
        "--quota-file",
        quotas.to_str().unwrap(),
    ];
    Server::start_logged(&BIN, &dir.join("data"), &flags, &dir.join("server.log"))
}

async fn client(url: &str, token: &str) -> Client {
    Client::connect_with(url, ConnectOptions::default().token(token).unwrap())
        .await
        .unwrap()
        .with_rpc_timeout(Duration::from_secs(5))
}

/// `/metrics` as a principal that may read everything.
fn scrape(s: &Server) -> String {
    let mut stream = std::net::TcpStream::connect(s.http).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ALPHA}\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

/// The value of `baton_quota_use` (or another quota family) for `kind`
/// and `scope`, if exported.
fn quota_metric(text: &str, family: &str, kind: &str, scope: &str) -> Option<u64> {
    let key = format!("{family}{{kind=\"{kind}\",scope=\"{scope}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
}

/// `/metrics` says "alpha:" holds `leases` leases and alpha `sessions`
/// sessions; the whole text.
fn assert_alpha_uses(s: &Server, leases: u64, sessions: u64) -> String {
    let text = scrape(s);
    let uses = (
        quota_metric(&text, "baton_quota_use", "leases", "alpha:"),
        quota_metric(&text, "baton_quota_use", "sessions", "alpha"),
    );
    assert_eq!(uses, (Some(leases), Some(sessions)), "{text}");
    text
}

/// The quota refusal `e` must be: definite, RESOURCE_EXHAUSTED, naming
/// the quota, its scope and limit.
fn assert_over(e: ClientError, quota: &str, limit: u64) {
    assert!(e.is_definite(), "{e:?}");
    let ClientError::Exhausted(message) = &e else {
        panic!("not RESOURCE_EXHAUSTED: {e:?}")
    };
    assert!(
        message.contains(quota) && message.contains(&format!("at most {limit} ")),
        "{message:?} should name {quota:?} and {limit}"
    );
}

/// An acquire of `name` that `quota` (with its `limit`) refuses.
async fn refused(c: &mut Client, name: &str, quota: &str, limit: u64) {
    let e = c
        .acquire(name, Some(TTL), Duration::ZERO)
        .await
        .unwrap_err();
    assert_over(e, quota, limit);
}

async fn granted(c: &mut Client, name: &str) -> baton_client::Lease {
    match c.acquire(name, Some(TTL), Duration::ZERO).await.unwrap() {
        Acquired::Granted(l) => l,
        other => panic!("{name} not granted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_each_quota_is_refused_naming_it_while_another_is_served() {
    let dir = TempDir::new("quota-tenants");
    let mut s = serve(dir.path());
    let url = s.url();
    let mut alpha = client(&url, ALPHA).await;
    let mut beta = client(&url, BETA).await;

    // Leases: two under "alpha:", whoever holds them; the third is refused.
    let a1 = granted(&mut alpha, "alpha:1").await;
    let _a2 = granted(&mut beta, "alpha:2").await;
    refused(&mut alpha, "alpha:3", ALPHA_LEASES, 2).await;
    // All or nothing: a multi-acquire over the quota gets nothing.
    let e = beta
        .acquire_all(&["beta:x", "alpha:4"], Some(TTL), Duration::ZERO)
        .await
        .unwrap_err();
    assert_over(e, ALPHA_LEASES, 2);
    assert_eq!(beta.status("beta:x").await.unwrap().holder_token, None);
    granted(&mut beta, "beta:1").await;

    // Waiters: one may wait on "alpha:"; the second is refused.
    let waiting = {
        let url = url.clone();
        tokio::spawn(async move {
            let mut c = client(&url, BETA).await;
            c.acquire("alpha:1", Some(TTL), Duration::from_secs(20))
                .await
        })
    };
    common::eventually(Duration::from_secs(10), async || {
        alpha.status("alpha:1").await.unwrap().n_waiters == 1
    })
    .await;
    let e = beta
        .acquire("alpha:2", Some(TTL), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_over(e, "waiters quota of prefix \"alpha:\"", 1);

    // Sessions: alpha may keep one open; beta is not bounded.
    let session = alpha.open_session(TTL).await.unwrap();
    let e = alpha.open_session(TTL).await.err().unwrap();
    assert_over(e, "sessions quota of principal \"alpha\"", 1);
    let _beta_sessions = (
        beta.open_session(TTL).await.unwrap(),
        beta.open_session(TTL).await.unwrap(),
    );

    // Watches: one of a prefix under "alpha:".
    let watch = alpha.watch("alpha:").await.unwrap();
    let e = beta.watch("alpha:jobs:").await.err().unwrap();
    assert_over(e, "watches quota of prefix \"alpha:\"", 1);
    let _beta_watch = beta.watch("beta:").await.unwrap();
    drop(watch);
    common::eventually(Duration::from_secs(10), async || {
        beta.watch("alpha:jobs:").await.is_ok()
    })
    .await;

    // Rates: alpha's reads under "rated:" run out; beta's do not.
    let mut over = None;
    for _ in 0..10 {
        if let Err(e) = alpha.status("rated:x").await {
            over = Some(e);
            break;
        }
    }
    let e = over.expect("10 reads at 1 a second with a burst of 3: one is refused");
    assert_over(e, "rate_per_principal quota of prefix \"rated:\"", 1);
    beta.status("rated:x").await.unwrap();

    // The CLI's exit code for a quota (and every RESOURCE_EXHAUSTED) is 7.
    let token = dir.path().join("alpha.token");
    std::fs::write(&token, ALPHA).unwrap();
    let out = common::cli(&[
        "acquire",
        "alpha:5",
        "--server",
        &url,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(ALPHA_LEASES));

    let text = assert_alpha_uses(&s, 2, 1);
    assert_eq!(
        quota_metric(&text, "baton_quota_limit", "leases", "alpha:"),
        Some(2)
    );
    assert!(quota_metric(&text, "baton_quota_refusals_total", "leases", "alpha:").unwrap() >= 3);

    // After a kill -9, the counts are the table's again: still two leases
    // under "alpha:" (the waiter went with the crash), one session of alpha.
    waiting.abort();
    s.restart();
    let mut alpha = client(&url, ALPHA).await;
    assert_alpha_uses(&s, 2, 1);
    refused(&mut alpha, "alpha:3", ALPHA_LEASES, 2).await;
    assert!(matches!(
        alpha.release("alpha:1", &a1.acquisition_id).await.unwrap(),
        Release::Released { .. }
    ));
    granted(&mut alpha, "alpha:3").await;
    drop(session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_below_use_keeps_what_is_held_and_a_bad_file_keeps_the_old_one() {
    let dir = TempDir::new("quota-reload");
    let s = serve(dir.path());
    let log = dir.path().join("server.log");
    let quotas = dir.path().join("quotas.toml");
    let mut alpha = client(&s.url(), ALPHA).await;
    let a1 = granted(&mut alpha, "alpha:1").await;
    let a2 = granted(&mut alpha, "alpha:2").await;
    let hup = async |needle: &str| common::sighup_until(&s, &log, needle).await;

    std::fs::write(&quotas, quota_file(1)).unwrap();
    hup("quota file reloaded").await;
    refused(&mut alpha, "alpha:3", ALPHA_LEASES, 1).await;
    // What is held stays held, and renews.
    assert!(matches!(
        alpha.renew("alpha:1", &a1.acquisition_id).await.unwrap(),
        Renewal::Renewed { .. }
    ));
    alpha.release("alpha:2", &a2.acquisition_id).await.unwrap();
    refused(&mut alpha, "alpha:3", ALPHA_LEASES, 1).await;

    // A file with an unknown key: the log names the line, the quota of 1 stays.
    std::fs::write(&quotas, "[[prefix]]\nprefix = \"alpha:\"\nlease = 9\n").unwrap();
    hup("quota file not reloaded").await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("line 3") && text.contains("unknown field `lease`"),
        "{text}"
    );
    refused(&mut alpha, "alpha:3", ALPHA_LEASES, 1).await;
    alpha.release("alpha:1", &a1.acquisition_id).await.unwrap();
    granted(&mut alpha, "alpha:3").await;

    // At start, the same file stops the server with the line and the rule.
    let data = dir.path().join("other");
    let stderr = refused_at_start(&data, &quotas, &[]);
    assert!(
        stderr.contains("line 3") && stderr.contains("unknown field `lease`"),
        "{stderr}"
    );
    // Waiter quotas that do not fit in --max-waiters are refused, naming both.
    std::fs::write(&quotas, "[[prefix]]\nprefix = \"a:\"\nwaiters = 11\n").unwrap();
    let stderr = refused_at_start(&data, &quotas, &["--max-waiters", "10"]);
    assert!(
        stderr.contains("add up to 11") && stderr.contains("--max-waiters 10"),
        "{stderr}"
    );
}

/// `baton serve` with the quota file `quotas` (and `extra` flags) must
/// not start: exit 2; its stderr.
fn refused_at_start(data: &Path, quotas: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ];
    args.extend(["--data-dir", data.to_str().unwrap()]);
    args.extend(["--quota-file", quotas.to_str().unwrap()]);
    args.extend(extra);
    let out = common::cli(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counts_after_a_leader_failover_are_the_tables() {
    let db = PgDb::create("quota_failover").await;
    let dir = TempDir::new("quota-failover");
    let quotas = dir.path().join("quotas.toml");
    std::fs::write(&quotas, "[[prefix]]\nprefix = \"t:\"\nleases = 3\n").unwrap();
    let mut cluster =
        common::Cluster::start_with(&db.url, 3, &["--quota-file", quotas.to_str().unwrap()]);
    let leader = cluster.wait_leader(None).await;
    let mut c = Client::connect(&cluster.endpoints())
        .await
        .unwrap()
        .with_rpc_timeout(Duration::from_secs(5));
    let held = granted(&mut c, "t:1").await;
    granted(&mut c, "t:2").await;
    let e = c
        .acquire_all(&["t:3", "t:4"], Some(TTL), Duration::ZERO)
        .await
        .unwrap_err();
    assert_over(e, "leases quota of prefix \"t:\"", 3);
    cluster.nodes[leader].kill9();
    let new_leader = cluster.wait_leader(Some(leader)).await;
    // The new leader counted the two leases it loaded: one more fits, not two.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let granted_after = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no grant within 30 s of the failover"
        );
        match c.acquire("t:3", Some(TTL), Duration::ZERO).await {
            Ok(Acquired::Granted(l)) => break l,
            Ok(other) => panic!("t:3 is free: {other:?}"),
            Err(e) if !e.is_definite() => continue,
            Err(e) => {
                if matches!(e, ClientError::Exhausted(_)) {
                    panic!("the new leader counted more than the table holds: {e:?}");
                }
                continue;
            }
        }
    };
    assert!(granted_after.token > held.token);
    refused(&mut c, "t:4", "leases quota of prefix \"t:\"", 3).await;
    let text = cluster.nodes[new_leader].http_get("/metrics");
    assert_eq!(
        quota_metric(&text, "baton_quota_use", "leases", "t:"),
        Some(3),
        "{text}"
    );
}
