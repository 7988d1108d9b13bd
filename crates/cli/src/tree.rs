//! The guard of a command's process tree: `baton exec-child`, started by
//! `baton run` (and `elect -- COMMAND`) between itself and the command.
//!
//! Every process the command starts, at any depth, must be gone before the
//! lease can end. The guard makes that checkable: it is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so an orphan of the tree (a grandchild whose
//! parent exited, a daemon that double-forked, a process that called
//! `setsid`) is re-parented to it, never to init: the tree is exactly the
//! guard's descendants, and it is gone when the guard has no child left.
//! It is not a descendant of the command, so nothing in the tree can kill
//! it by signalling its own group. It dies with `run` in a useful way: the
//! kernel tells it of `run`'s death (`PR_SET_PDEATHSIG`, even for a
//! SIGKILL or the OOM killer), and it SIGKILLs the whole tree at once, as
//! nobody holds the lease any more.
//!
//! It speaks to `run` over a pipe (`--control-fd`): `exited CODE` when the
//! command's main process ended. It
//! takes orders as signals: SIGTERM stops the tree gracefully (SIGTERM to
//! every process of it), SIGUSR2 kills it (SIGKILL to every process, again
//! until none is left), SIGINT and SIGHUP go to the command's process group
//! as a terminal would send them. It exits once no process of the tree is
//! left, with the command's code.
//!
//! Single-threaded and without a runtime: the signals it handles are
//! blocked and taken one at a time with `sigwait`, so no handler runs
//! concurrently with the bookkeeping. The command starts with an empty
//! signal mask (std's `Command` resets it).
//!
//! Not covered: a process that leaves the tree with privileges (a new
//! parent through `ptrace`, `CLONE_PARENT`, a cgroup move), or work handed
//! to a process outside it (a request to a daemon, `systemd-run`, `at`).

use std::ffi::OsString;
use std::io::Write;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::run::{CANNOT_INVOKE, NOT_FOUND, NOT_STARTED};

/// What `run --verbose` says of how the tree is kept.
pub const MECHANISM: &str = "the command's process tree is kept by a guard process (baton exec-child) that is its child subreaper: every process of the tree, setsid or not, stays under it and is stopped with it; no cgroup is used";

/// What `run` is told on the control pipe: `exited CODE` when the
/// command's main process ended.
pub const EXITED: &str = "exited";

/// `baton exec-child PARENT --control-fd FD -- COMMAND`: the guard. Its
/// exit code is the command's (or 124-127 when it could not run it).
pub fn guard(parent: u32, control_fd: i32, command: &[OsString]) -> u8 {
    let handled = handled_signals();
    if let Err(e) = handled.thread_block() {
        eprintln!("baton run: cannot block signals in the guard: {e}");
        return NOT_STARTED;
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1)
        .and_then(|()| nix::sys::prctl::set_child_subreaper(true))
    {
        eprintln!("baton run: cannot guard the command's processes: {e}");
        return NOT_STARTED;
    }
    // The parent may have died before the line above: then nobody holds
    // the lease and the command must not start.
    if nix::unistd::getppid().as_raw() as u32 != parent {
        eprintln!("baton run: exited before the command started");
        return NOT_STARTED;
    }
    let control = match control(control_fd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("baton run: the guard's control pipe: {e}");
            return NOT_STARTED;
        }
    };
    let main = match start(command) {
        Ok(main) => main,
        Err(code) => return code,
    };
    Guard {
        control,
        main,
        main_code: None,
    }
    .watch(&handled)
}

fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        set.add(s);
    }
    set
}

/// The control pipe's write end, reopened through `/proc/self/fd` as a
/// descriptor closed on exec (the command must not hold it), the inherited
/// one closed: no `unsafe` to adopt a raw descriptor.
fn control(fd: i32) -> Result<std::fs::File, std::io::Error> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{fd}"))?;
    nix::unistd::close(fd)?;
    Ok(file)
}

