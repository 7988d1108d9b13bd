//! A cluster that clients can always reach: a stopped member (SIGSTOP: the
//! kernel still completes TCP handshakes, nothing answers) or a silent TCP
//! listener listed first never holds up a call. Every call is given a
//! timeout far above the bounds (20 s), so "outcome unknown" or a timeout
//! fails the test; the elapsed times are printed, not asserted.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use baton_client::{Acquired, Client};
use baton_systest::{json_lease_u64, Cluster, Proc, BIN};
use baton_testkit::PgDb;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A stopped process, resumed when dropped (also when a test fails).
struct Stopped(Pid);

impl Stopped {
    /// SIGSTOP, then wait (`waitid`, `WSTOPPED`) until the kernel has
    /// stopped it: a signal takes effect only when the target next runs,
    /// and a server still running would answer the dial meant to fail.
    fn stop(pid: u32) -> Self {
        use nix::sys::wait::{waitid, Id, WaitPidFlag};
        let pid = Pid::from_raw(pid as i32);
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
        waitid(Id::Pid(pid), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOWAIT)
            .expect("wait for the stop");
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// `baton ARGS --server SERVERS --timeout 20s`, timed from its start.
fn cli(servers: &str, args: &[&str]) -> (Duration, Output) {
    let started = Instant::now();
    let out = Command::new(&*BIN)
        .args(args)
        .args(["--server", servers, "--timeout", "20s"])
        .stdin(Stdio::null())
        .output()
        .expect("run baton");
    (started.elapsed(), out)
}

fn answered(what: &str, (elapsed, out): (Duration, Output), report: &mut Vec<String>) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what}: {text}");
    report.push(format!("{what} {} ms", elapsed.as_millis()));
    text
}

async fn timed<T, F: std::future::Future<Output = T>>(
    what: &str,
    report: &mut Vec<String>,
    f: F,
) -> T {
    let started = Instant::now();
    let out = f.await;
    report.push(format!("{what} {} ms", started.elapsed().as_millis()));
    out
}

/// The servers' addresses with `first` listed first.
fn listed_first(cluster: &Cluster, first: usize) -> String {
    let mut order = vec![first];
    order.extend((0..cluster.nodes.len()).filter(|i| *i != first));
    order
        .iter()
        .map(|i| cluster.nodes[*i].url())
        .collect::<Vec<_>>()
        .join(",")
}

async fn connect(servers: &str) -> Client {
    Client::connect(servers)
        .await
        .expect("connect")
        .with_rpc_timeout(TIMEOUT)
}

/// Every kind of call, each member in turn stopped while listed first:
/// new CLI processes (status, acquire, hold on a session), a Rust client
/// made after the stop (status, acquire, session acquire), and one
/// connected before it (a read first, then an acquire). With the leader
/// stopped the calls wait for the election (leader TTL 1 s). The resumed
/// member grants nothing: every resource taken while it was stopped is
/// still held when asked through it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_member_listed_first_never_holds_up_a_call() {
    let db = PgDb::create("reach_stopped").await;
    let cluster = Cluster::start(&db.url, 3);
    // A follower, then the leader, then a follower again.
    for round in 0..3 {
        let leader = cluster.wait_leader(None).await;
        let stopped = if round == 1 {
            leader
        } else {
            (leader + 1 + round / 2) % 3
        };
        let servers = listed_first(&cluster, stopped);
        let before = connect(&servers).await;
        before.clone().status("reach:warm").await.unwrap();
        let role = if stopped == leader {
            "leader"
        } else {
            "follower"
        };
        let mut report = Vec::new();
        let taken = {
            let _stopped = Stopped::stop(cluster.pid(stopped));
            calls_with_one_member_stopped(&servers, round, before, &mut report).await
        };
        eprintln!(
            "member {stopped} ({role}) stopped, listed first: {}",
            report.join(", ")
        );
        let mut alone = connect(&cluster.nodes[stopped].url()).await;
        for (name, token) in taken {
            resumed_member_grants_nothing(&mut alone, stopped, &name, token).await;
        }
    }
}

/// Asked through the resumed member alone, `name` is refused as held by
/// `token`: after a definite "no leader known yet" while it catches up
/// (its old term is over), never a grant, never an unknown outcome.
async fn resumed_member_grants_nothing(alone: &mut Client, member: usize, name: &str, token: u64) {
    let started = Instant::now();
    loop {
        match alone
            .acquire(name, Some(Duration::from_secs(30)), Duration::ZERO)
            .await
        {
            Ok(Acquired::NotAcquired(why)) => {
                assert_eq!(why.holder_token.map(|t| t.get()), Some(token), "{name}");
                return;
            }
            Err(e) if e.is_definite() && started.elapsed() < TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!(
                "the resumed member {member} answered {other:?} for {name}, held by token {token}"
            ),
        }
    }
}

