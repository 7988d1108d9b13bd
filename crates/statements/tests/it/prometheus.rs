//! A real Prometheus (Debian's `prometheus`) scrapes a running lease
//! server and a running `statements worker`, evaluates the shipped rules
//! (`deploy/prometheus/baton-rules.yml`), and:
//! - every metric the shipped dashboard and rules name is in what it
//!   scraped (a renamed metric fails here);
//! - `promtool check rules` accepts the rules and `promtool check config`
//!   the example configuration;
//! - a real stale write, refused at the resource after a paused worker
//!   resumes, drives `BatonStaleWritesRejected` to firing.
//!
//! `.ci/run` (through `scripts/test`) installs `prometheus` when missing;
//! without it this test fails, naming the package.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_client::Client;
use baton_testkit::pg_cluster::free_port;
use baton_testkit::process::Proc;
use baton_testkit::TempDir;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_statements");
const ACCOUNT: &str = "account-9";
const DATE: &str = "2026-10-02";
const RESOURCE: &str = "statement:account-9:2026-10-02";
/// How long Prometheus may take to scrape and evaluate (1 s intervals).
const WITHIN: Duration = Duration::from_secs(60);

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
}

fn need(tool: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(tool);
    assert!(
        path.exists(),
        "{} is missing: install Debian's `prometheus` package (scripts/test does)",
        path.display()
    );
    path
}

/// `GET path` on `addr`: status and body.
fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    if stream.read_to_string(&mut out).is_err() || out.len() < 12 {
        return (0, out);
    }
    let code = out[9..12].parse().unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (code, body)
}

fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's answer to an instant query: the result vector.
fn query(prom: std::net::SocketAddr, promql: &str) -> Vec<Value> {
    let (code, body) = get(
        prom,
        &format!("/api/v1/query?query={}", url_encoded(promql)),
    );
    assert_eq!(code, 200, "{promql}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

async fn until_true(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every `baton_*` metric name in `text` (PromQL expressions).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("baton_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = start
            + text[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(text.len() - start);
        if boundary {
            names.insert(text[start..end].to_string());
        }
        i = end;
    }
    names
}

/// The expressions of the dashboard's panels and of the rules.
fn shipped_expressions() -> String {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("grafana/baton-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    let rules = std::fs::read_to_string(deploy("prometheus/baton-rules.yml")).unwrap();
    exprs.extend(
        rules
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(str::to_string),
    );
    exprs.join("\n")
}

#[test]
fn promtool_accepts_the_rules_and_the_example_configuration() {
    let promtool = need("promtool");
    for args in [
        ["check", "rules", "prometheus/baton-rules.yml"],
        ["check", "config", "prometheus/prometheus.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(deploy(""))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_shipped_metric_and_a_stale_write_fires_the_alert() {
    let prometheus = need("prometheus");
    let dir = TempDir::new("prometheus");
    let mut config = baton_server::ServerConfig::ephemeral(dir.path().join("baton-data"));
    config.http_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = baton_server::start(config).await.unwrap();
    let url = format!("http://{}", server.grpc_addr);
    let http = server.http_addr.unwrap();
    let paths = |c: &mut Command| {
        c.arg("--db")
            .arg(dir.path().join("statements.sqlite"))
            .arg("--objects")
            .arg(dir.path().join("objects"));
    };

    // Alice runs for the whole test, stopping herself before each publish.
    let metrics_port = free_port();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let mut alice = Command::new(BIN);
    alice.arg("worker");
    paths(&mut alice);
    alice
        .args([
            "--server", &url, "--name", "alice", "--ttl", "2000ms", "--poll", "100ms",
        ])
        .args([
            "--pause-before-publish",
            "--metrics-listen",
            &metrics.to_string(),
        ])
        .args(["--accounts", ACCOUNT])
        .stderr(Stdio::null());
    // Her database must exist before she polls it (with a job she skips).
    let mut seed = Command::new(BIN);
    seed.arg("seed");
    paths(&mut seed);
    let seeded = seed
        .args([
            "--account",
            "account-0",
            "--date",
            DATE,
            "--balance-cents",
            "1",
        ])
        .output()
        .unwrap();
    assert!(seeded.status.success(), "{seeded:?}");
    let mut alice = Proc::spawn(&mut alice, "alice's worker");

    let prom = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  scrape_timeout: 900ms\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: baton\n    static_configs:\n      - targets: [\"{http}\"]\n  - job_name: statements\n    static_configs:\n      - targets: [\"{metrics}\"]\n",
            deploy("prometheus/baton-rules.yml").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Proc::spawn(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stderr(log),
        "prometheus",
    );
    until_true("Prometheus ready", || get(prom, "/-/ready").0 == 200).await;
    // Alice's outcomes are scraped at 0 before anything happens, so the
    // rejection below is an increase.
    until_true("both targets scraped", || {
        query(prom, "up == 1").len() == 2
            && !query(prom, "baton_fence_outcomes_total{outcome=\"stale\"} == 0").is_empty()
    })
    .await;

    // The paused-worker story: Alice takes the job and stops before
    // publishing; her lease runs out; Bob publishes; Alice resumes.
    let mut seed = Command::new(BIN);
    seed.arg("seed");
    paths(&mut seed);
    let seeded = seed
        .args(["--account", ACCOUNT, "--date", DATE])
        .output()
        .unwrap();
    assert!(seeded.status.success(), "{seeded:?}");
    alice.wait_for("\"event\":\"paused\"");
    let pid = alice.pid();
    baton_testkit::until(async || baton_testkit::stopped(pid)).await;
    let mut client = Client::connect(&url).await.unwrap();
    baton_testkit::until(async || {
        client
            .status(RESOURCE)
            .await
            .unwrap()
            .holder_token
            .is_none()
    })
    .await;
    let mut bob = Command::new(BIN);
    bob.arg("worker");
    paths(&mut bob);
    let bob = bob
        .args([
            "--server", &url, "--name", "bob", "--ttl", "2000ms", "--once",
        ])
        .args(["--accounts", ACCOUNT])
        .output()
        .unwrap();
    assert!(bob.status.success(), "{bob:?}");
    alice.signal(nix::sys::signal::Signal::SIGCONT);
    let after = alice.wait_for("\"event\":\"publish_refused\"");
    assert!(after.contains("\"outcome\":\"stale\""), "{after}");

    until_true("the stale rejection scraped", || {
        !query(prom, "baton_fence_outcomes_total{outcome=\"stale\"} == 1").is_empty()
    })
    .await;
    until_true("BatonStaleWritesRejected firing", || {
        let (_, body) = get(prom, "/api/v1/alerts");
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["alerts"].as_array().is_some_and(|alerts| {
            alerts.iter().any(|a| {
                a["labels"]["alertname"] == "BatonStaleWritesRejected" && a["state"] == "firing"
            })
        })
    })
    .await;

    // Every metric the dashboard and the rules use was scraped.
    let shipped = metric_names(&shipped_expressions());
    assert!(
        shipped.len() >= 20,
        "the check covers the files: {shipped:?}"
    );
    let (code, body) = get(prom, "/api/v1/label/__name__/values");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let scraped: std::collections::BTreeSet<String> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let missing: Vec<&String> = shipped.difference(&scraped).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the rules name metrics no process exports: {missing:?}"
    );
    // Both processes say which build they are.
    let builds = query(prom, "baton_build_info");
    assert_eq!(builds.len(), 2, "{builds:?}");
    // No other alert fires on a healthy single server.
    let (_, body) = get(prom, "/api/v1/alerts");
    let v: Value = serde_json::from_str(&body).unwrap();
    let firing: Vec<&Value> = v["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| {
            a["state"] == "firing" && a["labels"]["alertname"] != "BatonStaleWritesRejected"
        })
        .collect();
    assert!(firing.is_empty(), "{firing:?}");
    drop(alice);
    server.shutdown().await.unwrap();
}
