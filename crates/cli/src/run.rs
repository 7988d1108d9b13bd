//! `baton run NAME... -- COMMAND`: a command under leases, for scripts and
//! cron. The leases are taken on a session and followed by one keeper
//! each (as `hold` does). The command runs under a guard, `baton
//! exec-child` (see `tree.rs`): the subreaper of the command's whole
//! process tree, which SIGKILLs the tree if `baton run` dies. When
//! ownership is lost or about to be, every process of the tree gets
//! SIGTERM, then SIGKILL no later than the earliest keeper's safe-until;
//! when the command's main process exits, the rest of the tree has
//! `--kill-after` to end before it is stopped the same way. `run` exits,
//! and releases the leases, only once no process of the tree is left. It
//! cannot recall a write the command already sent: the token must still
//! be checked where the data is written.

use std::ffi::OsString;
use std::time::Duration;

use baton_client::worker::{Keeper, KeeperConfig};
use baton_client::AcquiredAll;
use nix::sys::signal::Signal;
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
    let shaped = a
        .shape
        .claims(&a.names)
        .map_err(|e| not_started(e.into()))?;
    let client = connect(&a.client)
        .await
        .map_err(not_started)?
        .with_holder(a.holder.resolve());
    let session = client
        .open_session(a.ttl.unwrap_or_default())
        .await
        .map_err(|e| not_started(e.into()))?;
    let claims: Vec<(&str, baton_core::Shape)> =
        shaped.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let all = match session.acquire_shaped(&claims, None, a.wait).await {
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
        a.verbose,
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
    verbose: bool,
) -> Result<u8, CliError> {
    let env = environment(keepers, server);
    if verbose {
        eprintln!("{who}: {}", crate::tree::MECHANISM);
    }
    let child = match spawn(command, &env) {
        Ok(guarded) => guarded,
        Err(e) => {
            close_bounded(session).await;
            return Err(CliError {
                code: Exit::RunNotStarted,
                message: e.message,
            });
        }
    };
    let grace = grace(who, kill_after, session.ttl());
    let code = supervise(who, child, keepers, session, grace, kill_after).await;
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
/// `BATON_RESOURCE` and `BATON_FENCING_TOKEN`, with `BATON_PERMIT_SLOT`
/// when it is held shared or as a permit (its slot); `BATON_PERMIT_SLOTS`
/// (`NAME=SLOT` per line) names every slot held, for any number of names.
fn environment(keepers: &[Keeper], server: &str) -> Vec<(&'static str, String)> {
    let tokens: Vec<String> = keepers
        .iter()
        .map(|k| format!("{}={}", k.lease().resource, k.lease().token))
        .collect();
    let mut env = vec![
        ("BATON_SERVER", server.to_string()),
        ("BATON_FENCING_TOKENS", tokens.join("\n")),
    ];
    let slots: Vec<String> = keepers
        .iter()
        .filter_map(|k| Some(format!("{}={}", k.lease().resource, k.lease().slot?)))
        .collect();
    if !slots.is_empty() {
        env.push(("BATON_PERMIT_SLOTS", slots.join("\n")));
    }
    if let [one] = keepers {
        env.push(("BATON_RESOURCE", one.lease().resource.clone()));
        env.push(("BATON_FENCING_TOKEN", one.lease().token.to_string()));
        if let Some(slot) = one.lease().slot {
            env.push(("BATON_PERMIT_SLOT", slot.to_string()));
        }
    }
    env
}

/// The guard (`baton exec-child PID --control-fd FD -- COMMAND`) in a
/// process group of its own, and the read end of its control pipe.
struct Guarded {
    guard: Child,
    pid: Pid,
    control: tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>>,
}

fn spawn(command: &[OsString], env: &[(&'static str, String)]) -> Result<Guarded, CliError> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncBufReadExt;
    let failed = |e: &dyn std::fmt::Display| {
        CliError::failure(format!("cannot start {:?}: {e}", command[0]))
    };
    let me = std::env::current_exe().map_err(|e| failed(&e))?;
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| failed(&e))?;
    // The guard inherits the write end (only it: this process spawns no
    // other child), and closes it on exec of the command.
    fcntl(&write, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| failed(&e))?;
    let mut cmd = tokio::process::Command::new(me);
    cmd.arg("exec-child")
        .arg(std::process::id().to_string())
        .arg("--control-fd")
        .arg(write.as_raw_fd().to_string())
        .arg("--")
        .args(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    let guard = cmd.spawn().map_err(|e| failed(&e))?;
    drop(write);
    let pid = Pid::from_raw(guard.id().expect("a running child") as i32);
    let control = tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(|e| failed(&e))?;
    Ok(Guarded {
        guard,
        pid,
        control: tokio::io::BufReader::new(control).lines(),
    })
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

/// Waits for the command's tree; stops it when ownership is lost or the
/// earliest safe-until comes within `grace`, or when the main process
/// exited and the rest outlived `kill_after`; forwards SIGINT, SIGTERM
/// and SIGHUP (through the guard).
async fn supervise(
    who: &str,
    mut g: Guarded,
    keepers: &[Keeper],
    session: &baton_client::Session,
    grace: Duration,
    kill_after: Duration,
) -> Result<u8, CliError> {
    let mut signals = Forwarded::install()?;
    let mut main_code: Option<u8> = None;
    let mut leftovers_until: Option<Instant> = None;
    let mut control_open = true;
    loop {
        let stop_at = safe_until(session)
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            status = g.guard.wait() => return Ok(main_code.unwrap_or(exit_code(status))),
            line = g.control.next_line(), if control_open => match line {
                Ok(Some(line)) => {
                    if let Some(code) = line.strip_prefix(crate::tree::EXITED).and_then(|c| c.trim().parse().ok()) {
                        main_code = Some(code);
                        leftovers_until = Some(Instant::now() + kill_after);
                    }
                }
                // The guard is exiting: its exit is the next event.
                _ => control_open = false,
            },
            sig = signals.recv() => {
                let _ = nix::sys::signal::kill(g.pid, sig);
            }
            _ = tokio::time::sleep_until(leftovers_until.unwrap_or(stop_at)), if leftovers_until.is_some() => {
                let why = format!("the command exited ({}) but its other processes outlived --kill-after {}ms", main_code.unwrap_or(0), kill_after.as_millis());
                stop(who, &mut g, session, grace, &why).await;
                return Ok(main_code.unwrap_or(0));
            }
            keeper = first_lost(keepers) => {
                let why = loss_message(keeper, session);
                stop(who, &mut g, session, grace, &why).await;
                return Ok(LOST);
            }
            _ = tokio::time::sleep_until(stop_at) => {
                if safe_until(session).checked_sub(grace).is_some_and(|at| at > Instant::now()) {
                    continue; // a heartbeat moved the deadline
                }
                let why = format!(
                    "no heartbeat was acknowledged in time: the leases' safe-until is {}ms away",
                    safe_until(session).saturating_duration_since(Instant::now()).as_millis()
                );
                stop(who, &mut g, session, grace, &why).await;
                return Ok(LOST);
            }
        }
    }
}

/// SIGTERM to every process of the tree, then SIGKILL to every one after
/// `grace` or at the earliest safe-until, whichever comes first; returns
/// once no process of the tree is left (the guard has exited).
async fn stop(
    who: &str,
    g: &mut Guarded,
    session: &baton_client::Session,
    grace: Duration,
    why: &str,
) {
    let kill_at = (Instant::now() + grace).min(safe_until(session));
    eprintln!(
        "{who}: {why}; stopping the command's processes: SIGTERM now, SIGKILL in {}ms at the latest",
        kill_at
            .saturating_duration_since(Instant::now())
            .as_millis()
    );
    let _ = nix::sys::signal::kill(g.pid, Signal::SIGTERM);
    tokio::select! {
        _ = g.guard.wait() => {}
        _ = tokio::time::sleep_until(kill_at) => {
            let _ = nix::sys::signal::kill(g.pid, Signal::SIGUSR2);
            let _ = g.guard.wait().await;
        }
    }
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