/// The calls of one round; returns every resource granted, with its token.
async fn calls_with_one_member_stopped(
    servers: &str,
    round: usize,
    before: Client,
    report: &mut Vec<String>,
) -> Vec<(String, u64)> {
    let mut taken = Vec::new();
    let name = |what: &str| format!("reach:{round}:{what}");
    answered(
        "cli status",
        cli(servers, &["status", &name("cli")]),
        report,
    );
    let granted = answered(
        "cli acquire",
        cli(
            servers,
            &["acquire", &name("cli"), "--ttl", "60s", "--json"],
        ),
        report,
    );
    taken.push((
        name("cli"),
        json_lease_u64(&granted, "token").expect("a token"),
    ));
    taken.push((name("hold"), hold(servers, &name("hold"), report)));
    let mut fresh = timed("rust connect", report, connect(servers)).await;
    timed("rust status", report, fresh.status(&name("rust")))
        .await
        .unwrap();
    let lease = timed(
        "rust acquire",
        report,
        fresh.acquire(&name("rust"), Some(Duration::from_secs(60)), Duration::ZERO),
    )
    .await;
    taken.push((name("rust"), granted_token(lease)));
    let session = timed(
        "rust session open",
        report,
        fresh.open_session(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let lease = timed(
        "rust session acquire",
        report,
        session.acquire(&name("session"), Duration::ZERO),
    )
    .await;
    taken.push((name("session"), granted_token(lease)));
    std::mem::forget(session); // its leases stay held for the check above
    let mut before = before;
    timed(
        "connected before: status",
        report,
        before.status(&name("before")),
    )
    .await
    .unwrap();
    let lease = timed(
        "connected before: acquire",
        report,
        before.acquire(
            &name("before"),
            Some(Duration::from_secs(60)),
            Duration::ZERO,
        ),
    )
    .await;
    taken.push((name("before"), granted_token(lease)));
    taken
}

fn granted_token(answer: Result<Acquired, baton_client::ClientError>) -> u64 {
    match answer {
        Ok(Acquired::Granted(lease)) => lease.token.get(),
        other => panic!("a free resource was not granted: {other:?}"),
    }
}

/// `baton hold NAME` on a session: its grant line, then killed (its
/// session lives on for its TTL, so the lease stays held).
fn hold(servers: &str, name: &str, report: &mut Vec<String>) -> u64 {
    let started = Instant::now();
    let mut cmd = Command::new(&*BIN);
    cmd.args([
        "hold",
        name,
        "--ttl",
        "60s",
        "--json",
        "--server",
        servers,
        "--timeout",
        "20s",
    ]);
    let mut proc = Proc::spawn(&mut cmd, "baton hold");
    let (at, line) = proc
        .line_within(TIMEOUT + Duration::from_secs(5))
        .unwrap_or_else(|| panic!("hold printed nothing: {:?}", proc.lines()));
    report.push(format!(
        "cli hold {} ms",
        at.duration_since(started).as_millis()
    ));
    let token = json_lease_u64(&line, "token").unwrap_or_else(|| panic!("hold: {line}"));
    proc.kill9();
    token
}

/// A TCP listener that never accepts (connections complete in the
/// kernel's queue, nothing is ever read or written) listed before a real
/// server: every call goes to the real one without waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listener_listed_first_is_passed_over() {
    let dir = baton_testkit::TempDir::new("reach-silent");
    let server = baton_systest::serve(dir.path(), &[]);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let servers = format!("{},{}", silent.local_addr().unwrap(), server.grpc);
    let mut report = Vec::new();
    answered(
        "cli status",
        cli(&servers, &["status", "silent:x"]),
        &mut report,
    );
    answered(
        "cli acquire",
        cli(&servers, &["acquire", "silent:x", "--ttl", "5s"]),
        &mut report,
    );
    let mut c = timed("rust connect", &mut report, connect(&servers)).await;
    timed("rust status", &mut report, c.status("silent:y"))
        .await
        .unwrap();
    eprintln!("silent listener listed first: {}", report.join(", "));
    // Alone, it is a definite failure after the dial timeout, naming it.
    let (elapsed, out) = cli(
        &silent.local_addr().unwrap().to_string(),
        &[
            "acquire",
            "silent:z",
            "--ttl",
            "5s",
            "--dial-timeout",
            "300ms",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer within the dial timeout of 300 ms")
            && err.contains("nothing was sent"),
        "{err}"
    );
    assert!(!err.contains("outcome unknown"), "{err}");
    eprintln!(
        "silent listener alone: refused as definite after {} ms",
        elapsed.as_millis()
    );
}

/// Addresses as users write them, and the rule for a bad one (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_addresses_take_the_forms_users_write() {
    let dir = baton_testkit::TempDir::new("reach-forms");
    let server = baton_systest::serve(dir.path(), &[]);
    let port = server.grpc.port().to_string();
    for form in [
        port.clone(),
        format!("localhost:{port}"),
        format!("http://127.0.0.1:{port}/"),
        format!("[::1]:{port}"),
    ] {
        let (_, out) = cli(&form, &["status", "forms:x"]);
        if form.starts_with('[') && !out.status.success() {
            // The server listens on 127.0.0.1 only: [::1] is a definite refusal.
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("http://[::1]:") && err.contains("nothing was sent"),
                "{form}: {err}"
            );
            continue;
        }
        assert!(
            out.status.success(),
            "{form}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (form, says) in [
        (
            "127.0.0.1:99999",
            "port 99999 is out of range; a port is 1 to 65535",
        ),
        ("70000", "port 70000 is out of range"),
        ("::1", "in brackets"),
    ] {
        let (_, out) = cli(form, &["status", "forms:x"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{form}: {err}");
        assert!(err.contains(says), "{form}: {err}");
    }
    let (_, out) = cli("nosuch.invalid", &["status", "forms:x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nosuch.invalid does not resolve") && err.contains("nothing was sent"),
        "{err}"
    );
}
