//! The statement service with real worker processes against a Baton server
//! on loopback: the paused worker, crashes at the two dangerous points, and
//! cancellation while a worker is generating.

use baton_fence::resource_name;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use baton_client::Client;
use baton_fence::objects::ObjectKit;
use baton_fence::sqlite::SqliteFence;
use baton_testkit::process::Proc;

const BIN: &str = env!("CARGO_BIN_EXE_statements");
const ACCOUNT: &str = "account-7";
const DATE: &str = "2026-10-01";
const RESOURCE: &str = "statement:account-7:2026-10-01";

struct Env {
    dir: PathBuf,
    /// The lease server, in this process, on a loopback socket.
    _server: baton_server::RunningServer,
    url: String,
    /// With objects in an S3-compatible server instead of a directory.
    s3: Option<baton_testkit::s3::S3Server>,
}

impl Env {
    /// [`Env::new`] with the objects in a bucket of a moto server, reached
    /// as users reach one: `--objects s3://BUCKET/PREFIX` and the AWS
    /// variables.
    async fn new_s3(tag: &str) -> Self {
        let mut env = Self::new(tag).await;
        env.s3 = Some(baton_testkit::s3::S3Server::start(&format!("stmt-{tag}")));
        env
    }

    async fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("statements-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = baton_server::ServerConfig::ephemeral(dir.join("baton-data"));
        let server = baton_server::start(config).await.unwrap();
        let url = format!("http://{}", server.grpc_addr);
        let env = Env {
            dir,
            _server: server,
            url,
            s3: None,
        };
        env.seed();
        env
    }

    fn paths(&self) -> Vec<String> {
        let objects = match &self.s3 {
            Some(s3) => format!("s3://{}/statements-prod", s3.bucket),
            None => self.objects().display().to_string(),
        };
        vec![
            "--db".into(),
            self.db().display().to_string(),
            "--objects".into(),
            objects,
        ]
    }

    /// A command of this binary with the S3 variables, if any.
    fn command(&self, subcommand: &str) -> Command {
        let mut c = Command::new(BIN);
        c.arg(subcommand).args(self.paths());
        if let Some(s3) = &self.s3 {
            c.envs(s3.env());
        }
        c
    }

    fn db(&self) -> PathBuf {
        self.dir.join("statements.sqlite")
    }

    fn objects(&self) -> PathBuf {
        self.dir.join("objects")
    }

