//! A command under a lease is its whole process tree: `baton run` and
//! `baton elect -- COMMAND`, each with a grandchild that ignores SIGTERM,
//! and with one that also calls `setsid`, against a fence, a server
//! stopped past the TTL, `run` itself SIGKILLed, and a main process that
//! exits 0 leaving a background child. Every process of the first tree
//! writes its pid; the next holder's command, when it starts, looks each
//! one up in /proc, and the test asserts none was alive. Each scenario
//! prints how many processes it started and found gone, and how long the
//! tree took to go; the times are reported, not asserted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_systest as common;
use common::{eventually, Server, TempDir, BIN};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[derive(Clone, Copy, Debug)]
enum Tool {
    Run,
    Elect,
}

#[derive(Clone, Copy, Debug)]
enum Grandchild {
    IgnoresTerm,
    SetsidIgnoresTerm,
}

/// The first holder's command: the main process writes its pid, starts a
/// grandchild that writes its own and outlives a SIGTERM, then waits (or,
/// with `main_exits`, exits 0 at once).
fn first_command(pids: &Path, kind: Grandchild, main_exits: bool) -> Vec<String> {
    let p = pids.display();
    let grandchild = format!("sh -c 'echo $$ >> {p}; trap \"\" TERM; while :; do sleep 1; done'");
    let start = match kind {
        Grandchild::IgnoresTerm => format!("{grandchild} &"),
        Grandchild::SetsidIgnoresTerm => format!("setsid {grandchild} &"),
    };
    let end = if main_exits {
        "exit 0"
    } else {
        "trap \"\" TERM; wait; wait"
    };
    vec![
        "sh".into(),
        "-c".into(),
        format!("echo $$ >> {p}; {start} {end}"),
    ]
}

