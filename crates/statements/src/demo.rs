//! `statements demo`: the seed's paused-worker story with real processes.
//!
//! An embedded Baton server runs in this process. Alice (a worker process)
//! takes the lease, reads her input, generates and uploads, passes her local
//! ownership check, and is then stopped with SIGSTOP. Her lease expires; Bob
//! takes over with a higher token and publishes. Alice is resumed with
//! SIGCONT, carries on where she stopped, and her publish is rejected at the
//! resource as stale. The account data changes while Alice sleeps, so Bob
//! refuses her candidate (wrong input version) and publishes his own. The demo exits 0 only if that is how it ended.

use anyhow::Context;
use baton_fence::resource_name;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use baton_client::Client;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::events::field;
use crate::{store, worker};

const ACCOUNT: &str = "account-42";
const DATE: &str = "2026-09-13";
const TTL_MS: u64 = 1_500;
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

struct Timeline {
    start: Instant,
    rows: Vec<(u128, String)>,
}

impl Timeline {
    fn add(&mut self, line: &str) {
        self.rows
            .push((self.start.elapsed().as_millis(), line.to_string()));
    }

    /// An event the story itself observed, named like the workers' events.
    fn note(&mut self, who: &str, event: &str, detail: &str) {
        self.add(&serde_json::json!({"event": event, "worker": who, "detail": detail}).to_string());
    }
}

fn spawn_worker(
    paths: &crate::args::Paths,
    url: &str,
    name: &str,
    pause: bool,
) -> anyhow::Result<(Child, Lines<BufReader<ChildStdout>>)> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .arg("--db")
        .arg(&paths.db)
        .arg("--objects")
        .arg(&paths.objects);
    if let Some(url) = &paths.database_url {
        cmd.args(["--database-url", url]);
    }
    cmd.args([
        "--server",
        url,
        "--name",
        name,
        "--ttl",
        &format!("{TTL_MS}ms"),
        "--once",
    ]);
    if pause {
        cmd.arg("--pause-before-publish");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    Ok((child, BufReader::new(stdout).lines()))
}

/// Reads events into the timeline until one named `until` (or the end).
async fn read_until(
    lines: &mut Lines<BufReader<ChildStdout>>,
    timeline: &mut Timeline,
    until: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(STEP_TIMEOUT, lines.next_line())
            .await
            .map_err(|_| anyhow::anyhow!("a worker went silent"))?;
        let Some(line) = next? else {
            return Ok(seen);
        };
        timeline.add(&line);
        let done = until.is_some_and(|u| field(&line, "event").as_deref() == Some(u));
        seen.push(line);
        if done {
            return Ok(seen);
        }
    }
}

/// Polls until `check` holds: waits for an event in another process, never for time to pass.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !check().await {
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn token_of(lines: &[String], event: &str) -> Option<u64> {
    lines
        .iter()
        .find(|l| field(l, "event").as_deref() == Some(event))
        .and_then(|l| field(l, "token")?.parse().ok())
}

