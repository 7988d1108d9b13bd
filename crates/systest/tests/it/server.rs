//! Integration tests against a real `baton serve` process over loopback.

use std::time::Duration;

use baton_client::{Acquired, AcquiredAll, Client, ClientError, Release, Renewal};
use baton_systest as common;
use common::{cli, eventually, json_lease_str, json_lease_u64, json_u64, Server, TempDir};

const TTL: Duration = Duration::from_secs(30);
const NO_WAIT: Duration = Duration::ZERO;

async fn client(s: &Server) -> Client {
    Client::connect(&s.url()).await.unwrap()
}

fn granted(a: Acquired) -> baton_client::Lease {
    match a {
        Acquired::Granted(l) => l,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn exclusion_and_canonical_names() {
    let dir = TempDir::new("excl");
    let s = common::serve(dir.path(), &[]);
    let (mut a, mut b) = (client(&s).await, client(&s).await);
    // "e" + combining accent and the precomposed "é" name one resource.
    let lease = granted(
        a.acquire("report:caf\u{65}\u{301}", Some(TTL), NO_WAIT)
            .await
            .unwrap(),
    );
    assert_eq!(lease.resource, "report:caf\u{e9}");
    assert_eq!(lease.ttl, TTL);
    match b
        .acquire("report:caf\u{e9}", Some(TTL), NO_WAIT)
        .await
        .unwrap()
    {
        Acquired::NotAcquired(n) => {
            assert!(!n.timed_out);
            assert_eq!(n.holder_token, Some(lease.token));
        }
        other => panic!("second holder granted: {other:?}"),
    }
    let status = b.status("report:café").await.unwrap();
    assert_eq!(status.holder_token, Some(lease.token));
    assert!(status.remaining <= TTL && status.remaining > TTL - Duration::from_secs(5));
}

#[tokio::test]
async fn the_logs_take_the_size_asked_for() {
    let dir = TempDir::new("log-size");
    let s = common::serve(dir.path(), &["--log-size-mib", "2"]);
    let mut c = client(&s).await;
    granted(c.acquire("sized", Some(TTL), NO_WAIT).await.unwrap());
    for log in ["baton.wal", "baton.wal2"] {
        let len = std::fs::metadata(dir.path().join(log)).unwrap().len();
        assert_eq!(len, 2 << 20, "{log}");
    }
}

/// A fault on a transparent huge page zeroes 2 MiB while the faulting
/// thread waits (docs/performance.md): `baton serve` turns them off.
#[tokio::test]
async fn the_server_runs_without_transparent_huge_pages() {
    let dir = TempDir::new("no-thp");
    let s = common::serve(dir.path(), &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.proc.pid())).unwrap();
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("Linux 5.0 or later reports THP_enabled in /proc/PID/status");
    assert_eq!(
        thp.trim(),
        "0",
        "transparent huge pages are on in the server"
    );
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order_with_higher_tokens() {
    let dir = TempDir::new("fifo");
    let s = common::serve(dir.path(), &[]);
    let mut holder = client(&s).await;
    let first = granted(holder.acquire("q", Some(TTL), NO_WAIT).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..3u64 {
        let mut c = client(&s).await;
        tasks.push(tokio::spawn(async move {
            (
                i,
                c.acquire("q", Some(TTL), Duration::from_secs(20))
                    .await
                    .unwrap(),
            )
        }));
        let mut probe = client(&s).await;
        // Queue them one by one so that arrival order is known.
        eventually(Duration::from_secs(5), async || {
            let mut probe = probe.clone();
            probe.status("q").await.unwrap().n_waiters == i + 1
        })
        .await;
        let _ = &mut probe;
    }
    let mut previous = first.clone();
    for task in tasks {
        holder
            .release(&previous.resource, &previous.acquisition_id)
            .await
            .unwrap();
        let (i, acquired) = task.await.unwrap();
        let lease = granted(acquired);
        assert!(
            lease.token > previous.token,
            "waiter {i}: token {} not above {}",
            lease.token,
            previous.token
        );
        previous = lease;
    }
}

/// The server's timer sleeps towards the table's next deadline. A lease
/// granted with a shorter TTL than every other must wake it: with nothing
/// else arriving, a waiter gets the short lease when it expires, not when
/// the timer would next have woken (the long lease's expiry, or the wait's
/// own end 20 s later).
#[tokio::test]
async fn a_short_lease_expires_on_time_behind_a_long_one() {
    let dir = TempDir::new("rearm");
    let s = common::serve(dir.path(), &[]);
    let mut holder = client(&s).await;
    let _long = granted(
        holder
            .acquire("rearm:long", Some(Duration::from_secs(60)), NO_WAIT)
            .await
            .unwrap(),
    );
    let short_ttl = Duration::from_millis(300);
    // Counted from before the request is sent: the server granted it no
    // earlier, and its TTL runs from the grant (taking the time after the
    // answer came would count the answer's trip against the TTL).
    let sent = std::time::Instant::now();
    let short = granted(
        holder
            .acquire("rearm:short", Some(short_ttl), NO_WAIT)
            .await
            .unwrap(),
    );
    let mut waiter = client(&s).await;
    let next = granted(
        waiter
            .acquire("rearm:short", Some(TTL), Duration::from_secs(20))
            .await
            .unwrap(),
    );
    let waited = sent.elapsed();
    assert!(next.token > short.token);
    assert!(
        waited >= short_ttl,
        "handed on after {waited:?}, before the TTL"
    );
    assert!(
        waited < Duration::from_secs(5),
        "handed on after {waited:?}: the timer was not woken for the earlier deadline"
    );
}

#[tokio::test]
async fn wait_runs_out_and_a_gone_waiter_leaves_the_queue() {
    let dir = TempDir::new("wait");
    let s = common::serve(dir.path(), &[]);
    let mut a = client(&s).await;
    granted(a.acquire("w", Some(TTL), NO_WAIT).await.unwrap());
    match a
        .acquire("w", Some(TTL), Duration::from_millis(200))
        .await
        .unwrap()
    {
        Acquired::NotAcquired(n) => assert!(n.timed_out),
        other => panic!("{other:?}"),
    }
    let mut leaver = client(&s).await;
    let waiting = tokio::spawn(async move {
        leaver
            .acquire("w", Some(TTL), Duration::from_secs(60))
            .await
    });
    eventually(Duration::from_secs(5), async || {
        let mut a = a.clone();
        a.status("w").await.unwrap().n_waiters == 1
    })
    .await;
    waiting.abort();
    eventually(Duration::from_secs(5), async || {
        let mut a = a.clone();
        a.status("w").await.unwrap().n_waiters == 0
    })
    .await;
}

#[tokio::test]
async fn renew_extends_and_fails_after_expiry_without_recreating() {
    let dir = TempDir::new("renew");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    // Long enough that the renew below lands inside it even on a loaded machine.
    let ttl = Duration::from_secs(1);
    let lease = granted(c.acquire("r", Some(ttl), NO_WAIT).await.unwrap());
    match c.renew("r", &lease.acquisition_id).await.unwrap() {
        Renewal::Renewed {
            token, remaining, ..
        } => {
            assert_eq!(token, lease.token);
            assert_eq!(remaining, ttl);
        }
        other => panic!("{other:?}"),
    }
    // Let the lease run out on the server's clock.
    eventually(Duration::from_secs(5), async || {
        let mut c = c.clone();
        c.status("r").await.unwrap().holder_token.is_none()
    })
    .await;
    assert_eq!(
        c.renew("r", &lease.acquisition_id).await.unwrap(),
        Renewal::NotOwner
    );
    assert_eq!(
        c.status("r").await.unwrap().holder_token,
        None,
        "a late renew never recreates the lease"
    );
    let next = granted(c.acquire("r", Some(ttl), NO_WAIT).await.unwrap());
    assert!(next.token > lease.token);
    assert_eq!(
        c.renew("r", &lease.acquisition_id).await.unwrap(),
        Renewal::NotOwner,
        "old id cannot extend the new lease"
    );
}

#[tokio::test]
async fn release_by_wrong_or_old_id_changes_nothing() {
    let dir = TempDir::new("release");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let lease = granted(c.acquire("x", Some(TTL), NO_WAIT).await.unwrap());
    let wrong = baton_client::baton_core::AcquisitionId::from_bytes([0; 16]);
    assert_eq!(c.release("x", &wrong).await.unwrap(), Release::NotHeld);
    assert_eq!(c.status("x").await.unwrap().holder_token, Some(lease.token));
    assert_eq!(
        c.release("x", &lease.acquisition_id).await.unwrap(),
        Release::Released { token: lease.token }
    );
    assert_eq!(
        c.release("x", &lease.acquisition_id).await.unwrap(),
        Release::NotHeld,
        "twice is fine"
    );
    let next = granted(c.acquire("x", Some(TTL), NO_WAIT).await.unwrap());
    assert_eq!(
        c.release("x", &lease.acquisition_id).await.unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        c.status("x").await.unwrap().holder_token,
        Some(next.token),
        "old id did not touch the new lease"
    );
}

#[tokio::test]
async fn multi_acquire_is_all_or_nothing_and_does_not_deadlock() {
    let dir = TempDir::new("multi");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let b = granted(c.acquire("m:b", Some(TTL), NO_WAIT).await.unwrap());
    match c
        .acquire_all(&["m:a", "m:b", "m:c"], Some(TTL), NO_WAIT)
        .await
        .unwrap()
    {
        AcquiredAll::NotAcquired(n) => assert_eq!(n.resource.as_deref(), Some("m:b")),
        other => panic!("{other:?}"),
    }
    for r in ["m:a", "m:c"] {
        assert_eq!(
            c.status(r).await.unwrap().holder_token,
            None,
            "{r} held after a refused multi-acquire"
        );
    }
    c.release("m:b", &b.acquisition_id).await.unwrap();
    // Two clients want overlapping sets in opposite orders, many times over.
    let mut tasks = Vec::new();
    for order in [["m:x", "m:y"], ["m:y", "m:x"]] {
        let mut c = client(&s).await;
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..50 {
                match c
                    .acquire_all(&order, Some(TTL), Duration::from_secs(20))
                    .await
                    .unwrap()
                {
                    AcquiredAll::Granted { leases, .. } => {
                        assert_eq!(
                            leases
                                .iter()
                                .map(|l| l.resource.as_str())
                                .collect::<Vec<_>>(),
                            order
                        );
                        tokens.extend(leases.iter().map(|l| l.token));
                        for l in leases {
                            c.release(&l.resource, &l.acquisition_id).await.unwrap();
                        }
                    }
                    other => panic!("deadlocked or refused: {other:?}"),
                }
            }
            tokens
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("no deadlock")
                .unwrap(),
        );
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a token was issued twice");
    assert_eq!(n, 200);
}

#[tokio::test]
async fn fence_revokes_and_orders_the_next_token_above_it() {
    let dir = TempDir::new("fence");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let lease = granted(c.acquire("f", Some(TTL), NO_WAIT).await.unwrap());
    let fenced = c.fence("f").await.unwrap();
    assert_eq!(fenced.revoked, Some(lease.token));
    assert!(fenced.token > lease.token);
    assert_eq!(
        c.renew("f", &lease.acquisition_id).await.unwrap(),
        Renewal::NotOwner
    );
    let next = granted(c.acquire("f", Some(TTL), NO_WAIT).await.unwrap());
    assert!(next.token > fenced.token);
    let idle = c.fence("never-held").await.unwrap();
    assert_eq!(idle.revoked, None);
    assert!(idle.token > next.token);
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_naming_the_rule_and_the_server_keeps_serving() {
    let dir = TempDir::new("bad");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let long = "x".repeat(513);
    let cases: Vec<(Vec<&str>, Duration, Duration, &str)> = vec![
        (vec![""], TTL, NO_WAIT, "empty"),
        (vec![long.as_str()], TTL, NO_WAIT, "513 bytes"),
        (vec!["a\u{7}b"], TTL, NO_WAIT, "control character"),
        (vec![" a"], TTL, NO_WAIT, "whitespace"),
        (vec!["a::b"], TTL, NO_WAIT, "empty ':'-separated segment"),
        (
            vec!["a"],
            Duration::from_millis(50),
            NO_WAIT,
            "ttl 50ms is out of range",
        ),
        (
            vec!["a"],
            Duration::from_secs(601),
            NO_WAIT,
            "ttl 601000ms is out of range",
        ),
        (
            vec!["a"],
            TTL,
            Duration::from_secs(601),
            "wait 601000ms is above the maximum",
        ),
        (vec!["a"], Duration::ZERO, NO_WAIT, "TTL is above 0"),
        (vec!["a", "a"], TTL, NO_WAIT, "more than once"),
        (vec![], TTL, NO_WAIT, "at least one resource"),
    ];
    for (names, ttl, wait, rule) in cases {
        match c.acquire_all(&names, Some(ttl), wait).await {
            Err(ClientError::Invalid(m)) => {
                assert!(m.contains(rule), "{names:?}: {m:?} should mention {rule:?}")
            }
            other => panic!("{names:?}: expected invalid argument, got {other:?}"),
        }
    }
    let too_many: Vec<String> = (0..65).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert!(
        matches!(c.acquire_all(&refs, Some(TTL), NO_WAIT).await, Err(ClientError::Invalid(m)) if m.contains("65"))
    );
    // An oversized request is refused; the server still serves.
    let huge: Vec<String> = (0..2_000)
        .map(|i| format!("{i}{}", "y".repeat(200)))
        .collect();
    let refs: Vec<&str> = huge.iter().map(String::as_str).collect();
    assert!(c.acquire_all(&refs, Some(TTL), NO_WAIT).await.is_err());
    // Raw protocol: an acquisition id of the wrong length.
    let mut raw = baton_proto::v1::leases_client::LeasesClient::connect(s.url())
        .await
        .unwrap();
    let err = raw
        .renew(baton_proto::v1::RenewRequest {
            resource: "a".into(),
            acquisition_id: vec![1, 2, 3],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("3 bytes"), "{}", err.message());
    let err = raw
        .list(baton_proto::v1::ListRequest {
            prefix: String::new(),
            start_after: String::new(),
            limit: 5_000,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    granted(
        c.acquire("still-serving", Some(TTL), NO_WAIT)
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn waiter_and_connection_limits_answer_resource_exhausted() {
    let dir = TempDir::new("limits");
    let s = common::serve(
        dir.path(),
        &["--max-waiters-per-resource", "1", "--max-connections", "3"],
    );
    let mut a = client(&s).await;
    granted(a.acquire("l", Some(TTL), NO_WAIT).await.unwrap());
    let mut b = client(&s).await;
    let waiting =
        tokio::spawn(async move { b.acquire("l", Some(TTL), Duration::from_secs(30)).await });
    eventually(Duration::from_secs(5), async || {
        let mut a = a.clone();
        a.status("l").await.unwrap().n_waiters == 1
    })
    .await;
    let mut c = client(&s).await;
    match c.acquire("l", Some(TTL), Duration::from_secs(1)).await {
        Err(ClientError::Exhausted(m)) => assert!(m.contains("waiters"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Three connections are open (a, b, c); a fourth is over the limit.
    let mut d = client(&s).await;
    match d.status("l").await {
        Err(ClientError::Exhausted(m)) => assert!(m.contains("connections"), "{m}"),
        other => panic!("{other:?}"),
    }
    waiting.abort();
    assert!(
        a.status("l").await.is_ok(),
        "connections under the limit keep working"
    );
}

#[tokio::test]
async fn list_by_prefix_never_shows_acquisition_ids() {
    let dir = TempDir::new("list");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let mut ids = Vec::new();
    for r in ["tenant:b:1", "tenant:a:1", "other:1"] {
        ids.push(
            granted(c.acquire(r, Some(TTL), NO_WAIT).await.unwrap())
                .acquisition_id
                .to_hex(),
        );
    }
    let names: Vec<String> = c
        .list("tenant:", None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.resource)
        .collect();
    assert_eq!(names, ["tenant:a:1", "tenant:b:1"]);
    let out = cli(&["list", "--server", &s.url(), "--json"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("\"resource\"").count(), 3, "{text}");
    for id in ids {
        assert!(!text.contains(&id), "listing leaked an acquisition id");
        assert!(!s.http_get("/metrics").contains(&id));
    }
}

#[tokio::test]
async fn cli_prints_json_and_uses_documented_exit_codes() {
    let dir = TempDir::new("cli");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let out = cli(&[
        "acquire", "job:1", "--ttl", "30s", "--server", &url, "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_lease_str(&json, "resource").as_deref(), Some("job:1"));
    let id = json_lease_str(&json, "acquisition_id").unwrap();
    assert_eq!(id.len(), 32);
    let token = json_lease_u64(&json, "token").unwrap();
    assert_eq!(json_lease_u64(&json, "ttl_ms"), Some(30_000));
    assert_eq!(
        cli(&["acquire", "job:1", "--server", &url]).status.code(),
        Some(3),
        "held"
    );
    assert_eq!(
        cli(&["acquire", "job:1", "--wait", "100ms", "--server", &url])
            .status
            .code(),
        Some(3),
        "timed out"
    );
    assert_eq!(
        cli(&["acquire", "job::1", "--server", &url]).status.code(),
        Some(2),
        "bad name"
    );
    assert_eq!(
        cli(&["acquire", "job:2", "--ttl", "30", "--server", &url])
            .status
            .code(),
        Some(2),
        "duration without unit"
    );
    assert_eq!(
        cli(&[
            "renew",
            "job:1",
            "--acquisition",
            &"0".repeat(32),
            "--server",
            &url
        ])
        .status
        .code(),
        Some(4)
    );
    assert_eq!(
        cli(&["renew", "job:1", "--acquisition", "xyz", "--server", &url])
            .status
            .code(),
        Some(2)
    );
    let renewed = cli(&[
        "renew",
        "job:1",
        "--acquisition",
        &id,
        "--server",
        &url,
        "--json",
    ]);
    assert_eq!(renewed.status.code(), Some(0));
    assert_eq!(
        json_u64(&String::from_utf8(renewed.stdout).unwrap(), "token"),
        Some(token)
    );
    let status =
        String::from_utf8(cli(&["status", "job:1", "--server", &url, "--json"]).stdout).unwrap();
    assert_eq!(json_u64(&status, "holder_token"), Some(token));
    assert!(!status.contains(&id));
    assert_eq!(
        cli(&["release", "job:1", "--acquisition", &id, "--server", &url])
            .status
            .code(),
        Some(0)
    );
    let again = cli(&["release", "job:1", "--acquisition", &id, "--server", &url]);
    assert_eq!(again.status.code(), Some(0));
    assert!(String::from_utf8(again.stdout)
        .unwrap()
        .contains("not held"));
    let fenced =
        String::from_utf8(cli(&["fence", "job:1", "--server", &url, "--json"]).stdout).unwrap();
    assert!(json_u64(&fenced, "token").unwrap() > token);
    assert_eq!(
        cli(&["status", "x", "--server", "http://127.0.0.1:1"])
            .status
            .code(),
        Some(1),
        "unreachable"
    );
    let help = String::from_utf8(cli(&["--help"]).stdout).unwrap();
    assert!(
        help.contains("Exit codes") && help.contains("4  not owner"),
        "{help}"
    );
}

#[tokio::test]
async fn healthz_and_metrics_over_http() {
    let dir = TempDir::new("http");
    let s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let lease = granted(c.acquire("m", Some(TTL), NO_WAIT).await.unwrap());
    c.renew("m", &lease.acquisition_id).await.unwrap();
    c.renew(
        "m",
        &baton_client::baton_core::AcquisitionId::from_bytes([9; 16]),
    )
    .await
    .unwrap();
    assert!(s.http_get("/healthz").starts_with("HTTP/1.1 200 OK"));
    let metrics = s.http_get("/metrics");
    for line in [
        "baton_grants_total 1",
        "baton_renewals_total 1",
        "baton_renewals_failed_total 1",
        "baton_leases 1",
        "baton_acquire_latency_seconds_count 1",
        // No log switch yet: nothing waits for the background fold.
        "baton_store_fold_backlog 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    assert!(s.http_get("/nope").starts_with("HTTP/1.1 404"));
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_a_restart_keeps_leases_and_token_order() {
    let dir = TempDir::new("restart");
    let mut s = common::serve(dir.path(), &[]);
    let mut c = client(&s).await;
    let lease = granted(c.acquire("keep", Some(TTL), NO_WAIT).await.unwrap());
    let released = granted(c.acquire("gone", Some(TTL), NO_WAIT).await.unwrap());
    c.release("gone", &released.acquisition_id).await.unwrap();
    drop(c);
    let status = s.terminate();
    assert!(status.success(), "SIGTERM exit: {status:?}");
    s.restart();
    let mut c = client(&s).await;
    // The lease survives the restart and still belongs to its holder.
    assert_eq!(
        c.status("keep").await.unwrap().holder_token,
        Some(lease.token)
    );
    assert!(matches!(
        c.renew("keep", &lease.acquisition_id).await.unwrap(),
        Renewal::Renewed { .. }
    ));
    // A clean shutdown flushed the release.
    let next = granted(c.acquire("gone", Some(TTL), NO_WAIT).await.unwrap());
    assert!(next.token > lease.token && next.token > released.token);
}

/// The address without a scheme, `BATON_SERVER`, the server's default TTL
/// when `--ttl` is not given, and one clear line (exit 2) for bad values.
#[tokio::test]
async fn addresses_env_default_ttl_and_bad_values_as_a_newcomer_meets_them() {
    let dir = TempDir::new("first-hour");
    let s = common::serve(dir.path(), &["--default-ttl", "7s"]);
    let bare = s.grpc.to_string();
    let out = cli(&["acquire", "bare", "--json", "--server", &bare]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        json_lease_u64(&text, "ttl_ms"),
        Some(7_000),
        "the server's --default-ttl: {text}"
    );
    let out = std::process::Command::new(&*common::BIN)
        .args(["status", "bare", "--json"])
        .env("BATON_SERVER", &bare)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"held\":true"),
        "{out:?}"
    );
    for (args, says) in [
        (
            vec!["acquire", "x", "--ttl", "1.5s", "--server", &bare],
            "1500ms",
        ),
        (
            vec!["acquire", "x", "--ttl", "30", "--server", &bare],
            "no unit",
        ),
        (
            vec!["status", "x", "--server", "ht tp://x"],
            "server address",
        ),
    ] {
        let out = cli(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.matches("error").count(), 1, "one error line: {err}");
    }
    let out = cli(&["status", "x", "--server", "127.0.0.1:1"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.matches("connection refused").count(),
        1,
        "not doubled: {err}"
    );
    assert!(
        err.contains("is `baton serve` running"),
        "the likely cause: {err}"
    );
    assert_eq!(
        err.matches("127.0.0.1:1").count(),
        1,
        "the address once: {err}"
    );
    assert!(!err.contains("transport error"), "{err}");
}

/// `serve --config FILE`: the file sets flags, the environment overrides the
/// file, a flag overrides both; an unknown key is exit 2 naming it.
#[tokio::test]
async fn a_config_file_sets_serve_flags_and_flags_and_env_win() {
    let dir = TempDir::new("config-file");
    let file = dir.path().join("baton.toml");
    std::fs::write(
        &file,
        "default-ttl = \"9s\"\nttl_min = \"100ms\"\nmax_waiters = 5\n",
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let data = dir.path().join("data");
    let start = |env_ttl: Option<&str>, flag_ttl: Option<&str>| {
        let mut cmd = std::process::Command::new(&*common::BIN);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            config,
        ])
        .arg("--data-dir")
        .arg(&data)
        .stderr(std::process::Stdio::null());
        if let Some(t) = flag_ttl {
            cmd.args(["--default-ttl", t]);
        }
        match env_ttl {
            Some(t) => cmd.env("BATON_DEFAULT_TTL", t),
            None => cmd.env_remove("BATON_DEFAULT_TTL"),
        };
        let mut server = common::Proc::spawn(&mut cmd, "baton server");
        let grpc = grpc_of(&server.next_line().1);
        (server, grpc)
    };
    for (env_ttl, flag_ttl, expected_ms) in [
        (None, None, 9_000),
        (Some("8s"), None, 8_000),
        (Some("8s"), Some("7s"), 7_000),
    ] {
        let (server, grpc) = start(env_ttl, flag_ttl);
        let out = cli(&[
            "acquire",
            &format!("cfg-{expected_ms}"),
            "--json",
            "--server",
            &grpc,
        ]);
        drop(server);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(
            json_lease_u64(&text, "ttl_ms"),
            Some(expected_ms),
            "env {env_ttl:?} flag {flag_ttl:?}: {text}"
        );
    }
    std::fs::write(&file, "nope = 1\n").unwrap();
    let out = cli(&["serve", "--config", config]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown key \"nope\""),
        "{out:?}"
    );
}

/// The gRPC address on a `baton listening grpc=ADDR http=ADDR` line.
fn grpc_of(line: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap_or_else(|| panic!("no grpc= in {line:?}"))
        .to_string()
}

/// `--otlp-endpoint https://...`: spans reach a collector over TLS whose
/// CA the server trusts (here by `SSL_CERT_FILE`, as OpenSSL's users set
/// it), and none reach one it does not trust: that server connects, fails
/// the handshake and logs that the export failed, naming the collector's
/// URL and the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exports_its_spans_over_https_to_a_collector_it_trusts() {
    let dir = TempDir::new("otlp-https");
    let ca = baton_testkit::pki::Ca::new(dir.path(), "collector-ca");
    let collector = baton_testkit::otlp::Collector::start_tls(&ca.server("collector", false));
    let run = |name: &str, trusted: bool| {
        let mut cmd = std::process::Command::new(&*common::BIN);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .args(["--otlp-endpoint", &collector.endpoint(), "--data-dir"])
        .arg(dir.path().join(name))
        .env("RUST_LOG", "warn")
        .env_remove("SSL_CERT_DIR");
        if trusted {
            cmd.env("SSL_CERT_FILE", &ca.cert);
        } else {
            cmd.env_remove("SSL_CERT_FILE");
        }
        let mut server = common::Proc::spawn_merged(&mut cmd, "baton serve");
        let grpc = grpc_of(&server.wait_for("baton listening"));
        let out = cli(&["acquire", name, "--ttl", "30s", "--server", &grpc]);
        assert!(out.status.success(), "{out:?}");
        server.signal(nix::sys::signal::Signal::SIGTERM);
        let (code, log) = server.exit();
        assert_eq!(code, Some(0), "{log}");
        log
    };

    run("trusted:1", true);
    let spans = collector.spans();
    let grant = spans
        .iter()
        .find(|s| s.name == "grant")
        .unwrap_or_else(|| panic!("no grant span over TLS: {spans:#?}"));
    assert_eq!(grant.attributes["resource"], "trusted:1");

    let before = (collector.connections(), collector.spans().len());
    let log = run("untrusted:1", false);
    assert!(
        collector.connections() > before.0,
        "the untrusted run never connected"
    );
    assert_eq!(
        collector.spans().len(),
        before.1,
        "spans crossed an untrusted TLS session"
    );
    // The failure names the collector and why: its certificate.
    let failed = log
        .lines()
        .find(|l| l.contains("OTLP export to https://"))
        .unwrap_or_else(|| panic!("the failed export is not in the log: {log}"));
    assert!(
        failed.contains(&collector.endpoint()) && failed.contains("certificate"),
        "the failure does not say where and why: {failed}"
    );
}

/// `--otlp-endpoint`: the server's acquire and grant spans reach an OTLP
/// collector (flushed when the server stops on SIGTERM), with the
/// resource and the token; a bad endpoint is refused before serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exports_its_lease_spans_to_an_otlp_collector() {
    let collector = baton_testkit::otlp::Collector::start();
    let dir = TempDir::new("otlp-serve");
    let mut s = common::serve(dir.path(), &["--otlp-endpoint", &collector.endpoint()]);
    let out = cli(&[
        "acquire",
        "traced:1",
        "--ttl",
        "30s",
        "--json",
        "--server",
        &s.url(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let token = json_lease_u64(&String::from_utf8_lossy(&out.stdout), "token").unwrap();
    assert!(s.terminate().success());
    let spans = collector.spans();
    let grant = spans
        .iter()
        .find(|s| s.name == "grant")
        .unwrap_or_else(|| panic!("no grant span: {spans:#?}"));
    assert_eq!(grant.service, "baton serve");
    assert_eq!(grant.attributes["resource"], "traced:1");
    assert_eq!(grant.attributes["token"], token.to_string());
    let acquire = spans.iter().find(|s| s.name == "acquire").unwrap();
    assert_eq!(grant.parent_id, acquire.span_id);
    assert_eq!(acquire.attributes["outcome"], "granted");

    let out = std::process::Command::new(&*common::BIN)
        .args(["serve", "--otlp-endpoint", "localhost:4318", "--data-dir"])
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("OTLP/HTTP address"),
        "{out:?}"
    );
}
