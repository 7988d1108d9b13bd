//! `baton run NAME... -- COMMAND`: a command under leases, for scripts and
//! cron. The leases are taken on a session and followed by one keeper
//! each (as `hold` does); the command runs in a process group of its own,
//! started through `baton exec-child`, which asks the kernel to kill it if
//! `baton run` dies (`PR_SET_PDEATHSIG`) and then execs it, so no unsafe
//! `pre_exec` is needed. When ownership is lost or about to be, the group
//! gets SIGTERM, then SIGKILL no later than the earliest keeper's
//! safe-until. `run` stops the command; it cannot recall a write the
//! command already sent: the token must still be checked where the data
//! is written.

use std::ffi::OsString;
use std::time::Duration;

use baton_client::worker::{Keeper, KeeperConfig};
use baton_client::AcquiredAll;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::error::{CliError, Exit};
use crate::hold::{close_after_loss, close_bounded, first_lost, loss_message};
use crate::lease::{connect, AcquireOut};
use crate::output::Rendered;

/// `run`'s exit codes for its own outcomes (GNU `timeout`'s convention).
pub const LOST: u8 = Exit::RunLost as u8;
pub const NOT_STARTED: u8 = Exit::RunNotStarted as u8;
pub const CANNOT_INVOKE: u8 = 126;
pub const NOT_FOUND: u8 = 127;

/// Runs `baton run`: the command's exit code, or one of `run`'s own.
pub async fn run(a: &RunArgs) -> Result<u8, CliError> {
    let not_started = |e: CliError| CliError {
        code: Exit::RunNotStarted,
        message: e.message,
    };
    let client = connect(&a.client)
        .await
        .map_err(not_started)?
        .with_holder(a.holder.resolve());
    let session = client
        .open_session(a.ttl.unwrap_or_default())
        .await
        .map_err(|e| not_started(e.into()))?;
    let refs: Vec<&str> = a.names.iter().map(String::as_str).collect();
    let all = match session.acquire_all(&refs, a.wait).await {
        Ok(all) => all,
        Err(e) => {
            close_bounded(&session).await;
            return Err(not_started(e.into()));
        }
    };
    let out = AcquireOut::new(&all, a.wait);
    let leases = match all {
        AcquiredAll::Granted { leases, .. } if out.exit() == Exit::Ok => leases,
        _ => {
            // Not run: the reason on stderr (stdout is the command's), and
            // the object with --json.
            if a.client.json {
                crate::stdout::line(&serde_json::to_string(&out).expect("serializes"));
            }
            eprintln!("baton run: not started: {}", out.text());
            close_bounded(&session).await;
            return Ok(NOT_STARTED);
        }
    };
    if a.client.json {
        crate::stdout::line(&serde_json::to_string(&out).expect("serializes"));
    }
    let keepers: Vec<Keeper> = leases
        .into_iter()
        .map(|l| Keeper::start(session.clone(), l, KeeperConfig::default()))
        .collect();
    run_held(
        "baton run",
        &client.current_server(),
        &session,
        &keepers,
        &a.command,
        a.kill_after,
    )
    .await
}

/// Runs `command` under leases already granted on `session` and followed
/// by `keepers` (`run` after its acquire, `elect` once elected); closes
/// the session at the end, whatever happened. `who` starts its log lines.
pub(crate) async fn run_held(
    who: &str,
    server: &str,
    session: &baton_client::Session,
    keepers: &[Keeper],
    command: &[OsString],
    kill_after: Duration,
) -> Result<u8, CliError> {
    let env = environment(keepers, server);
    let child = match spawn(command, &env) {
        Ok(child) => child,
        Err(e) => {
            close_bounded(session).await;
            return Err(CliError {
                code: Exit::RunNotStarted,
                message: e.message,
            });
        }
    };
    let grace = grace(who, kill_after, session.ttl());
    let code = supervise(who, child, keepers, session, grace).await;
    if matches!(code, Ok(LOST)) {
        // The loss was said; exit now, never waiting on the session.
        close_after_loss(session).await;
    } else {
        close_bounded(session).await;
    }
    code
}

/// The command's environment: `BATON_SERVER`, `BATON_FENCING_TOKENS` (one
/// `NAME=TOKEN` per line: names hold no control characters, so a newline
/// separates them; split each line at its last `=`), and for one name
/// `BATON_RESOURCE` and `BATON_FENCING_TOKEN`.
fn environment(keepers: &[Keeper], server: &str) -> Vec<(&'static str, String)> {
    let tokens: Vec<String> = keepers
        .iter()
        .map(|k| format!("{}={}", k.lease().resource, k.lease().token))
        .collect();
    let mut env = vec![
        ("BATON_SERVER", server.to_string()),
        ("BATON_FENCING_TOKENS", tokens.join("\n")),
    ];
    if let [one] = keepers {
        env.push(("BATON_RESOURCE", one.lease().resource.clone()));
        env.push(("BATON_FENCING_TOKEN", one.lease().token.to_string()));
    }
    env
}