pub async fn run(
    json: bool,
    dir: Option<PathBuf>,
    database_url: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (dir, temporary) = match dir {
        Some(d) => (d, false),
        None => (
            std::env::temp_dir().join(format!("statements-demo-{}", std::process::id())),
            true,
        ),
    };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let result = story(&dir, json, database_url).await;
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn story(dir: &Path, json: bool, database_url: Option<String>) -> anyhow::Result<ExitCode> {
    let paths = crate::args::Paths {
        db: dir.join("statements.sqlite"),
        objects: dir.join("objects").display().to_string(),
        database_url,
    };
    let config = baton_server::ServerConfig::ephemeral(dir.join("baton-data"));
    let server = baton_server::start(config).await?;
    let url = format!("http://{}", server.grpc_addr);
    let db = store::open(&paths.target()).await?;
    db.seed(ACCOUNT, DATE, 123_456).await?;
    let mut timeline = Timeline {
        start: Instant::now(),
        rows: Vec::new(),
    };
    let (alice_lines, bob_lines) = play(&paths, &url, &db, &mut timeline).await?;
    let ending = Ending::read(&db, &alice_lines, &bob_lines).await?;
    if json {
        println!("{}", ending.json(&timeline));
    } else {
        print_story(&paths, &url, &timeline, &ending).await?;
    }
    server.shutdown().await?;
    Ok(if ending.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Alice pauses after her last check; the data changes; her lease expires;
/// Bob publishes; Alice resumes and tries. Returns both workers' lines.
async fn play(
    paths: &crate::args::Paths,
    url: &str,
    db: &store::Db,
    timeline: &mut Timeline,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let resource = worker::resource(ACCOUNT, DATE);
    let (mut alice, mut alice_out) = spawn_worker(paths, url, "alice", true)?;
    let mut alice_lines = read_until(&mut alice_out, timeline, Some("paused")).await?;
    let pid = alice.id().ok_or_else(|| anyhow::anyhow!("alice exited"))?;
    until("alice to be stopped", async || is_stopped(pid)).await?;
    timeline.note("alice", "stopped", "SIGSTOP");
    // While Alice sleeps the account data changes, as in the seed.
    let version = db.seed(ACCOUNT, DATE, 99_000).await?;
    timeline.note("bank", "input_updated", &format!("input version {version}"));
    let mut client = Client::connect(url).await?;
    until("alice's lease to expire", async || {
        client
            .status(&resource)
            .await
            .is_ok_and(|s| s.holder_token.is_none())
    })
    .await?;
    timeline.note("baton", "lease_expired", "alice's lease");
    let (mut bob, mut bob_out) = spawn_worker(paths, url, "bob", false)?;
    let bob_lines = read_until(&mut bob_out, timeline, None).await?;
    bob.wait().await?;
    let alice_pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
    nix::sys::signal::kill(alice_pid, nix::sys::signal::Signal::SIGCONT)?;
    timeline.note("alice", "resumed", "SIGCONT");
    alice_lines.extend(read_until(&mut alice_out, timeline, None).await?);
    alice.wait().await?;
    Ok((alice_lines, bob_lines))
}

/// How the story ended, at the resource and in the workers' words.
struct Ending {
    authoritative: u64,
    published_key: String,
    alice_token: u64,
    bob_token: u64,
    stale_outcome: String,
}

impl Ending {
    async fn read(
        db: &store::Db,
        alice_lines: &[String],
        bob_lines: &[String],
    ) -> anyhow::Result<Self> {
        let key = resource_name(&worker::resource(ACCOUNT, DATE))?;
        let pointer = db.publication(&key).await?;
        let stale_outcome = alice_lines
            .iter()
            .find(|l| field(l, "event").as_deref() == Some("publish_refused"))
            .and_then(|l| field(l, "outcome"))
            .unwrap_or_else(|| "none".into());
        let (authoritative, published_key) =
            pointer.map_or((0, String::new()), |p| (p.token.get(), p.object_key));
        Ok(Self {
            authoritative,
            published_key,
            alice_token: token_of(alice_lines, "acquired").unwrap_or(0),
            bob_token: token_of(bob_lines, "acquired").unwrap_or(0),
            stale_outcome,
        })
    }

    /// The seed's ending: Bob's token is authoritative, Alice's refused as stale.
    fn ok(&self) -> bool {
        self.authoritative == self.bob_token
            && self.bob_token > self.alice_token
            && self.stale_outcome == "stale"
    }

    fn json(&self, timeline: &Timeline) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = timeline
            .rows
            .iter()
            .map(|(ms, l)| {
                let line: serde_json::Value =
                    serde_json::from_str(l).unwrap_or(serde_json::Value::Null);
                serde_json::json!({"ms": *ms as u64, "line": line})
            })
            .collect();
        serde_json::json!({
            "authoritative_token": self.authoritative,
            "stale_token": self.alice_token,
            "stale_outcome": self.stale_outcome,
            "published_key": self.published_key,
            "verdict": if self.ok() { "ok" } else { "failed" },
            "timeline": rows,
        })
    }
}

async fn print_story(
    paths: &crate::args::Paths,
    url: &str,
    timeline: &Timeline,
    e: &Ending,
) -> anyhow::Result<()> {
    println!("The paused-worker story (lease TTL {TTL_MS} ms):\n");
    for (ms, line) in &timeline.rows {
        let who = field(line, "worker").unwrap_or_default();
        let what = field(line, "event").unwrap_or_default();
        let detail: Vec<String> = ["token", "input", "key", "outcome", "current", "detail"]
            .iter()
            .filter_map(|k| field(line, k).map(|v| format!("{k}={v}")))
            .collect();
        println!("{ms:>6} ms  {who:<6} {what:<22} {}", detail.join(" "));
    }
    let shown = crate::inspect::gather(paths, ACCOUNT, DATE, Some(url)).await?;
    println!("\n{}\n", shown.text());
    if e.ok() {
        println!(
            "Bob's token {} is authoritative; Alice's stale publish with token {} was rejected at the resource.",
            e.bob_token, e.alice_token
        );
    } else {
        println!(
            "UNEXPECTED: authoritative token {}, Bob {}, Alice {}, Alice's outcome {}",
            e.authoritative, e.bob_token, e.alice_token, e.stale_outcome
        );
    }
    Ok(())
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`; Linux).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    })
}
