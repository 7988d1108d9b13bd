//! `baton run NAME -- COMMAND` against a real server, with real commands
//! and real signals: exit codes pass through, the lease ends with the
//! command, a fence or a stopped server stops the command by the lease's
//! safe-until, a killed `run` leaves no command behind, and two `run`s on
//! one name never overlap.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_client::Client;
use baton_systest as common;
use common::{eventually, Proc, Server, TempDir, BIN};
use nix::sys::signal::Signal;

fn run_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(&*BIN);
    // Flags before the names: everything after `--` is the command's.
    cmd.args(["run", "--server", url]).args(args);
    cmd.stdin(Stdio::null());
    cmd
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Spawns `run` whose command prints its pid first; returns both, and
/// what `run` said before it. The process's lines are its stdout and
/// stderr together.
fn spawn_printing_pid(url: &str, args: &[&str]) -> (Proc, i32, String) {
    let mut run = Proc::spawn_merged(&mut run_cmd(url, args), "baton run");
    loop {
        if let Ok(pid) = run.next_line().1.trim().parse() {
            let before = run.lines().join("\n");
            return (run, pid, before);
        }
    }
}

async fn holder(url: &str, name: &str) -> Option<u64> {
    let mut c = Client::connect(url).await.unwrap();
    c.status(name).await.unwrap().holder_token.map(|t| t.get())
}

fn serve(dir: &TempDir) -> Server {
    common::serve(dir.path(), &[])
}