/// The next holder's command: which of the first tree's pids are alive.
fn checker(pids: &Path, report: &Path) -> Vec<String> {
    let script = format!(
        "for p in $(cat {pids}); do if [ -e /proc/$p ] && ! grep -q ') Z' /proc/$p/stat; then echo alive $p; fi; done > {report}.tmp; echo checked >> {report}.tmp; mv {report}.tmp {report}",
        pids = pids.display(),
        report = report.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

fn holder_cmd(tool: Tool, url: &str, name: &str, extra: &[&str], command: &[String]) -> Command {
    let mut cmd = Command::new(&*BIN);
    match tool {
        Tool::Run => cmd.args(["run", name]),
        Tool::Elect => cmd.args(["elect", name]),
    };
    cmd.args(["--server", url, "--verbose"])
        .args(extra)
        .arg("--")
        .args(command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

struct Scenario {
    dir: TempDir,
    server: Server,
    pids: PathBuf,
    report: PathBuf,
}

impl Scenario {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let server = common::serve(&dir.path().join("data"), &[]);
        Self {
            pids: dir.path().join("pids"),
            report: dir.path().join("report"),
            dir,
            server,
        }
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    async fn until_started(&self, n: usize) {
        eventually(Duration::from_secs(20), async || self.pids().len() >= n).await;
    }

    /// Starts the next holder (waiting in line) whose command checks the
    /// first tree.
    fn next_holder(&self, tool: Tool, name: &str) -> Child {
        holder_cmd(
            tool,
            &self.server.url(),
            name,
            &["--wait", "60s", "--ttl", "30s"],
            &checker(&self.pids, &self.report),
        )
        .spawn()
        .unwrap()
    }

    /// The next holder's verdict: none of the first tree's processes was
    /// alive when its command started.
    fn assert_no_overlap(&self, what: &str, mut next: Child) -> usize {
        let status = next.wait().unwrap();
        assert!(
            status.success(),
            "{what}: the next holder failed: {status:?}"
        );
        let report = std::fs::read_to_string(&self.report).unwrap_or_default();
        assert!(
            report.contains("checked"),
            "{what}: the next holder's command did not run"
        );
        assert!(
            !report.contains("alive"),
            "{what}: two commands at once: {report}"
        );
        let n = self.pids().len();
        assert!(n >= 2, "{what}: the tree had {n} processes");
        n
    }
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const KINDS: [Grandchild; 2] = [Grandchild::IgnoresTerm, Grandchild::SetsidIgnoresTerm];
const TOOLS: [Tool; 2] = [Tool::Run, Tool::Elect];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_commands_whole_tree_is_gone_before_run_exits() {
    for tool in TOOLS {
        for kind in KINDS {
            let s = Scenario::new("tree-fence");
            let first = holder_cmd(
                tool,
                &s.server.url(),
                "tree:f",
                &["--ttl", "4s", "--kill-after", "1s"],
                &first_command(&s.pids, kind, false),
            )
            .spawn()
            .unwrap();
            s.until_started(2).await;
            let fenced = Instant::now();
            assert!(
                common::cli(&["fence", "tree:f", "--server", &s.server.url()])
                    .status
                    .success()
            );
            let (code, err) = stderr_of(first);
            let gone_ms = fenced.elapsed().as_millis();
            assert_eq!(code, Some(124), "{tool:?} {kind:?}: {err}");
            assert!(err.contains("child subreaper"), "says its mechanism: {err}");
            // As a script or cron would: the next run right after the exit.
            let n = s.assert_no_overlap(
                &format!("{tool:?} {kind:?} fenced"),
                s.next_holder(tool, "tree:f"),
            );
            eprintln!("{tool:?}, {kind:?}, fenced: {n} processes started, all gone {gone_ms} ms after the fence (run's exit)");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_past_the_ttl_gets_the_whole_tree_killed_first() {
    for tool in TOOLS {
        for kind in KINDS {
            let s = Scenario::new("tree-stop");
            let first = holder_cmd(
                tool,
                &s.server.url(),
                "tree:s",
                &["--ttl", "2s", "--kill-after", "500ms"],
                &first_command(&s.pids, kind, false),
            )
            .spawn()
            .unwrap();
            s.until_started(2).await;
            s.server.signal(Signal::SIGSTOP);
            let stopped = Instant::now();
            let (code, err) = stderr_of(first);
            let gone_ms = stopped.elapsed().as_millis();
            // Resumed past the TTL: the next holder is granted once the
            // server has expired the first session.
            s.server.signal(Signal::SIGCONT);
            assert_eq!(code, Some(124), "{tool:?} {kind:?}: {err}");
            let next = s.next_holder(tool, "tree:s");
            let n = s.assert_no_overlap(&format!("{tool:?} {kind:?} server stopped"), next);
            eprintln!("{tool:?}, {kind:?}, server stopped: {n} processes started, all gone {gone_ms} ms after the stop (TTL 2000 ms)");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_killed_leaves_no_process_of_its_tree() {
    for tool in TOOLS {
        for kind in KINDS {
            let s = Scenario::new("tree-kill");
            let mut first = holder_cmd(
                tool,
                &s.server.url(),
                "tree:k",
                &["--ttl", "3s"],
                &first_command(&s.pids, kind, false),
            )
            .spawn()
            .unwrap();
            s.until_started(2).await;
            let next = s.next_holder(tool, "tree:k");
            kill(Pid::from_raw(first.id() as i32), Signal::SIGKILL).unwrap();
            let killed = Instant::now();
            first.wait().unwrap();
            let pids = s.pids();
            eventually(Duration::from_secs(10), async || {
                pids.iter()
                    .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            })
            .await;
            let gone_ms = killed.elapsed().as_millis();
            let n = s.assert_no_overlap(&format!("{tool:?} {kind:?} run killed"), next);
            eprintln!("{tool:?}, {kind:?}, run SIGKILLed: {n} processes started, all gone {gone_ms} ms after the kill");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_process_that_exits_keeps_the_lease_until_its_children_are_gone() {
    for tool in TOOLS {
        for kind in KINDS {
            let s = Scenario::new("tree-exit");
            let first = holder_cmd(
                tool,
                &s.server.url(),
                "tree:e",
                &["--ttl", "10s", "--kill-after", "1s"],
                &first_command(&s.pids, kind, true),
            )
            .spawn()
            .unwrap();
            s.until_started(2).await;
            let next = s.next_holder(tool, "tree:e");
            let started = Instant::now();
            let (code, err) = stderr_of(first);
            let gone_ms = started.elapsed().as_millis();
            assert_eq!(
                code,
                Some(0),
                "the command's own code: {tool:?} {kind:?}: {err}"
            );
            assert!(err.contains("outlived --kill-after"), "{err}");
            let n = s.assert_no_overlap(&format!("{tool:?} {kind:?} main exited"), next);
            eprintln!("{tool:?}, {kind:?}, main exited 0: {n} processes started, the rest gone {gone_ms} ms after (--kill-after 1000 ms)");
            drop(s.dir);
        }
    }
}
