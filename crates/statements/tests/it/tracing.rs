//! OpenTelemetry traces over OTLP: a lease server and a worker, each in
//! its own process with `--otlp-endpoint`, send their spans to a collector
//! on loopback, and one publication is one trace: the worker's job span,
//! its acquire, the server's acquire and grant (children of the worker's
//! acquire, across the process boundary), and the fenced write, each with
//! the resource, the token and (for the write) the operation id.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_testkit::otlp::{Collector, Span};
use baton_testkit::pg_cluster::free_port;
use baton_testkit::process::Proc;
use baton_testkit::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_statements");
const ACCOUNT: &str = "account-5";
const DATE: &str = "2026-10-03";

async fn spans_until(
    collector: &Collector,
    what: &str,
    check: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let spans = collector.spans();
        if check(&spans) {
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s; received {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_publication_is_one_trace_across_the_worker_and_the_server() {
    let collector = Collector::start();
    let dir = TempDir::new("otlp");
    let grpc = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut server = Proc::spawn(
        Command::new(BIN)
            .args(["serve-baton", "--listen", &grpc.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("baton-data"))
            .args(["--otlp-endpoint", &collector.endpoint()])
            // Export every 100 ms: the server is killed, not stopped.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stderr(Stdio::null()),
        "statements serve-baton",
    );
    let (_, line) = server.next_line();
    assert!(line.starts_with("listening on"), "{line}");
    let paths = |c: &mut Command| {
        c.arg("--db")
            .arg(dir.path().join("statements.sqlite"))
            .arg("--objects")
            .arg(dir.path().join("objects"));
    };
    let mut seed = Command::new(BIN);
    seed.arg("seed");
    paths(&mut seed);
    assert!(seed
        .args(["--account", ACCOUNT, "--date", DATE])
        .status()
        .unwrap()
        .success());
    let mut worker = Command::new(BIN);
    worker.arg("worker");
    paths(&mut worker);
    let out = worker
        .args([
            "--server",
            &format!("http://{grpc}"),
            "--name",
            "bob",
            "--once",
        ])
        .args(["--otlp-endpoint", &collector.endpoint()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let published = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(published.contains("\"event\":\"published\""), "{published}");

    let spans = spans_until(&collector, "the server's grant", |s| {
        s.iter()
            .any(|s| s.service == "statements" && s.name == "publish statement")
            && s.iter()
                .any(|s| s.service == "baton serve" && s.name == "grant")
    })
    .await;
    let job = spans
        .iter()
        .find(|s| s.name == "publish statement")
        .unwrap();
    assert_eq!(job.attributes["account"], ACCOUNT);
    let trace: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == job.trace_id)
        .collect();
    let named = |service: &str, name: &str| -> &Span {
        trace
            .iter()
            .find(|s| s.service == service && s.name == name)
            .unwrap_or_else(|| panic!("no {service} {name} in the job's trace: {trace:#?}"))
    };
    let client_acquire = named("statements", "acquire");
    let server_acquire = named("baton serve", "acquire");
    let grant = named("baton serve", "grant");
    let write = named("statements", "fenced write");
    let resource = format!("statement:{ACCOUNT}:{DATE}");
    // The server's acquire is the child of the worker's, across processes.
    assert_eq!(server_acquire.parent_id, client_acquire.span_id);
    assert_eq!(grant.parent_id, server_acquire.span_id);
    assert_eq!(client_acquire.parent_id, job.span_id);
    // Resource and token on each; the write names its operation.
    let token = grant.attributes["token"].clone();
    assert_eq!(grant.attributes["resource"], resource);
    assert_eq!(client_acquire.attributes["token"], token);
    assert_eq!(server_acquire.attributes["token"], token);
    assert_eq!(write.attributes["resource"], resource);
    assert_eq!(write.attributes["token"], token);
    assert!(
        write.attributes["operation"].starts_with(&format!("publish:{ACCOUNT}:{DATE}")),
        "{write:?}"
    );
    assert_eq!(write.attributes["outcome"], "applied");
    // Every span of the trace hangs from the job's root.
    let ids: HashSet<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    for s in &trace {
        assert!(
            s.span_id == job.span_id || ids.contains(s.parent_id.as_str()),
            "{} has a parent outside the trace: {trace:#?}",
            s.name
        );
    }
}

#[test]
fn a_bad_endpoint_is_refused_naming_the_rule() {
    let out = Command::new(BIN)
        .args(["worker", "--once", "--otlp-endpoint", "127.0.0.1:4318"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OTLP/HTTP address"), "{err}");
}
