//! The command line never claims a lease it no longer holds: `baton
//! acquire` whose reply comes back after the TTL, `baton hold` cut off from
//! the server, and `baton hold` whose lease is fenced, each run as a real
//! process against a real server, with the fault proxy between them where
//! the network is the fault. Every test has another client take the
//! resource and checks that the command had stopped claiming it first.

use std::process::Command;
use std::time::{Duration, Instant};

use baton_client::{Acquired, Client};
use baton_faults::{Direction, Proxy};
use baton_systest as common;
use common::{json_lease_u64, Proc, Server, TempDir, BIN};

/// A `baton` process whose stdout and stderr lines are stamped when they
/// arrive.
fn baton(args: &[&str]) -> Proc {
    Proc::spawn_merged(Command::new(&*BIN).args(args), "baton")
}

/// Acquires `name` for 30 s on `url`, waiting up to 30 s: the other client.
async fn take_over(url: &str, name: &str) -> (Instant, u64) {
    let mut c = Client::connect(url).await.unwrap();
    match c
        .acquire(name, Some(Duration::from_secs(30)), Duration::from_secs(30))
        .await
        .unwrap()
    {
        Acquired::Granted(l) => (Instant::now(), l.token.get()),
        other => panic!("the other client was not granted {name}: {other:?}"),
    }
}

async fn serve_behind_proxy(dir: &TempDir) -> (Server, Proxy) {
    let s = common::serve(dir.path(), &[]);
    let proxy = Proxy::start(s.grpc).await.unwrap();
    (s, proxy)
}

/// A grant whose reply is held 2.5 s with a 1 s TTL: by the time it
/// arrives, another client has been granted the resource. `acquire` says
/// "expired on arrival" (exit 6, `"acquired": false`), not a fresh lease.
/// A reply held 300 ms is a grant whose `valid_for_ms` counts from the send.
/// The proxy holds everything the server sends, PING answers too, so the
/// client is given a dial timeout above the delay: with the default (1 s)
/// it would close the silent connection after 2 s and report the outcome
/// unknown, as for a stopped server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_ttl_is_reported_expired_on_arrival() {
    let dir = TempDir::new("own-late-grant");
    let (s, proxy) = serve_behind_proxy(&dir).await;
    let via = proxy.addr().to_string();
    proxy.delay_response_to(b"late:1", Duration::from_millis(2_500));
    let sent = Instant::now();
    let mut cli = baton(&[
        "acquire",
        "late:1",
        "--ttl",
        "1s",
        "--json",
        "--server",
        &via,
        "--dial-timeout",
        "5s",
    ]);
    // The CLI's grant is made (its reply now waits in the proxy) before the
    // other client asks.
    let mut c = Client::connect(&s.url()).await.unwrap();
    baton_testkit::until(async || c.status("late:1").await.unwrap().holder_token.is_some()).await;
    let (granted_other_at, other_token) = take_over(&s.url(), "late:1").await;
    let (reported_at, line) = cli.next_line();
    let (code, rest) = cli.exit();
    assert_eq!(proxy.counts().delayed_responses, 1, "the fault fired once");
    assert!(
        reported_at > granted_other_at,
        "the reply must have arrived after the other grant for this test to mean anything"
    );
    assert_eq!(code, Some(6), "expired on arrival: {line}\n{rest}");
    let json = baton_testkit::json::object(&line).expect("one JSON object");
    assert_eq!(json["acquired"], false, "{line}");
    assert_eq!(json["reason"], "expired_on_arrival", "{line}");
    assert_eq!(json["leases"][0]["valid_for_ms"], 0, "{line}");
    let stale = json["leases"][0]["token"].as_u64().unwrap();
    assert!(other_token > stale, "the other grant came later");
    // Its best-effort release changed nothing: the other client holds it.
    let holder = c.status("late:1").await.unwrap().holder_token;
    assert_eq!(holder.map(|t| t.get()), Some(other_token));

    // Late, but within its TTL: a grant, valid for what is left of the TTL
    // counted from the send time.
    proxy.delay_response_to(b"late:2", Duration::from_millis(300));
    let mut cli = baton(&[
        "acquire",
        "late:2",
        "--ttl",
        "1s",
        "--json",
        "--server",
        &via,
        "--dial-timeout",
        "5s",
    ]);
    let (_, line) = cli.next_line();
    let (code, rest) = cli.exit();
    assert_eq!(code, Some(0), "{line}\n{rest}");
    let valid_for_ms = json_lease_u64(&line, "valid_for_ms").unwrap();
    assert!(
        valid_for_ms > 0 && valid_for_ms <= 700,
        "1 s TTL less a 300 ms delay at least: {valid_for_ms} ms ({line})"
    );
    assert_eq!(proxy.counts().delayed_responses, 2);
    eprintln!(
        "late grants: 2 replies delayed; the one delayed past its TTL reported expired {} ms after the send, {} ms after another client was granted",
        reported_at.duration_since(sent).as_millis(),
        reported_at.duration_since(granted_other_at).as_millis()
    );
}