/// Starts the command in a process group of its own; exits 127 naming it
/// if it is not found, 126 if it cannot be started.
fn start(command: &[OsString]) -> Result<Pid, u8> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0);
    match cmd.spawn() {
        Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
        Err(e) => {
            eprintln!("baton run: cannot start {:?}: {e}", command[0]);
            Err(if e.kind() == std::io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_INVOKE
            })
        }
    }
}

/// What one `waitpid` found.
enum Reaped {
    StillAlive,
    One,
    TreeGone(u8),
}

struct Guard {
    control: std::fs::File,
    main: Pid,
    main_code: Option<u8>,
}

impl Guard {
    fn say(&mut self, line: &str) {
        // `run` may be gone; the tree is handled either way.
        let _ = writeln!(self.control, "{line}");
    }

    /// Takes the handled signals one at a time until the tree is gone.
    fn watch(mut self, handled: &SigSet) -> u8 {
        loop {
            let Ok(signal) = handled.wait() else {
                continue;
            };
            match signal {
                Signal::SIGCHLD => {}
                Signal::SIGTERM => self.signal_tree(Signal::SIGTERM),
                Signal::SIGINT | Signal::SIGHUP => {
                    let _ = killpg(self.main, signal);
                }
                // `run` asked for it (SIGUSR2), or `run` died (SIGUSR1):
                // nobody holds the lease.
                _ => return self.kill_tree(),
            }
            if let Some(code) = self.reap() {
                return code;
            }
        }
    }

    /// Reaps every child that ended; the command's code once the tree is
    /// gone (no child left), `None` while some process lives.
    fn reap(&mut self) -> Option<u8> {
        loop {
            match self.wait_one(Some(WaitPidFlag::WNOHANG)) {
                Reaped::StillAlive => return None,
                Reaped::One => {}
                Reaped::TreeGone(code) => return Some(code),
            }
        }
    }

    /// Waits for one child (`flags` as `waitpid`'s), noting the command's
    /// main process when it is the one.
    fn wait_one(&mut self, flags: Option<WaitPidFlag>) -> Reaped {
        match waitpid(None, flags) {
            Ok(WaitStatus::StillAlive) => Reaped::StillAlive,
            Ok(WaitStatus::Exited(pid, code)) if pid == self.main => {
                self.main_ended(code as u8);
                Reaped::One
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.main => {
                self.main_ended(128u8.saturating_add(sig as u8));
                Reaped::One
            }
            Ok(_) | Err(Errno::EINTR) => Reaped::One,
            // ECHILD: no child left.
            Err(_) => Reaped::TreeGone(self.main_code.unwrap_or(NOT_STARTED)),
        }
    }

    fn main_ended(&mut self, code: u8) {
        self.main_code = Some(code);
        self.say(&format!("{EXITED} {code}"));
    }

    /// `signal` to every process of the tree.
    fn signal_tree(&self, signal: Signal) {
        for pid in descendants(Pid::this()) {
            let _ = kill(pid, signal);
        }
    }

    /// SIGKILL to every process of the tree, again until none is left (a
    /// process may fork between the listing and the signal).
    fn kill_tree(&mut self) -> u8 {
        loop {
            self.signal_tree(Signal::SIGKILL);
            if let Reaped::TreeGone(code) = self.wait_one(None) {
                return code;
            }
        }
    }
}

/// Every process whose chain of parents reaches `root`, from `/proc`.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let mut parent_of: Vec<(Pid, Pid)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = parent_pid(pid) {
                parent_of.push((Pid::from_raw(pid), ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent of `pid` from `/proc/PID/stat` (its fourth field, after the
/// command name in parentheses, which may itself hold spaces).
fn parent_pid(pid: i32) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let ppid = after.split(' ').nth(1)?.parse().ok()?;
    Some(Pid::from_raw(ppid))
}
