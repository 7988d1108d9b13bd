//! The seed's fault scenarios with real processes: worker processes of the
//! statement service, a Baton server (in this process, or its own process
//! where it gets killed), PostgreSQL (the machine's, or a private cluster
//! where it gets restarted), and the fault proxy between them. Each scenario
//! ends with the history checker (`statements check`) and says how often its
//! fault fired.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use baton_client::{Acquired, Client};
use baton_faults::{Direction, Proxy};
use baton_testkit::process::Proc;
use baton_testkit::{PgDb, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_statements");
const DATE: &str = "2026-10-01";

/// The service's state: SQLite in `dir`, or PostgreSQL at `url`.
struct Store {
    dir: PathBuf,
    url: Option<String>,
}

/// A Baton server in this process, on loopback, with its data in `dir`.
async fn local_server(dir: &TempDir) -> baton_server::RunningServer {
    baton_server::start(baton_server::ServerConfig::ephemeral(
        dir.path().join("baton"),
    ))
    .await
    .unwrap()
}

impl Store {
    fn new(dir: &TempDir, url: Option<String>) -> Self {
        Self {
            dir: dir.path().to_path_buf(),
            url,
        }
    }

    fn args(&self, url: Option<&str>) -> Vec<String> {
        let mut a = vec![
            "--db".into(),
            self.dir.join("statements.sqlite").display().to_string(),
            "--objects".into(),
            self.dir.join("objects").display().to_string(),
        ];
        if let Some(u) = url.or(self.url.as_deref()) {
            a.extend(["--database-url".into(), u.to_string()]);
        }
        a
    }

    fn seed(&self, account: &str) {
        let out = Command::new(BIN)
            .arg("seed")
            .args(self.args(None))
            .args(["--account", account, "--date", DATE])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    /// A worker process; `url` overrides the database address (a proxy).
    fn worker(&self, server: &str, name: &str, url: Option<&str>, extra: &[&str]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.arg("worker")
            .args(self.args(url))
            .args(["--server", server, "--name", name, "--poll", "50ms"])
            .arg("--history")
            .arg(self.dir.join("history").join(format!("{name}.jsonl")))
            .args(extra);
        std::fs::create_dir_all(self.dir.join("history")).unwrap();
        Proc::spawn(&mut cmd, "statements worker")
    }

    /// `statements check` over every history: (exit code, JSON report).
    fn check(&self, accounts: &str) -> (Option<i32>, String) {
        let out = Command::new(BIN)
            .arg("check")
            .args(self.args(None))
            .arg("--history")
            .arg(self.dir.join("history"))
            .args(["--accounts", accounts, "--json"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn show(&self, account: &str) -> String {
        let out = Command::new(BIN)
            .arg("show")
            .args(self.args(None))
            .args(["--account", account, "--date", DATE, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// Waits until every job of `accounts` is published.
    async fn all_published(&self, accounts: &[String]) {
        for a in accounts {
            baton_testkit::until(async || self.show(a).contains("\"job_state\":\"published\""))
                .await;
        }
    }
}

fn num(json: &str, key: &str) -> i64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len()
        + 3;
    json[at..]
        .split([',', '}'])
        .next()
        .unwrap()
        .trim_matches('"')
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

fn acquired_tokens(lines: &[String]) -> Vec<i64> {
    lines
        .iter()
        .filter(|l| l.contains("\"event\":\"acquired\""))
        .map(|l| num(l, "token"))
        .collect()
}

/// Asserts the checker's verdict is clean and returns its report.
fn clean(store: &Store, accounts: &str) -> String {
    let (code, report) = store.check(accounts);
    assert_eq!(code, Some(0), "checker: {report}");
    for key in [
        "stale_overwrites",
        "doubled_operations",
        "lost_publications",
        "pointer_regressions",
    ] {
        assert_eq!(num(&report, key), 0, "{key}: {report}");
    }
    report
}

async fn lease_free(url: &str, resource: &str) {
    let mut c = Client::connect(url).await.unwrap();
    baton_testkit::until(async || c.status(resource).await.unwrap().holder_token.is_none()).await;
}

/// The paused-worker story with the process running and its network slow:
/// Alice passes her last local ownership check, then her final request
/// (and her renewals) wait in the network. The lease moves to Bob, who
/// publishes. Alice's request arrives afterwards and is refused at the
/// resource, although Alice's own check had passed: a fence that only
/// trusted the worker's local flag would have let it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_delayed_in_the_network_is_refused_after_the_lease_moved() {
    let pg = PgDb::create("stmt_delayed").await;
    let dir = TempDir::new("stmt-delayed");
    let store = Store::new(&dir, Some(pg.url.clone()));
    let server = local_server(&dir).await;
    let direct = format!("http://{}", server.grpc_addr);
    let baton_proxy = Proxy::start(server.grpc_addr).await.unwrap();
    let pg_proxy = Proxy::start(pg.upstream()).await.unwrap();
    store.seed("delayed-1");

    let mut alice = store.worker(
        &format!("http://{}", baton_proxy.addr()),
        "alice",
        Some(&pg.url_via(pg_proxy.addr().port())),
        &["--once", "--ttl", "1500ms", "--pause-before-publish"],
    );
    let paused = alice.wait_for("\"event\":\"paused\"");
    let alice_token = num(&paused, "token");
    baton_testkit::until(async || alice.stopped()).await;
    // From here Alice's network is slow: her publish and her renewals wait.
    pg_proxy.hold(Direction::ClientToServer);
    baton_proxy.hold(Direction::ClientToServer);
    alice.signal(nix::sys::signal::Signal::SIGCONT);
    alice.wait_for("\"event\":\"resumed\"");
    baton_testkit::until(async || pg_proxy.counts().held_chunks > 0).await;
    lease_free(&direct, "statement:delayed-1:2026-10-01").await;
    let mut bob = store.worker(&direct, "bob", None, &["--once", "--ttl", "5000ms"]);
    let bob_published = bob.wait_for("\"event\":\"published\"");
    let bob_token = num(&bob_published, "token");
    assert!(bob_token > alice_token);
    bob.wait_for("\"event\":\"completed\"");

    // Alice's request finally arrives.
    pg_proxy.release(Direction::ClientToServer);
    let refused = alice.wait_for("\"event\":\"publish_refused\"");
    baton_proxy.release(Direction::ClientToServer);
    assert!(refused.contains("\"outcome\":\"stale\""), "{refused}");
    assert_eq!(num(&refused, "current"), bob_token);
    assert_eq!(num(&store.show("delayed-1"), "published_token"), bob_token);
    let report = clean(&store, "delayed-");
    assert_eq!(num(&report, "stale_rejected"), 1, "{report}");
    println!(
        "delayed publish: proxy {:?}; Alice {alice_token} refused, Bob {bob_token} published; {report}",
        pg_proxy.counts()
    );
}

/// The answer to a worker's publish is lost on the way back from PostgreSQL
/// (delivered, committed, then the connection reset). The worker cannot know
/// whether it happened; it reconnects and retries with the same operation id,
/// gets the saved result, and the statement is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_publish_answer_is_retried_by_the_worker_to_the_saved_result() {
    let pg = PgDb::create("stmt_lost_answer").await;
    let dir = TempDir::new("stmt-lost-answer");
    let store = Store::new(&dir, Some(pg.url.clone()));
    let server = local_server(&dir).await;
    let pg_proxy = Proxy::start(pg.upstream()).await.unwrap();
    store.seed("lost-1");
    // The proxy looks for the publish by its operation id, in the bytes of
    // the request: plain text, whatever TLS the server offers.
    pg_proxy.drop_response_to(b"publish:lost-1:");
    let mut worker = store.worker(
        &format!("http://{}", server.grpc_addr),
        "w",
        Some(&format!(
            "{} sslmode=disable",
            pg.url_via(pg_proxy.addr().port())
        )),
        &["--once", "--ttl", "5000ms"],
    );
    let unknown = worker.wait_for("\"event\":\"publish_unknown\"");
    let published = worker.wait_for("\"event\":\"published\"");
    worker.wait_for("\"event\":\"completed\"");
    assert_eq!(pg_proxy.counts().dropped_responses, 1, "the fault fired");
    assert_eq!(num(&unknown, "token"), num(&published, "token"));
    let show = store.show("lost-1");
    assert!(
        show.contains("\"outcome\":\"replayed\""),
        "the retry got the saved result: {show}"
    );
    let report = clean(&store, "lost-");
    assert_eq!(
        num(&report, "publications_accepted"),
        1,
        "published once: {report}"
    );
    let db = pg.connect().await;
    let records: i64 = db
        .query_one("SELECT count(*) FROM baton.operations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 1, "one operation record");
    println!("lost answer: proxy {:?}; {report}", pg_proxy.counts());
}

/// A Baton server in its own process, killed with SIGKILL and restarted on
/// the same address and data directory.
struct BatonProcess {
    proc: Proc,
    data: PathBuf,
    addr: SocketAddr,
}

impl BatonProcess {
    fn start(data: &Path) -> Self {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        Self::on(data, addr)
    }

    fn on(data: &Path, addr: SocketAddr) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve-baton")
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", &addr.to_string()]);
        let mut proc = Proc::spawn(&mut cmd, "baton server");
        proc.wait_for("listening");
        Self {
            proc,
            data: data.to_path_buf(),
            addr,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill9_and_restart(&mut self) {
        self.proc.kill9();
        *self = Self::on(&self.data.clone(), self.addr);
    }
}

/// A token from a fresh resource (tokens come from one counter, so any
/// resource shows where it stands; a released probe may come back held after
/// a crash, since releases are flushed lazily).
async fn probe_token(url: &str, probe: &str) -> u64 {
    let mut c = Client::connect(url).await.unwrap();
    match c
        .acquire(probe, Some(Duration::from_secs(1)), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l.token.get(),
        other => panic!("{other:?}"),
    }
}

/// The Baton server is killed with SIGKILL three times while three workers
/// publish: every token is above every token before it, each worker's
/// tokens rise, and every job is published exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_killed_and_restarted_while_workers_run_keeps_tokens_rising_and_publishes_once()
{
    let dir = TempDir::new("stmt-server-kill");
    let store = Store::new(&dir, None);
    let mut baton = BatonProcess::start(&dir.path().join("baton"));
    let mut accounts = Vec::new();
    let seed = |n: usize, accounts: &mut Vec<String>| {
        for _ in 0..n {
            let a = format!("kill-{:03}", accounts.len());
            store.seed(&a);
            accounts.push(a);
        }
    };
    seed(6, &mut accounts);
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| {
            store.worker(
                &baton.url(),
                &format!("w{i}"),
                None,
                &["--ttl", "2000ms", "--accounts", "kill-"],
            )
        })
        .collect();
    let kills = 3;
    for k in 0..kills {
        seed(6, &mut accounts);
        let before = probe_token(&baton.url(), &format!("probe-{k}-before")).await;
        baton.kill9_and_restart();
        let after = probe_token(&baton.url(), &format!("probe-{k}-after")).await;
        assert!(
            after > before,
            "token {after} after a restart, {before} before"
        );
    }
    store.all_published(&accounts).await;
    let mut grants = Vec::new();
    for w in &mut workers {
        w.kill9();
        let tokens = acquired_tokens(w.lines());
        assert!(
            tokens.windows(2).all(|p| p[0] < p[1]),
            "one worker's tokens rise across restarts: {tokens:?}"
        );
        grants.extend(tokens);
    }
    let n = grants.len();
    grants.sort_unstable();
    grants.dedup();
    assert_eq!(grants.len(), n, "no token was granted twice");
    let errors: usize = workers
        .iter_mut()
        .map(|w| {
            w.lines()
                .iter()
                .filter(|l| l.contains("\"event\":\"error\""))
                .count()
        })
        .sum();
    let report = clean(&store, "kill-");
    assert_eq!(
        num(&report, "publications_accepted"),
        accounts.len() as i64,
        "every job published exactly once: {report}"
    );
    println!("server killed {kills} times; {n} grants, {errors} worker errors survived; {report}");
}

/// PostgreSQL is restarted in immediate mode (a crash: no shutdown
/// checkpoint, every connection cut) twice while three workers publish: no
/// acknowledged publication is lost and none is doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_restarted_while_workers_run_loses_and_doubles_nothing() {
    let cluster = baton_testkit::pg_cluster::PgCluster::start("stmt-pg-cluster");
    let dir = TempDir::new("stmt-pg-restart");
    let store = Store::new(&dir, Some(cluster.url()));
    let server = local_server(&dir).await;
    let url = format!("http://{}", server.grpc_addr);
    let mut accounts = Vec::new();
    let seed = |n: usize, accounts: &mut Vec<String>| {
        for _ in 0..n {
            let a = format!("pgr-{:03}", accounts.len());
            store.seed(&a);
            accounts.push(a);
        }
    };
    seed(6, &mut accounts);
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| {
            store.worker(
                &url,
                &format!("w{i}"),
                None,
                &["--ttl", "2000ms", "--accounts", "pgr-"],
            )
        })
        .collect();
    let restarts = 2;
    for _ in 0..restarts {
        // New jobs, and at once the crash: the workers are polling (every
        // 50 ms) or in the middle of them.
        seed(6, &mut accounts);
        cluster.ctl(&["-m", "immediate", "restart"]);
    }
    store.all_published(&accounts).await;
    let mut errors = 0;
    for w in &mut workers {
        w.kill9();
        errors += w
            .lines()
            .iter()
            .filter(|l| l.contains("\"event\":\"error\"") || l.contains("publish_unknown"))
            .count();
    }
    assert!(errors >= 1, "the restarts cut no worker's connection");
    let report = clean(&store, "pgr-");
    assert_eq!(
        num(&report, "publications_accepted"),
        accounts.len() as i64,
        "every job published exactly once: {report}"
    );
    println!("PostgreSQL restarted {restarts} times; {errors} worker errors survived; {report}");
}

fn chaos(extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["chaos", "--workers", "8", "--duration", "10s", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    // The report is stdout; the run's own errors, if any, are on stderr.
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// A short chaos run on SQLite is clean and rejects stale attempts; the same
/// run with fencing off must be caught.
#[test]
fn a_short_chaos_run_is_clean_and_its_negative_control_is_caught() {
    let (code, report) = chaos(&["--seed", "11"]);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("\"verdict\":\"clean\""), "{report}");
    assert!(num(&report, "stale_rejected") >= 1, "{report}");
    assert!(num(&report, "kill_server") >= 1, "{report}");
    let (code, report) = chaos(&["--seed", "11", "--negative-control"]);
    assert_eq!(code, Some(1), "{report}");
    assert!(report.contains("\"negative_control\":true"), "{report}");
    assert!(
        num(&report, "stale_overwrites") >= 1,
        "the negative control saw no stale overwrite: the suite proves nothing. {report}"
    );
    // A run with violations keeps its files for inspection; these were expected.
    let files = report
        .split("\"files\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(files.contains("baton-chaos-"), "{files}");
    std::fs::remove_dir_all(files).unwrap();
}

/// On PostgreSQL the run adds outbox dispatchers (killed and paused like
/// the workers), a webhook receiver behind a proxy that drops its answers
/// and an SMTP server that resets connections after DATA: nothing is
/// delivered twice or lost. The negative control's dispatchers retry
/// blindly, and the counts must see the duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_run_on_postgres_neither_duplicates_nor_loses_deliveries() {
    let python = baton_testkit::smtp::python();
    let mut reports = Vec::new();
    for negative in [false, true] {
        let db = PgDb::create(if negative {
            "chaos_outbox_neg"
        } else {
            "chaos_outbox"
        })
        .await;
        let mut c = Command::new(BIN);
        c.args([
            "chaos",
            "--workers",
            "4",
            "--duration",
            "10s",
            "--json",
            "--seed",
            "23",
        ])
        .args(["--database-url", &db.url])
        .env("BATON_CHAOS_PYTHON", &python);
        if negative {
            c.arg("--negative-control");
        }
        let out = c.output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout).to_string();
        eprintln!("{report}\n{}", String::from_utf8_lossy(&out.stderr));
        reports.push((out.status.code(), report));
    }
    let (code, run) = &reports[0];
    assert_eq!(*code, Some(0), "{run}");
    assert!(num(run, "deliveries") > 0, "{run}");
    assert_eq!(
        (
            num(run, "duplicate_deliveries"),
            num(run, "lost_deliveries")
        ),
        (0, 0),
        "{run}"
    );
    let fired = |k: &str| {
        if run.contains(&format!("\"{k}\":")) {
            num(run, k)
        } else {
            0
        }
    };
    assert!(
        fired("kill_dispatcher") + fired("pause_dispatcher") >= 1,
        "{run}"
    );
    let (code, neg) = &reports[1];
    assert_eq!(*code, Some(1), "{neg}");
    assert!(
        num(neg, "duplicate_deliveries") >= 1,
        "blind retries caused no duplicate: the delivery counts prove nothing. {neg}"
    );
    let files = neg
        .split("\"files\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let _ = std::fs::remove_dir_all(files);
}

#[test]
fn chaos_refuses_bad_settings_with_the_rule() {
    for (args, rule) in [
        (vec!["--workers", "0"], "must be 1 to 64"),
        (vec!["--duration", "10x"], "like 500ms, 30s"),
        (vec!["--duration", "0s"], "at least 1s"),
        (vec!["--ttl", "50ms"], "must be 200ms to 60s"),
        (
            vec!["--database-url", "host=/var/run/postgresql user=postgres"],
            "needs a TCP host",
        ),
    ] {
        let out = Command::new(BIN).arg("chaos").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(rule), "{args:?}: {err}");
    }
}