/// `hold` cut off from the server (both directions held for longer than
/// the TTL) says it lost the lease at its own safe-until, before the
/// server could give the resource to anyone else, and exits 4 at once:
/// its exit, too, comes before the other grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_cut_off_from_the_server_gives_up_before_anyone_else_is_granted() {
    let dir = TempDir::new("own-partition");
    let (s, proxy) = serve_behind_proxy(&dir).await;
    let via = proxy.addr().to_string();
    let mut cli = baton(&["hold", "cut:1", "--ttl", "1s", "--json", "--server", &via]);
    let (_, grant) = cli.next_line();
    let token = json_lease_u64(&grant, "token").expect("a grant");
    // Let a heartbeat or two go by, then cut the network.
    let mut c = Client::connect(&s.url()).await.unwrap();
    baton_testkit::until(async || proxy.counts().connections >= 1).await;
    proxy.hold(Direction::ClientToServer);
    proxy.hold(Direction::ServerToClient);
    let cut_at = Instant::now();
    // The loss line and the exit, timed while the other client waits.
    let watcher = tokio::task::spawn_blocking(move || {
        let (lost_at, lost) = cli.next_line();
        let status = cli.wait();
        (
            lost_at,
            lost,
            Instant::now(),
            status.code(),
            cli.lines().join("\n"),
        )
    });
    let (granted_other_at, other_token) = take_over(&s.url(), "cut:1").await;
    let (lost_at, lost, exited_by, code, rest) = watcher.await.unwrap();
    proxy.release(Direction::ClientToServer);
    proxy.release(Direction::ServerToClient);
    let held = proxy.counts().held_chunks;
    assert!(
        held >= 1,
        "the partition held no traffic: it proved nothing"
    );
    assert!(
        lost_at < granted_other_at,
        "hold claimed cut:1 until {} ms after the cut, but another client was granted it at {} ms",
        lost_at.duration_since(cut_at).as_millis(),
        granted_other_at.duration_since(cut_at).as_millis()
    );
    assert!(
        exited_by < granted_other_at,
        "hold exited no earlier than {} ms after the cut, after another client was granted at {} ms",
        exited_by.duration_since(cut_at).as_millis(),
        granted_other_at.duration_since(cut_at).as_millis()
    );
    assert!(other_token > token);
    assert_eq!(code, Some(4), "{lost}\n{rest}");
    assert!(
        lost.contains("lost the lease on cut:1") && lost.contains("no heartbeat"),
        "{lost}"
    );
    assert_eq!(
        c.status("cut:1")
            .await
            .unwrap()
            .holder_token
            .map(|t| t.get()),
        Some(other_token)
    );
    eprintln!(
        "partition: {held} chunks held; hold exited {} ms after announcing the loss; it gave up {} ms after the cut, {} ms before another client was granted",
        exited_by.duration_since(lost_at).as_millis(),
        lost_at.duration_since(cut_at).as_millis(),
        granted_other_at.duration_since(lost_at).as_millis()
    );
}

/// `baton fence` while `hold` holds: the session's next heartbeat reports
/// the fence and `hold` exits 4 at once, naming the fence (the heartbeats
/// go on, so nothing else would have ended it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_lease_is_fenced_exits_4_at_once() {
    let dir = TempDir::new("own-fence");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let mut cli = baton(&[
        "hold", "fenced:1", "--ttl", "3s", "--json", "--server", &url,
    ]);
    let (_, grant) = cli.next_line();
    let token = json_lease_u64(&grant, "token").expect("a grant");
    let fence = common::cli(&["fence", "fenced:1", "--server", &url]);
    assert_eq!(fence.status.code(), Some(0));
    let (_, lost) = cli.next_line();
    let (code, rest) = cli.exit();
    assert_eq!(code, Some(4), "{lost}\n{rest}");
    assert!(
        lost.contains("lost the lease on fenced:1") && lost.contains("fenced"),
        "{lost}"
    );
    assert!(lost.contains(&token.to_string()), "{lost}");
    let (_, next) = take_over(&url, "fenced:1").await;
    assert!(next > token);
}

/// A grant after a wait in line longer than the TTL is still a grant: the
/// server reports how long the request waited, and the validity counts
/// from the send time plus that wait (never more than the client saw pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_a_wait_longer_than_its_ttl_is_valid_from_the_grant() {
    let dir = TempDir::new("own-long-wait");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let mut c = Client::connect(&url).await.unwrap();
    let Acquired::Granted(first) = c
        .acquire("wait:1", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("first grant")
    };
    let mut cli = baton(&[
        "acquire", "wait:1", "--ttl", "1s", "--wait", "10s", "--json", "--server", &url,
    ]);
    baton_testkit::until(async || c.status("wait:1").await.unwrap().n_waiters == 1).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    c.release("wait:1", &first.acquisition_id).await.unwrap();
    let (_, line) = cli.next_line();
    let (code, rest) = cli.exit();
    assert_eq!(code, Some(0), "{line}\n{rest}");
    let json = baton_testkit::json::object(&line).unwrap();
    assert_eq!(
        (&json["acquired"], &json["after_wait"]),
        (&true.into(), &true.into())
    );
    let valid_for_ms = json["leases"][0]["valid_for_ms"].as_u64().unwrap();
    assert!(
        valid_for_ms > 0 && valid_for_ms <= 1_000,
        "valid for what is left of 1 s after the grant: {valid_for_ms} ms"
    );
}