/// Starts `baton exec-child PID -- COMMAND` in a new process group.
fn spawn(command: &[OsString], env: &[(&'static str, String)]) -> Result<Child, CliError> {
    let me = std::env::current_exe().map_err(|e| {
        CliError::failure(format!(
            "cannot find the baton binary to start {command:?}: {e}"
        ))
    })?;
    let mut cmd = tokio::process::Command::new(me);
    cmd.arg("exec-child")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    cmd.spawn()
        .map_err(|e| CliError::failure(format!("cannot start {:?}: {e}", command[0])))
}

/// The grace between SIGTERM and SIGKILL: `--kill-after`, but at most half
/// the TTL, so that heartbeats every third of it never trigger a stop.
fn grace(who: &str, kill_after: Duration, ttl: Duration) -> Duration {
    let most = ttl / 2;
    if kill_after > most {
        eprintln!(
            "{who}: --kill-after {}ms is longer than half the TTL ({}ms); using {}ms so that SIGKILL lands before the lease's safe-until",
            kill_after.as_millis(),
            ttl.as_millis(),
            most.as_millis()
        );
        return most;
    }
    kill_after
}

/// The leases' safe-until: every lease of `run` is tied to the session,
/// so it is the session's (the last acknowledged heartbeat's send time
/// plus the TTL, minus the margin), the keepers' rule read where it is
/// current (a keeper learns of each heartbeat a little later).
fn safe_until(session: &baton_client::Session) -> Instant {
    session.state().safe_until
}

/// Waits for the command; stops it when ownership is lost or the earliest
/// safe-until comes within `grace`; forwards SIGINT, SIGTERM and SIGHUP.
async fn supervise(
    who: &str,
    mut child: Child,
    keepers: &[Keeper],
    session: &baton_client::Session,
    grace: Duration,
) -> Result<u8, CliError> {
    let group = Pid::from_raw(child.id().expect("a running child") as i32);
    let mut signals = Forwarded::install()?;
    loop {
        let stop_at = safe_until(session)
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            status = child.wait() => return Ok(exit_code(status)),
            sig = signals.recv() => {
                let _ = killpg(group, sig);
            }
            keeper = first_lost(keepers) => {
                let why = loss_message(keeper, session);
                return Ok(stop(who, &mut child, group, session, grace, &why).await);
            }
            _ = tokio::time::sleep_until(stop_at) => {
                if safe_until(session).checked_sub(grace).is_some_and(|at| at > Instant::now()) {
                    continue; // a heartbeat moved the deadline
                }
                let why = format!(
                    "no heartbeat was acknowledged in time: the leases' safe-until is {}ms away",
                    safe_until(session).saturating_duration_since(Instant::now()).as_millis()
                );
                return Ok(stop(who, &mut child, group, session, grace, &why).await);
            }
        }
    }
}

/// SIGTERM to the group, then SIGKILL after `grace` or at the earliest
/// safe-until, whichever comes first; exits 124.
async fn stop(
    who: &str,
    child: &mut Child,
    group: Pid,
    session: &baton_client::Session,
    grace: Duration,
    why: &str,
) -> u8 {
    let kill_at = (Instant::now() + grace).min(safe_until(session));
    eprintln!(
        "{who}: {why}; stopping the command: SIGTERM now, SIGKILL in {}ms at the latest",
        kill_at
            .saturating_duration_since(Instant::now())
            .as_millis()
    );
    let _ = killpg(group, Signal::SIGTERM);
    tokio::select! {
        _ = child.wait() => {}
        _ = tokio::time::sleep_until(kill_at) => {
            let _ = killpg(group, Signal::SIGKILL);
            let _ = child.wait().await;
        }
    }
    LOST
}

/// The command's exit code; 128 + the signal that ended it (as shells say).
fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => 128u8.saturating_add(sig as u8),
            (None, None) => NOT_STARTED,
        },
        Err(_) => NOT_STARTED,
    }
}

/// The signals `run` passes on to the command's group.
struct Forwarded {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Forwarded {
    fn install() -> Result<Self, CliError> {
        let on = |kind: SignalKind| {
            signal(kind)
                .map_err(|e| CliError::failure(format!("cannot install a signal handler: {e}")))
        };
        Ok(Self {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// `baton exec-child PARENT -- COMMAND`: dies with `PARENT` (SIGKILL from
/// the kernel when it exits, SIGKILL included), then becomes COMMAND.
/// Exits 127 naming the command if it is not found, 126 if it cannot be
/// started.
pub fn exec_child(parent: u32, command: &[OsString]) -> u8 {
    use std::os::unix::ffi::OsStrExt;
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("baton run: cannot tie the command to baton run: {e}");
        return NOT_STARTED;
    }
    // The parent may have died before the line above: then nobody holds
    // the lease and the command must not start.
    if nix::unistd::getppid().as_raw() as u32 != parent {
        eprintln!("baton run: exited before the command started");
        return NOT_STARTED;
    }
    let args: Result<Vec<std::ffi::CString>, _> = command
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()))
        .collect();
    let Ok(args) = args else {
        eprintln!(
            "baton run: cannot start {:?}: an argument holds a NUL byte",
            command[0]
        );
        return CANNOT_INVOKE;
    };
    let err = match nix::unistd::execvp(&args[0], &args) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    eprintln!("baton run: cannot start {:?}: {}", command[0], err.desc());
    if err == nix::errno::Errno::ENOENT {
        NOT_FOUND
    } else {
        CANNOT_INVOKE
    }
}