    fn seed(&self) {
        let out = self
            .command("seed")
            .args(["--account", ACCOUNT, "--date", DATE])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    fn worker(&self, name: &str, extra: &[&str]) -> Command {
        let mut c = self.command("worker");
        c.args([
            "--server", &self.url, "--name", name, "--ttl", "2000ms", "--once",
        ])
        .args(extra);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c
    }

    fn run_worker(&self, name: &str, extra: &[&str]) -> (Output, String) {
        let out = self.worker(name, extra).output().unwrap();
        let text = String::from_utf8(out.stdout.clone()).unwrap();
        (out, text)
    }

    /// Waits (polling the server) until no lease holds the statement: the
    /// crashed or paused worker's lease ran out.
    async fn lease_free(&self) {
        let mut c = Client::connect(&self.url).await.unwrap();
        baton_testkit::until(async || c.status(RESOURCE).await.unwrap().holder_token.is_none())
            .await;
    }

    fn job_state(&self) -> String {
        let conn = rusqlite::Connection::open(self.db()).unwrap();
        conn.query_row(
            "SELECT state FROM jobs WHERE account = ?1 AND date = ?2",
            [ACCOUNT, DATE],
            |r| r.get(0),
        )
        .unwrap()
    }

    fn publication(&self) -> Option<baton_fence::Publication> {
        let conn = rusqlite::Connection::open(self.db()).unwrap();
        SqliteFence::publication(&conn, &resource_name(RESOURCE).unwrap()).unwrap()
    }

    async fn objects_published(&self) -> Vec<String> {
        let kit = match &self.s3 {
            Some(s3) => {
                baton_telemetry::use_ring_for_https();
                let store = object_store::aws::AmazonS3Builder::new()
                    .with_endpoint(&s3.endpoint)
                    .with_allow_http(true)
                    .with_bucket_name(&s3.bucket)
                    .with_region("us-east-1")
                    .with_access_key_id(baton_testkit::s3::ACCESS_KEY)
                    .with_secret_access_key(baton_testkit::s3::SECRET_KEY)
                    .build()
                    .unwrap();
                ObjectKit::new(std::sync::Arc::new(store), "statements-prod")
            }
            None => ObjectKit::local(&self.objects()).unwrap(),
        };
        kit.list("statements").await.unwrap()
    }
}

impl Env {
    /// `statements inspect ACCOUNT DATE --json` against `server`: exit code and JSON.
    fn inspect(&self, server: &str) -> (Option<i32>, serde_json::Value) {
        let out = self
            .command("inspect")
            .args(["--server", server, ACCOUNT, DATE, "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text:?} {:?}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), json)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn events(text: &str, event: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
        .map(str::to_string)
        .collect()
}

fn token(line: &str) -> i64 {
    let at = line.find("\"token\":").unwrap() + 8;
    line[at..]
        .split([',', '}'])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Starts `alice` with `pause_flag`, waits until she has stopped herself
/// with SIGSTOP, runs `between`, resumes her with SIGCONT and returns her
/// output before and after the pause.
async fn pause_story(env: &Env, pause_flag: &str, between: impl AsyncFnOnce()) -> (String, String) {
    let mut alice = Proc::spawn(&mut env.worker("alice", &[pause_flag]), "alice's worker");
    alice.wait_for("\"event\":\"paused\"");
    let before = alice.lines().join("\n");
    baton_testkit::until(async || alice.stopped()).await;
    between().await;
    alice.signal(nix::sys::signal::Signal::SIGCONT);
    let (_, after) = alice.exit();
    (before, after)
}

#[test]
fn the_demo_ends_as_the_seed_says() {
    let out = Command::new(BIN)
        .args(["demo", "--json"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("\"stale_outcome\":\"stale\"") && text.contains("\"verdict\":\"ok\""),
        "{text}"
    );
    let field = |k: &str| -> i64 {
        let at = text.find(&format!("\"{k}\":")).unwrap() + k.len() + 3;
        text[at..]
            .split([',', '}'])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(field("authoritative_token") > field("stale_token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_resumes_and_is_rejected_as_stale() {
    a_paused_worker_resumes_and_is_rejected_as_stale_with(Env::new("paused").await).await;
}

/// The same, with the objects in an S3-compatible server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_resumes_and_is_rejected_as_stale_on_s3() {
    a_paused_worker_resumes_and_is_rejected_as_stale_with(Env::new_s3("paused").await).await;
}

async fn a_paused_worker_resumes_and_is_rejected_as_stale_with(env: Env) {
    let mut bob_text = String::new();
    let (before, after) = pause_story(&env, "--pause-before-publish", async || {
        env.lease_free().await;
        let (bob, text) = env.run_worker("bob", &[]);
        assert!(bob.status.success());
        bob_text = text;
    })
    .await;
    let alice_token = token(&events(&before, "acquired")[0]);
    let bob_token = token(&events(&bob_text, "published")[0]);
    let refused = events(&after, "publish_refused");
    assert_eq!(refused.len(), 1, "{after}");
    assert!(refused[0].contains("\"outcome\":\"stale\""), "{after}");
    assert!(bob_token > alice_token);
    assert_eq!(
        env.publication().unwrap().token.bigint(),
        bob_token,
        "the higher token is authoritative"
    );
    let conn = rusqlite::Connection::open(env.db()).unwrap();
    let recorded: String = conn
        .query_row(
            "SELECT outcome FROM worker_outcomes WHERE worker = 'alice'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        recorded, "stale",
        "the resumed worker recorded a stale-owner outcome"
    );
    assert_eq!(env.job_state(), "published");

    // The incident procedure: Bob's generation, Alice's refusal beside it.
    let (code, shown) = env.inspect(&env.url);
    assert_eq!(code, Some(0), "{shown}");
    assert_eq!(shown["published_token"], bob_token, "{shown}");
    assert_eq!(shown["verdict"]["authoritative_token"], bob_token);
    assert_eq!(shown["verdict"]["stale_attempts"], 1);
    assert_eq!(shown["verdict"]["recovery_mismatch"], false);
    assert_eq!(shown["object"], "valid");
    assert_eq!(shown["lease"]["state"], "free");
    let outcomes = shown["outcomes"].as_array().unwrap();
    assert!(
        outcomes.iter().any(|o| o["worker"] == "alice"
            && o["outcome"] == "stale"
            && o["token"] == alice_token),
        "{shown}"
    );
    let line = shown["verdict"]["line"].as_str().unwrap();
    assert!(
        line.starts_with(&format!("generation {bob_token} is authoritative"))
            && line.contains("1 stale attempt"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_plain_publication_and_the_lease_holder() {
    let env = Env::new("inspect-plain").await;
    let (out, text) = env.run_worker("bob", &[]);
    assert!(out.status.success(), "{text}");
    let bob_token = token(&events(&text, "published")[0]);
    let (code, shown) = env.inspect(&env.url);
    assert_eq!(code, Some(0), "{shown}");
    assert_eq!(shown["job_state"], "published");
    assert_eq!(shown["verdict"]["authoritative_token"], bob_token);
    assert_eq!(shown["verdict"]["stale_attempts"], 0);
    assert_eq!(
        shown["manifest_size_bytes"].as_u64().map(|n| n > 0),
        Some(true)
    );
    assert!(
        shown["manifest_sha256"].as_str().unwrap().len() == 64,
        "{shown}"
    );
    // Someone holds the lease now: the view says so, with its token.
    let mut c = Client::connect(&env.url).await.unwrap();
    let baton_client::Acquired::Granted(held) = c
        .acquire(
            RESOURCE,
            Some(std::time::Duration::from_secs(30)),
            std::time::Duration::ZERO,
        )
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let (_, shown) = env.inspect(&env.url);
    assert_eq!(shown["lease"]["state"], "held", "{shown}");
    assert_eq!(shown["lease"]["token"], held.token.bigint());
    assert_eq!(shown["lease"]["issued_through"], held.token.bigint());
    // The text form ends with the verdict line.
    let out = Command::new(BIN)
        .arg("inspect")
        .args(env.paths())
        .args(["--server", &env.url, ACCOUNT, DATE])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("lease:        held by token"), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with(&format!("verdict: generation {bob_token} is authoritative")),
        "{text}"
    );
    // Readers holding it shared instead: every holder, by slot.
    c.release(RESOURCE, &held.acquisition_id).await.unwrap();
    let ttl = Some(std::time::Duration::from_secs(30));
    let mut readers = vec![];
    for _ in 0..2 {
        let baton_client::AcquiredAll::Granted { leases, .. } = c
            .acquire_shaped(
                &[(RESOURCE, baton_client::Shape::Shared)],
                ttl,
                std::time::Duration::ZERO,
            )
            .await
            .unwrap()
        else {
            panic!("a reader refused")
        };
        readers.push(leases[0].token.bigint());
    }
    let (_, shown) = env.inspect(&env.url);
    assert_eq!(shown["lease"]["state"], "held_by_slots", "{shown}");
    let tokens: Vec<i64> = shown["lease"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["token"].as_i64().unwrap())
        .collect();
    assert_eq!(tokens, readers, "{shown}");
    // An unreachable lease server is said, not guessed.
    let (code, shown) = env.inspect("http://127.0.0.1:1");
    assert_eq!(code, Some(0));
    assert_eq!(shown["lease"]["state"], "unreachable", "{shown}");
}

/// A lease server that lost its state (a fresh data directory here; in
/// production a restore without `--floor-from`) issues tokens below what
/// the resource stored: inspect names the mismatch and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_a_recovery_mismatch() {
    let env = Env::new("inspect-mismatch").await;
    for _ in 0..3 {
        let mut c = Client::connect(&env.url).await.unwrap();
        c.fence("elsewhere").await.unwrap();
    }
    let (out, text) = env.run_worker("bob", &[]);
    assert!(out.status.success(), "{text}");
    let stored = token(&events(&text, "published")[0]);
    let fresh_dir = env.dir.join("fresh-baton-data");
    let fresh = baton_server::start(baton_server::ServerConfig::ephemeral(fresh_dir))
        .await
        .unwrap();
    let fresh_url = format!("http://{}", fresh.grpc_addr);
    let (code, shown) = env.inspect(&fresh_url);
    assert_eq!(code, Some(1), "a mismatch exits 1: {shown}");
    assert_eq!(shown["verdict"]["recovery_mismatch"], true);
    let issued = shown["lease"]["issued_through"].as_i64().unwrap();
    assert!(issued < stored, "{issued} < {stored}");
    let line = shown["verdict"]["line"].as_str().unwrap();
    assert!(line.starts_with("RECOVERY MISMATCH"), "{line}");
    assert!(
        line.contains(&stored.to_string()) && line.contains("--floor-from"),
        "{line}"
    );
    // Against the server that issued the tokens, no mismatch.
    assert_eq!(env.inspect(&env.url).0, Some(0));
    fresh.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_publishing_is_completed_without_a_new_generation() {
    let env = Env::new("crash-publish").await;
    let (first, text) = env.run_worker("first", &["--crash-after", "publish"]);
    assert!(!first.status.success(), "the worker aborted");
    let published = token(&events(&text, "published")[0]);
    assert_eq!(
        env.job_state(),
        "generating",
        "crashed before completing the job"
    );
    env.lease_free().await;
    let (second, text) = env.run_worker("second", &[]);
    assert!(second.status.success());
    assert_eq!(events(&text, "completed_bookkeeping").len(), 1, "{text}");
    assert!(
        events(&text, "uploaded").is_empty() && events(&text, "published").is_empty(),
        "{text}"
    );
    assert_eq!(env.job_state(), "published");
    assert_eq!(
        env.publication().unwrap().token.bigint(),
        published,
        "still the first worker's generation"
    );
    assert_eq!(env.objects_published().await.len(), 1, "no second object");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_uploading_is_reused_when_valid() {
    a_crash_after_uploading_is_reused_when_valid_with(Env::new("crash-upload-reuse").await).await;
}

/// The same, with the objects in an S3-compatible server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_uploading_is_reused_when_valid_on_s3() {
    a_crash_after_uploading_is_reused_when_valid_with(Env::new_s3("crash-upload-reuse").await)
        .await;
}

async fn a_crash_after_uploading_is_reused_when_valid_with(env: Env) {
    let (first, text) = env.run_worker("first", &["--crash-after", "upload"]);
    assert!(!first.status.success());
    let uploaded = events(&text, "uploaded");
    assert_eq!(uploaded.len(), 1);
    assert!(env.publication().is_none());
    env.lease_free().await;
    let (second, text) = env.run_worker("second", &[]);
    assert!(second.status.success());
    assert_eq!(events(&text, "reuse_candidate").len(), 1, "{text}");
    let pointer = env.publication().unwrap();
    assert_eq!(
        pointer.token.bigint(),
        token(&events(&text, "published")[0]),
        "published under the replacement's own token"
    );
    assert!(
        uploaded[0].contains(&pointer.object_key),
        "the first worker's validated object"
    );
    assert_eq!(env.objects_published().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_uploading_is_regenerated_when_the_input_changed() {
    a_crash_after_uploading_is_regenerated_when_the_input_changed_with(
        Env::new("crash-upload-regen").await,
    )
    .await;
}

/// The same, with the objects in an S3-compatible server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_uploading_is_regenerated_when_the_input_changed_on_s3() {
    a_crash_after_uploading_is_regenerated_when_the_input_changed_with(
        Env::new_s3("crash-upload-regen").await,
    )
    .await;
}

async fn a_crash_after_uploading_is_regenerated_when_the_input_changed_with(env: Env) {
    let (first, _) = env.run_worker("first", &["--crash-after", "upload"]);
    assert!(!first.status.success());
    env.seed(); // the account data moves to input version 2
    env.lease_free().await;
    let (second, text) = env.run_worker("second", &[]);
    assert!(second.status.success());
    let rejected = events(&text, "candidate_rejected");
    assert_eq!(rejected.len(), 1, "{text}");
    assert!(rejected[0].contains("input snapshot"), "{}", rejected[0]);
    let own = token(&events(&text, "uploaded")[0]);
    let pointer = env.publication().unwrap();
    assert_eq!(pointer.token.bigint(), own);
    assert!(pointer
        .object_key
        .ends_with(&format!("generation-{own}.txt")));
    assert_eq!(env.objects_published().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_while_generating_rejects_the_later_publish() {
    let env = Env::new("cancel").await;
    let (_, after) = pause_story(&env, "--pause-before-publish", async || {
        let cancel = Command::new(BIN)
            .arg("cancel")
            .args(env.paths())
            .args(["--server", &env.url, "--account", ACCOUNT, "--date", DATE])
            .output()
            .unwrap();
        assert!(cancel.status.success(), "{cancel:?}");
    })
    .await;
    let refused = events(&after, "publish_refused");
    assert_eq!(refused.len(), 1, "{after}");
    assert!(refused[0].contains("\"outcome\":\"cancelled\""), "{after}");
    assert!(env.publication().is_none(), "nothing published");
    assert_eq!(env.job_state(), "cancelled");
    let (code, shown) = env.inspect(&env.url);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown["cancelled_at"].as_u64().unwrap() > 0, "{shown}");
    assert_eq!(
        shown["verdict"]["authoritative_token"],
        serde_json::Value::Null
    );
    let line = shown["verdict"]["line"].as_str().unwrap();
    assert!(
        line.starts_with(&format!(
            "nothing is published: the job is cancelled at {}",
            shown["cancelled_at"]
        )),
        "{line}"
    );
    assert!(
        shown["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["outcome"] == "cancelled"),
        "{shown}"
    );
    // A replacement does not take an expired lease as permission to restart a cancelled job.
    env.lease_free().await;
    let (_, text) = env.run_worker("replacement", &[]);
    assert!(events(&text, "uploaded").is_empty(), "{text}");
    assert_eq!(env.job_state(), "cancelled");
}

#[tokio::test]
async fn the_demo_ends_as_the_seed_says_on_postgresql() {
    let db = baton_testkit::PgDb::create("statements_demo").await;
    let url = db.url.clone();
    let out = Command::new(BIN)
        .args(["demo", "--json", "--database-url", &url])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    drop(db);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("\"stale_outcome\":\"stale\"") && text.contains("\"verdict\":\"ok\""),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_after_reading_stops_itself_before_any_effect() {
    let env = Env::new("paused-read").await;
    let mut bob_text = String::new();
    let (_, after) = pause_story(&env, "--pause-after-read", async || {
        env.lease_free().await;
        bob_text = env.run_worker("bob", &[]).1;
    })
    .await;
    let bob_token = token(&events(&bob_text, "published")[0]);
    // Her keeper's deadline passed while she was stopped: she knows before any effect.
    let lost = events(&after, "lease_lost");
    assert_eq!(lost.len(), 1, "{after}");
    assert!(lost[0].contains("after reading input"), "{after}");
    assert!(
        events(&after, "uploaded").is_empty() && events(&after, "publish_refused").is_empty(),
        "{after}"
    );
    assert_eq!(env.publication().unwrap().token.bigint(), bob_token);
    assert_eq!(env.objects_published().await.len(), 1, "only Bob's object");
}

/// A newcomer's mistakes get one line and a documented exit code.
#[test]
fn a_bad_date_is_usage_and_an_unknown_job_is_exit_3() {
    let dir = baton_testkit::TempDir::new("stmt-codes");
    let db = dir.path().join("s.sqlite");
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .arg("--db")
            .arg(&db)
            .output()
            .unwrap()
    };
    let out = run(&["seed", "--account", "a", "--date", "2026-13-45"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("YYYY-MM-DD"),
        "{out:?}"
    );
    // Nothing seeded yet: no database to read (and none is created).
    let out = run(&["show", "--account", "nobody", "--date", "2026-01-01"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to read"),
        "{out:?}"
    );
    assert!(!db.exists(), "show created the database");
    let out = run(&["seed", "--account", "someone", "--date", "2026-01-01"]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["show", "--account", "nobody", "--date", "2026-01-01"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no job for nobody"),
        "{out:?}"
    );
    // A job seeded and not yet worked on shows, with no objects folder.
    let out = run(&["show", "--account", "someone", "--date", "2026-01-01"]);
    assert!(out.status.success(), "{out:?}");
    let version = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(version.status.code(), Some(0));
}

/// `GET path` on `addr` (HTTP/1.0): status and body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nhost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    (code, out.split_once("\r\n\r\n").unwrap().1.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_serves_inspect_as_a_page_and_json() {
    let env = Env::new("console").await;
    let (out, text) = env.run_worker("bob", &[]);
    assert!(out.status.success(), "{text}");
    let bob_token = token(&events(&text, "published")[0]);
    let port = baton_testkit::pg_cluster::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut console = Proc::spawn_merged(
        Command::new(BIN)
            .arg("console")
            .args(env.paths())
            .args(["--server", &env.url, "--listen", &addr]),
        "statements console",
    );
    let (_, line) = console.next_line();
    assert!(line.starts_with("console on http://"), "{line}");
    let (code, page) = http_get(&addr, "/");
    assert_eq!(code, 200);
    assert!(page.contains("incident procedure"), "{page}");
    let (code, body) = http_get(
        &addr,
        &format!("/api/inspect?account={ACCOUNT}&date={DATE}"),
    );
    assert_eq!(code, 200, "{body}");
    let shown: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shown["verdict"]["authoritative_token"], bob_token);
    let (code, body) = http_get(
        &addr,
        &format!("/api/inspect?account={ACCOUNT}&date=2026-02-30"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("YYYY-MM-DD"), "{body}");
    let (code, body) = http_get(&addr, "/api/inspect?account=nobody&date=2026-01-01");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no job for nobody"), "{body}");
    let (code, _) = http_get(&addr, "/api/inspect?account=x");
    assert_eq!(code, 400, "a missing date is refused");
    drop(console);
}

/// A bucket behind a proxy that drops `If-None-Match` would let a late
/// upload overwrite a generation: the worker refuses to start on it,
/// naming the store and the missing feature, before writing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_a_store_that_would_overwrite() {
    let env = Env::new_s3("overwrite").await;
    let s3 = env.s3.as_ref().unwrap();
    let proxy =
        baton_testkit::s3::Proxy::start(s3.port(), baton_testkit::s3::Mischief::StripIfNoneMatch)
            .await;
    let out = env
        .worker("bob", &[])
        .env("AWS_ENDPOINT_URL", &proxy.endpoint)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not honour conditional create") && err.contains("stmt-overwrite"),
        "{err}"
    );
    assert!(env.publication().is_none());
    assert!(env.objects_published().await.is_empty(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_once_pass_that_leaves_a_held_job_says_so_and_exits_4() {
    let env = Env::new("once_held").await;
    env.seed();
    // Another worker holds the job's lease.
    let mut other = Client::connect(&env.url).await.unwrap();
    let held = match other
        .acquire(
            RESOURCE,
            Some(std::time::Duration::from_secs(30)),
            std::time::Duration::ZERO,
        )
        .await
        .unwrap()
    {
        baton_client::Acquired::Granted(l) => l,
        refused => panic!("{refused:?}"),
    };
    let out = env
        .worker("late", &[])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains(&format!("{RESOURCE} (held: token {})", held.token.get()))
            && stderr.contains("left 1 job(s) to other workers"),
        "{stderr}"
    );
    assert_eq!(env.job_state(), "pending", "nothing was published");
    other.release(RESOURCE, &held.acquisition_id).await.unwrap();
    // With the lease free it publishes (exit 0); then there is nothing left.
    let (done, _) = env.run_worker("late", &[]);
    assert!(done.status.success(), "{done:?}");
    let out = env
        .worker("idle", &[])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no open jobs; nothing to do"));
}

/// The commands that only read (`show`, `inspect`, `deliveries list` and
/// `deliveries show`) pointed at a directory with nothing in it: each says
/// there is nothing to read, and the directory stays empty (no database,
/// no objects folder, no probe object).
#[test]
fn read_only_commands_create_nothing() {
    let dir = std::env::temp_dir().join(format!("statements-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("statements.sqlite").display().to_string();
    let objects = dir.join("objects").display().to_string();
    let paths = ["--db", db.as_str(), "--objects", objects.as_str()];
    let job = ["--account", ACCOUNT, "--date", DATE];
    let runs: [Vec<&str>; 4] = [
        [&["show"][..], &paths, &job].concat(),
        [
            &["inspect"][..],
            &paths,
            &[ACCOUNT, DATE],
            &["--server", "http://127.0.0.1:9"],
        ]
        .concat(),
        [&["deliveries", "list"][..], &paths].concat(),
        [&["deliveries", "show", "1"][..], &paths].concat(),
    ];
    for args in runs {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        assert!(stderr.contains("nothing to read"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(3), "{args:?}: not found");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} created {left:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
