//! A client command's logs: on stderr when `RUST_LOG` asks for them, and
//! none otherwise, so that a command's output stays its own.

use std::process::Command;

use baton_systest as common;
use common::{Proc, TempDir};

fn hold(url: &str, name: &str, rust_log: Option<&str>) -> Proc {
    let mut cmd = Command::new(&*common::BIN);
    cmd.args(["hold", name, "--ttl", "10s", "--server", url])
        .env_remove("RUST_LOG");
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    Proc::spawn_merged(&mut cmd, "baton hold")
}

/// Two `hold`s through the same server restart: the one run with
/// `RUST_LOG=info` says on stderr that its session's stream broke and is
/// being resumed; the other says nothing but its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_command_logs_on_stderr_when_rust_log_asks_and_only_then() {
    let dir = TempDir::new("client-logs");
    let mut server = common::serve(dir.path(), &[]);
    let url = server.url();
    let mut logged = hold(&url, "logs:asked", Some("info"));
    let mut quiet = hold(&url, "logs:quiet", None);
    logged.wait_for("token=");
    quiet.wait_for("token=");
    server.restart();
    let line = logged.wait_for("session stream broke; resuming");
    assert!(line.contains("INFO"), "{line}");
    // Both keep their leases through the restart (the sessions resume).
    for name in ["logs:asked", "logs:quiet"] {
        common::eventually(std::time::Duration::from_secs(10), async || {
            let out = common::cli(&["status", name, "--server", &url]);
            String::from_utf8_lossy(&out.stdout).contains(" held ")
        })
        .await;
    }
    for p in [&logged, &quiet] {
        p.signal(nix::sys::signal::Signal::SIGTERM);
    }
    let (code, _) = logged.exit();
    assert_eq!(code, Some(0));
    let seen = quiet.lines().to_vec();
    let (code, rest) = quiet.exit();
    assert_eq!(code, Some(0), "{seen:?} {rest}");
    let all = format!("{}\n{rest}", seen.join("\n"));
    assert!(
        !all.contains("resuming") && !all.contains("INFO"),
        "a hold without RUST_LOG logged: {all}"
    );
}