#[tokio::test]
async fn the_commands_exit_code_passes_through_and_the_lease_ends_with_it() {
    let dir = TempDir::new("run-codes");
    let s = serve(&dir);
    let url = s.url();
    for code in [0, 1, 42] {
        let out = run_cmd(&url, &["job:1", "--", "sh", "-c", &format!("exit {code}")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        assert_eq!(
            holder(&url, "job:1").await,
            None,
            "released after exit {code}"
        );
    }
    // The environment: one name, its token, the server; several names.
    let out = run_cmd(
        &url,
        &[
            "job:1",
            "--json",
            "--",
            "sh",
            "-c",
            "echo \"$BATON_RESOURCE $BATON_FENCING_TOKEN $BATON_SERVER\"",
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let grant = baton_testkit::json::object(lines.next().unwrap()).expect("the grant first");
    let token = grant["leases"][0]["token"].as_u64().unwrap();
    assert_eq!(
        lines.next(),
        Some(format!("job:1 {token} {url}").as_str()),
        "{text}"
    );
    let out = run_cmd(
        &url,
        &[
            "a:1",
            "a:2",
            "--",
            "sh",
            "-c",
            "printf '%s|' \"$BATON_FENCING_TOKENS\"; echo \"${BATON_RESOURCE-unset}\"",
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("a:1=") && text.contains("\na:2="),
        "{text}"
    );
    assert!(text.trim_end().ends_with("|unset"), "one name only: {text}");
}

#[tokio::test]
async fn a_command_that_cannot_start_exits_126_or_127_and_releases() {
    let dir = TempDir::new("run-start");
    let s = serve(&dir);
    let url = s.url();
    let not_executable = dir.path().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        &not_executable,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    for (command, code, says) in [
        ("/nonexistent/command", 127, "No such file"),
        (not_executable.to_str().unwrap(), 126, "Permission denied"),
    ] {
        let out = run_cmd(&url, &["start:1", "--", command]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains(command) && err.contains(says), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert_eq!(holder(&url, "start:1").await, None);
    }
    // No command, and a name held by someone else: run's own 125.
    let out = run_cmd(&url, &["start:1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let mut c = Client::connect(&url).await.unwrap();
    c.acquire("start:2", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap();
    let out = run_cmd(&url, &["start:2", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not started"));
}

/// One rule for usage errors: a bad flag exits 125 from `run` and from
/// `elect -- COMMAND` alike (their own 124-127), and 2 from `elect`
/// without a command; nothing is started.
#[test]
fn a_bad_flag_exits_125_from_run_and_elect_with_a_command() {
    for (args, code) in [
        (vec!["run", "u:1", "--ttl", "0s", "--", "true"], 125),
        (vec!["run", "u:1", "--bogus", "--", "true"], 125),
        (vec!["run", "u:1", "--shared-on", "u:2", "--", "true"], 125),
        (vec!["run", "u:1", "--permits-on", "u:1", "--", "true"], 125),
        (vec!["elect", "u:1", "--ttl", "0s", "--", "true"], 125),
        (vec!["elect", "u:1", "--bogus", "--", "true"], 125),
        (vec!["elect", "u:1", "--ttl", "0s"], 2),
        (
            vec!["run", "u:1", "--server", "127.0.0.1:99999", "--", "true"],
            125,
        ),
        (
            vec!["elect", "u:1", "--server", "127.0.0.1:99999", "--", "true"],
            125,
        ),
    ] {
        let out = common::cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(!err.is_empty(), "{args:?}: names the rule");
    }
}

/// `baton fence` while the command runs: `run` stops it (SIGTERM, the
/// command obeys) and exits 124, long before the lease's TTL.
#[tokio::test]
async fn a_fence_stops_the_command_and_run_exits_124() {
    let dir = TempDir::new("run-fence");
    let s = serve(&dir);
    let url = s.url();
    let (run, pid, before) = spawn_printing_pid(
        &url,
        &[
            "f:1",
            "--ttl",
            "30s",
            "--",
            "sh",
            "-c",
            "echo $$; exec sleep 60",
        ],
    );
    let fence = common::cli(&["fence", "f:1", "--server", &url]);
    assert_eq!(fence.status.code(), Some(0));
    let (code, after) = run.exit();
    let err = format!("{before}\n{after}");
    assert_eq!(code, Some(124), "{err}");
    assert!(err.contains("fenced"), "{err}");
    assert!(!alive(pid), "the command is gone when run exits");
}

/// The server stopped with SIGSTOP while a command that ignores SIGTERM
/// runs: no heartbeat is answered, and `run` SIGKILLs the command no later
/// than the lease's safe-until (the TTL after the last heartbeat it sent
/// before the stop, less the margin).
#[tokio::test]
async fn a_stopped_server_gets_the_command_killed_by_the_safe_until() {
    let dir = TempDir::new("run-sigstop");
    let s = serve(&dir);
    let url = s.url();
    let ttl = Duration::from_secs(2);
    let (run, pid, before) = spawn_printing_pid(
        &url,
        &[
            "stop:1",
            "--ttl",
            "2s",
            "--kill-after",
            "10s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo $$; exec sleep 60",
        ],
    );
    s.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    // When the command died (`run` itself exits a little later: it tries
    // to close the session first, for at most a second).
    let died = std::thread::spawn(move || {
        while alive(pid) {
            std::thread::sleep(Duration::from_millis(2));
        }
        Instant::now()
    });
    let (code, after) = run.exit();
    let err = format!("{before}\n{after}");
    let took = died.join().unwrap().duration_since(stopped);
    s.signal(Signal::SIGCONT);
    assert_eq!(code, Some(124), "{err}");
    assert!(!alive(pid), "killed, though it ignored SIGTERM");
    assert!(
        took < ttl,
        "the command must be dead by the safe-until, within one TTL of the last heartbeat: {took:?}\n{err}"
    );
    assert!(err.contains("longer than half the TTL"), "{err}");
}

/// `run` itself SIGKILLed: the kernel kills the command with it.
#[tokio::test]
async fn a_killed_run_leaves_no_command_behind() {
    let dir = TempDir::new("run-kill9");
    let s = serve(&dir);
    let url = s.url();
    let (mut run, pid, _) =
        spawn_printing_pid(&url, &["k:1", "--", "sh", "-c", "echo $$; exec sleep 60"]);
    assert!(alive(pid));
    run.kill9();
    eventually(Duration::from_secs(5), async || !alive(pid)).await;
}

/// Two `run`s taking turns on one name, three commands each: every
/// command's start and end are adjacent in the shared file, and tokens
/// increase.
#[tokio::test]
async fn two_runs_on_one_name_never_overlap() {
    let dir = TempDir::new("run-overlap");
    let s = serve(&dir);
    let url = s.url();
    let file = dir.path().join("log");
    let script = format!(
        "echo \"start $BATON_FENCING_TOKEN\" >> {f}; sleep 0.2; echo \"end $BATON_FENCING_TOKEN\" >> {f}",
        f = file.display()
    );
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (url, script) = (url.clone(), script.clone());
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let out = run_cmd(&url, &["o:1", "--wait", "30s", "--", "sh", "-c", &script])
                        .output()
                        .unwrap();
                    assert_eq!(out.status.code(), Some(0), "{out:?}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let log = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 12, "{log}");
    let mut last = 0;
    for pair in lines.chunks(2) {
        let start: u64 = pair[0].strip_prefix("start ").unwrap().parse().unwrap();
        let end: u64 = pair[1]
            .strip_prefix("end ")
            .unwrap_or_else(|| panic!("overlap: {log}"))
            .parse()
            .unwrap();
        assert_eq!(start, end, "{log}");
        assert!(start > last, "tokens increase: {log}");
        last = start;
    }
}
