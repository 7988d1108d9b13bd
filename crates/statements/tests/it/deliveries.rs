//! The outbox end to end, with real processes on loopback: workers that
//! publish and record delivery intents in PostgreSQL, `statements
//! dispatch` processes, the test kit's webhook receiver (idempotency keys
//! and status queries over a real table) and an SMTP server (aiosmtpd).
//! Each scenario counts what the receivers applied or received.

use std::process::{Command, Stdio};

use baton_testkit::process::Proc;
use baton_testkit::smtp::SmtpSink;
use baton_testkit::{PgDb, TempDir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_statements");
const DATE: &str = "2026-10-01";

/// An HTTP client in this test process (TLS on the process's provider).
fn http() -> reqwest::Client {
    baton_telemetry::use_ring_for_https();
    reqwest::Client::new()
}

/// Fields drop in order: the server stops before its directory goes.
struct Env {
    db: PgDb,
    _server: baton_server::RunningServer,
    url: String,
    dir: TempDir,
}

struct Receiver {
    _proc: Proc,
    addr: String,
}

impl Receiver {
    fn hooks(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    async fn stats(&self) -> Value {
        http()
            .get(format!("http://{}/stats", self.addr))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Env {
    async fn new(tag: &str) -> Self {
        let dir = TempDir::new(&format!("deliveries-{tag}"));
        let db = PgDb::create(&format!("deliveries_{tag}")).await;
        let config = baton_server::ServerConfig::ephemeral(dir.path().join("baton-data"));
        let server = baton_server::start(config).await.unwrap();
        let url = format!("http://{}", server.grpc_addr);
        Env {
            dir,
            db,
            _server: server,
            url,
        }
    }

    fn command(&self, subcommand: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(subcommand).args([
            "--database-url",
            &self.db.url,
            "--objects",
            &self.dir.path().join("objects").display().to_string(),
        ]);
        c
    }

    fn ok(&self, c: &mut Command) -> String {
        let out = c.stdin(Stdio::null()).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{c:?}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Seeds `account` and publishes its statement with these notifications.
    fn publish(&self, account: &str, notify: &[&str]) {
        self.ok(self
            .command(&["seed"])
            .args(["--account", account, "--date", DATE]));
        self.ok(self
            .command(&["worker"])
            .args(["--server", &self.url, "--once", "--accounts", account])
            .args(notify));
    }

    fn dispatch_args(&self, name: &str, extra: &[&str]) -> Command {
        let mut c = self.command(&["dispatch"]);
        c.args([
            "--server",
            &self.url,
            "--name",
            name,
            "--ttl",
            "1s",
            "--poll",
            "50ms",
            "--send-timeout",
            "2s",
            "--backoff",
            "20ms",
        ])
        .args(extra);
        c
    }

    fn dispatch_once(&self, name: &str, extra: &[&str]) -> String {
        self.ok(self.dispatch_args(name, extra).arg("--once"))
    }

    fn dispatcher(&self, name: &str, extra: &[&str]) -> Proc {
        Proc::spawn(
            self.dispatch_args(name, extra).stderr(Stdio::null()),
            "dispatcher",
        )
    }

    fn receiver(&self, schema: &str, extra: &[&str]) -> Receiver {
        let (proc, addr) = Proc::listening(
            Command::new(BIN)
                .args([
                    "webhook-receiver",
                    "--database-url",
                    &self.db.url,
                    "--schema",
                    schema,
                ])
                .args(extra)
                .stderr(Stdio::inherit()),
            "webhook receiver",
        );
        Receiver { _proc: proc, addr }
    }

    fn deliveries(&self, state: Option<&str>) -> Vec<Value> {
        let mut c = self.command(&["deliveries", "list", "--json"]);
        if let Some(s) = state {
            c.args(["--state", s]);
        }
        self.ok(&mut c)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn events(&self, id: i64) -> Vec<String> {
        let shown: Value = serde_json::from_str(&self.ok(&mut self.command(&[
            "deliveries",
            "show",
            &id.to_string(),
            "--json",
        ])))
        .unwrap();
        shown["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event"].as_str().unwrap().to_string())
            .collect()
    }

    async fn until_state(&self, state: &str, n: usize) {
        baton_testkit::until(async || self.deliveries(Some(state)).len() == n).await;
    }
}

fn only(rows: Vec<Value>) -> Value {
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_is_reconciled_and_applied_once() {
    let env = Env::new("lost").await;
    let receiver = env.receiver("recv", &[]);
    let proxy = baton_faults::Proxy::start(receiver.addr.parse().unwrap())
        .await
        .unwrap();
    let url = format!("http://{}/hooks", proxy.addr());
    env.publish("acct-lost", &["--notify-webhook", &url]);
    let row = only(env.deliveries(Some("pending")));
    // The receiver applies the post; its answer is lost on the way back.
    proxy.drop_response_to(row["operation"].as_str().unwrap().as_bytes());
    let out = env.dispatch_once("d1", &[]);
    assert_eq!(proxy.counts().dropped_responses, 1, "the fault fired");
    let row = only(env.deliveries(Some("delivered")));
    assert!(
        row["evidence"].as_str().unwrap().contains("status query"),
        "{row}"
    );
    let stats = receiver.stats().await;
    assert_eq!(
        (stats["applications"].as_i64(), stats["duplicates"].as_i64()),
        (Some(1), Some(0)),
        "{stats}\n{out}"
    );
    eprintln!("fault fired 1; receiver {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_after_sending_is_replaced_without_a_second_application() {
    let env = Env::new("killed").await;
    let receiver = env.receiver("recv", &[]);
    env.publish("acct-killed", &["--notify-webhook", &receiver.hooks()]);
    let out = env
        .dispatch_args("crasher", &["--once", "--crash-after-send"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the drill aborts");
    let row = only(env.deliveries(Some("sending")));
    assert_eq!(receiver.stats().await["applications"].as_i64(), Some(1));
    // The replacement waits out the crashed dispatcher's lease, then asks.
    let replacement = env.dispatcher("replacement", &[]);
    env.until_state("delivered", 1).await;
    drop(replacement);
    let stats = receiver.stats().await;
    assert_eq!(
        (stats["applications"].as_i64(), stats["posts"].as_i64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    let id = row["id"].as_i64().unwrap();
    let events = env.events(id);
    assert_eq!(
        events.iter().filter(|e| *e == "sending").count(),
        1,
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_dispatchers_deliver_each_row_once() {
    let env = Env::new("race").await;
    let receiver = env.receiver("recv", &[]);
    const N: usize = 12;
    for i in 0..N {
        env.publish(
            &format!("acct-race-{i:02}"),
            &["--notify-webhook", &receiver.hooks()],
        );
    }
    let a = env.dispatcher("a", &[]);
    let b = env.dispatcher("b", &[]);
    env.until_state("delivered", N).await;
    drop((a, b));
    let stats = receiver.stats().await;
    assert_eq!(
        (
            stats["applications"].as_i64(),
            stats["posts"].as_i64(),
            stats["duplicates"].as_i64()
        ),
        (Some(N as i64), Some(N as i64), Some(0)),
        "{stats}"
    );
    let by: std::collections::BTreeSet<String> = env
        .deliveries(None)
        .iter()
        .map(|d| d["claimed_by"].as_str().unwrap().to_string())
        .collect();
    eprintln!("{N} deliveries by {by:?}; receiver {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_dispatchers_late_outcome_is_refused() {
    let env = Env::new("stale").await;
    let receiver = env.receiver("recv", &[]);
    env.publish("acct-stale", &["--notify-webhook", &receiver.hooks()]);
    // The first dispatcher sends, then pauses before recording; its lease
    // runs out.
    let mut paused = Proc::spawn(
        &mut env.dispatch_args("paused", &["--once", "--pause-after-send"]),
        "paused dispatcher",
    );
    // The event, not the name: every line of this dispatcher carries
    // `"dispatcher":"paused"`, so `"paused"` alone matched its first line,
    // before the send had begun.
    paused.wait_for("\"event\":\"paused\"");
    let row = only(env.deliveries(Some("sending")));
    let id = row["id"].as_i64().unwrap();
    // The successor finds the send in doubt, asks the receiver, and
    // records the answer with its newer token.
    baton_testkit::until(async || {
        env.dispatch_once("successor", &[]);
        env.events(id).iter().any(|e| e == "delivered")
    })
    .await;
    paused.signal(nix::sys::signal::Signal::SIGCONT);
    let (code, rest) = paused.exit();
    assert_eq!(code, Some(0), "{rest}");
    assert!(
        rest.lines()
            .any(|l| l.contains("outcome_refused") && l.contains("stale")),
        "{rest}"
    );
    let events = env.events(id);
    assert!(
        events.contains(&"refused_stale_outcome".to_string()),
        "{events:?}"
    );
    assert_eq!(receiver.stats().await["applications"].as_i64(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_confirm_and_a_late_one_changes_nothing() {
    let env = Env::new("callback").await;
    let port = baton_testkit::pg_cluster::free_port();
    let callback = format!("http://127.0.0.1:{port}/callback");
    let token_file = env.dir.path().join("callback-token");
    std::fs::write(&token_file, "s3cret-callback-token\n").unwrap();
    let token_path = token_file.display().to_string();
    let receiver = env.receiver(
        "recv",
        &[
            "--accept-async",
            &callback,
            "--confirm-after",
            "100ms",
            "--callback-token-file",
            &token_path,
        ],
    );
    env.publish("acct-callback", &["--notify-webhook", &receiver.hooks()]);
    let listen = format!("127.0.0.1:{port}");
    // Without a token the endpoint is refused at start.
    let out = env
        .dispatch_args("d", &["--once", "--callback-listen", &listen])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--callback-token-file"));
    let d = env.dispatcher(
        "d",
        &[
            "--callback-listen",
            &listen,
            "--callback-token-file",
            &token_path,
        ],
    );
    env.until_state("delivered", 1).await;
    let row = only(env.deliveries(Some("delivered")));
    let id = row["id"].as_i64().unwrap();
    let events = env.events(id);
    assert!(
        events.contains(&"accepted".to_string()) && events.contains(&"confirmed".to_string()),
        "{events:?}"
    );
    // A late callback that says otherwise changes nothing.
    // A callback without the token changes nothing and is refused.
    let forged = http()
        .post(&callback)
        .json(&serde_json::json!({"idempotency_key": row["operation"], "status": "failed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    let late: Value = http()
        .post(&callback)
        .bearer_auth("s3cret-callback-token")
        .json(&serde_json::json!({"idempotency_key": row["operation"], "status": "failed", "detail": "late"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(late["outcome"], "ignored");
    assert_eq!(only(env.deliveries(None))["state"], "delivered");
    let bad = http()
        .post(&callback)
        .bearer_auth("s3cret-callback-token")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_back_off_and_a_refusal_fails() {
    let env = Env::new("retries").await;
    let flaky = env.receiver("flaky", &["--fail-first", "2"]);
    env.publish("acct-flaky", &["--notify-webhook", &flaky.hooks()]);
    let d = env.dispatcher("d", &[]);
    env.until_state("delivered", 1).await;
    drop(d);
    assert_eq!(only(env.deliveries(None))["attempts"].as_i64(), Some(3));
    assert_eq!(flaky.stats().await["applications"].as_i64(), Some(1));
    let refusing = env.receiver("refusing", &["--refuse"]);
    env.publish("acct-refused", &["--notify-webhook", &refusing.hooks()]);
    env.dispatch_once("d", &[]);
    let failed = only(env.deliveries(Some("failed")));
    assert!(
        failed["evidence"].as_str().unwrap().contains("HTTP 400"),
        "{failed}"
    );
    assert_eq!(failed["attempts"].as_i64(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_dropped_after_data_needs_attention_and_is_resent_once_on_request() {
    let env = Env::new("smtp").await;
    let sink = SmtpSink::start(&env.dir.path().join("smtp"));
    let smtp = ["--smtp", sink.addr.as_str()];
    // A clean send: one message, delivered.
    env.publish("acct-mail-ok", &["--notify-email", "ok@example.com"]);
    env.dispatch_once("d", &smtp);
    assert_eq!(sink.messages().len(), 1);
    assert_eq!(
        only(env.deliveries(Some("delivered")))["recipient"],
        "ok@example.com"
    );
    // The connection drops after DATA: the message arrived, the dispatcher
    // cannot know, and it does not send again.
    env.publish("acct-mail-lost", &["--notify-email", "lost@example.com"]);
    sink.drop_next();
    env.dispatch_once("d", &smtp);
    env.dispatch_once("d", &smtp);
    assert_eq!(sink.messages().len(), 2, "the dropped message arrived once");
    let row = only(env.deliveries(Some("needs_attention")));
    assert!(
        row["evidence"]
            .as_str()
            .unwrap()
            .contains("outcome unknown"),
        "{row}"
    );
    let id = row["id"].as_i64().unwrap().to_string();
    // `statements show` says so.
    let shown =
        env.ok(env
            .command(&["show"])
            .args(["--account", "acct-mail-lost", "--date", DATE]));
    assert!(shown.contains("needs_attention"), "{shown}");
    // A resend needs confirmation: refused without a terminal or --yes.
    let refused = env
        .command(&[
            "deliveries",
            "resolve",
            &id,
            "--resend",
            "--by",
            "alice",
            "--reason",
            "customer says nothing came",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("second copy"));
    env.ok(&mut env.command(&[
        "deliveries",
        "resolve",
        &id,
        "--resend",
        "--yes",
        "--by",
        "alice",
        "--reason",
        "customer says nothing came",
    ]));
    env.dispatch_once("d", &smtp);
    assert_eq!(sink.messages().len(), 3, "exactly one more");
    let row = only(
        env.deliveries(Some("delivered"))
            .into_iter()
            .filter(|d| d["recipient"] == "lost@example.com")
            .collect(),
    );
    assert_eq!(
        (row["resolved_by"].as_str(), row["resolution"].as_str()),
        (Some("alice"), Some("resend"))
    );
    let ops: Vec<bool> = sink
        .messages()
        .iter()
        .map(|m| m.contains("X-Baton-Operation"))
        .collect();
    assert_eq!(ops, [true, true, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_job_cancels_its_unsent_deliveries() {
    let env = Env::new("cancel").await;
    let receiver = env.receiver("recv", &[]);
    let sink = SmtpSink::start(&env.dir.path().join("smtp"));
    env.publish(
        "acct-cancel",
        &[
            "--notify-webhook",
            &receiver.hooks(),
            "--notify-email",
            "c@example.com",
        ],
    );
    assert_eq!(env.deliveries(Some("pending")).len(), 2);
    env.ok(env.command(&["cancel"]).args([
        "--server",
        &env.url,
        "--account",
        "acct-cancel",
        "--date",
        DATE,
    ]));
    assert_eq!(env.deliveries(Some("cancelled")).len(), 2);
    env.dispatch_once("d", &["--smtp", sink.addr.as_str()]);
    assert_eq!(receiver.stats().await["posts"].as_i64(), Some(0));
    assert!(sink.messages().is_empty());
}

/// What a storm left behind, counted at the receivers and in the outbox.
#[derive(Debug)]
struct StormFigures {
    faults: std::collections::BTreeMap<&'static str, u64>,
    intents: usize,
    delivered: usize,
    needs_attention: usize,
    failed: usize,
    /// Webhook operations the receiver applied more than once.
    duplicate_webhooks: i64,
    /// Emails that arrived more than once (by operation).
    duplicate_emails: usize,
    /// Intents of acknowledged publications with neither a delivery nor a
    /// needs_attention row once the dispatchers drained.
    lost: usize,
}

/// Publishes `accounts` statements with a webhook and an email each, then
/// runs three dispatchers for `storm` while killing (SIGKILL) and pausing
/// (SIGSTOP) them, dropping webhook responses after the receiver applied,
/// and resetting SMTP connections after DATA; then lets them drain (at most
/// 60 s) and counts.
async fn storm(
    tag: &str,
    seed: u64,
    accounts: usize,
    storm: std::time::Duration,
    smtp_drop_pct: u32,
    blind: bool,
) -> StormFigures {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let env = Env::new(tag).await;
    let receiver = env.receiver("recv", &[]);
    let proxy = baton_faults::Proxy::start(receiver.addr.parse().unwrap())
        .await
        .unwrap();
    let hooks = format!("http://{}/hooks", proxy.addr());
    let sink = SmtpSink::start_with(
        &env.dir.path().join("smtp"),
        &[
            "--drop-pct",
            &smtp_drop_pct.to_string(),
            "--seed",
            &seed.to_string(),
        ],
    );
    for i in 0..accounts {
        env.ok(env
            .command(&["seed"])
            .args(["--account", &format!("acct-{i:03}"), "--date", DATE]));
    }
    env.ok(env.command(&["worker"]).args([
        "--server",
        &env.url,
        "--once",
        "--notify-webhook",
        &hooks,
        "--notify-email",
        "storm@example.com",
    ]));
    let mut extra = vec!["--smtp", sink.addr.as_str(), "--max-attempts", "20"];
    if blind {
        extra.push("--blind-retries");
    }
    let names = ["d0", "d1", "d2"];
    let mut procs: Vec<Proc> = names.iter().map(|n| env.dispatcher(n, &extra)).collect();
    let mut rng = baton_client::rng::Rng::new(seed);
    let mut faults = std::collections::BTreeMap::new();
    let started = std::time::Instant::now();
    let mut stopped: Vec<(usize, std::time::Instant)> = Vec::new();
    while started.elapsed() < storm {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        stopped.retain(|(i, until)| {
            if std::time::Instant::now() >= *until {
                let _ = kill(Pid::from_raw(procs[*i].pid() as i32), Signal::SIGCONT);
                false
            } else {
                true
            }
        });
        let i = rng.below(3) as usize;
        match rng.below(10) {
            0 => {
                stopped.retain(|(j, _)| *j != i);
                procs[i] = env.dispatcher(names[i], &extra);
                *faults.entry("dispatcher_kills").or_insert(0) += 1;
            }
            1 if !stopped.iter().any(|(j, _)| *j == i) => {
                let _ = kill(Pid::from_raw(procs[i].pid() as i32), Signal::SIGSTOP);
                let pause = std::time::Duration::from_millis(500 + rng.below(2000));
                stopped.push((i, std::time::Instant::now() + pause));
                *faults.entry("dispatcher_pauses").or_insert(0) += 1;
            }
            2 | 3 => proxy.drop_next_response(),
            _ => {}
        }
    }
    for (i, _) in stopped.drain(..) {
        let _ = kill(Pid::from_raw(procs[i].pid() as i32), Signal::SIGCONT);
    }
    faults.insert(
        "webhook_responses_dropped",
        proxy.counts().dropped_responses,
    );
    let open = ["pending", "claimed", "sending", "accepted"];
    baton_testkit::eventually(std::time::Duration::from_secs(60), async || {
        let rows = env.deliveries(None);
        let waiting: Vec<String> = rows
            .iter()
            .filter(|d| open.contains(&d["state"].as_str().unwrap()))
            .map(|d| {
                format!(
                    "{} {} {} {}",
                    d["id"], d["state"], d["attempts"], d["next_attempt_at"]
                )
            })
            .collect();
        if !waiting.is_empty() {
            eprintln!("waiting: {waiting:?}");
        }
        waiting.is_empty()
    })
    .await;
    drop(procs);
    let rows = env.deliveries(None);
    let count = |s: &str| rows.iter().filter(|d| d["state"] == s).count();
    let mails = sink.messages();
    let ops: Vec<String> = mails
        .iter()
        .filter_map(|m| {
            m.lines()
                .find(|l| l.starts_with("X-Baton-Operation:"))
                .map(str::to_string)
        })
        .collect();
    let distinct: std::collections::BTreeSet<&String> = ops.iter().collect();
    let dropped_mail = std::fs::read_to_string(sink.dir.join("dropped.log")).unwrap_or_default();
    faults.insert(
        "smtp_connections_reset_after_data",
        dropped_mail.lines().count() as u64,
    );
    let stats = receiver.stats().await;
    StormFigures {
        faults,
        intents: rows.len(),
        delivered: count("delivered"),
        needs_attention: count("needs_attention"),
        failed: count("failed"),
        duplicate_webhooks: stats["duplicates"].as_i64().unwrap(),
        duplicate_emails: ops.len() - distinct.len(),
        lost: 2 * accounts - count("delivered") - count("needs_attention"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_kills_pauses_and_lost_answers_neither_duplicates_nor_loses() {
    let seed = std::env::var("BATON_STORM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64);
    let secs = std::env::var("BATON_STORM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let f = storm(
        "storm",
        seed,
        24,
        std::time::Duration::from_secs(secs),
        15,
        false,
    )
    .await;
    eprintln!("storm seed {seed}: {f:?}");
    assert!(f.faults.values().sum::<u64>() > 0, "faults fired: {f:?}");
    assert_eq!(f.intents, 48, "two intents per publication: {f:?}");
    assert_eq!(
        (f.duplicate_webhooks, f.duplicate_emails, f.lost),
        (0, 0, 0),
        "seed {seed}: {f:?}"
    );
    assert_eq!(f.failed, 0, "{f:?}");
    assert_eq!(f.delivered + f.needs_attention, f.intents, "{f:?}");
}

/// The negative control: the same storm with dispatchers that send no
/// idempotency key and retry whatever the receiver. The counts must see
/// the duplicates, or the storm above proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storm_sees_duplicates_when_dispatchers_retry_blindly() {
    let f = storm(
        "storm_blind",
        7,
        12,
        std::time::Duration::from_secs(4),
        50,
        true,
    )
    .await;
    eprintln!("negative control: {f:?}");
    assert!(
        f.duplicate_webhooks + f.duplicate_emails as i64 > 0,
        "{f:?}"
    );
}
