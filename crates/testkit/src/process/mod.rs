//! The one process kit of the tests: a child process whose output is read
//! line by line as it arrives and which is killed when dropped ([`Proc`]),
//! a real `baton serve` on loopback ([`Server`]), and where the binaries
//! of this workspace are ([`workspace_bin`]).

mod server;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use server::Server;

/// How long [`Proc::next_line`] and [`Proc::wait_for`] wait for a line.
pub const LINE_WITHIN: Duration = Duration::from_secs(60);

/// A binary of this workspace, built by the same `cargo` run as the test
/// (`cargo nextest run --workspace` and `cargo test --workspace` build
/// every binary before running any test): `<target>/<profile>/NAME`, found
/// from the test's own path `<target>/<profile>/deps/TEST-HASH`. Tests in
/// the package that owns the binary may use `CARGO_BIN_EXE_NAME` instead;
/// this is for tests in another package, such as the system tests.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from <target>/<profile>/deps");
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p baton`), or run the tests \
         with `cargo nextest run --workspace`, which builds every binary",
        bin.display()
    );
    bin
}

/// A child process with stdin closed whose output lines arrive, stamped
/// with the moment they were read, on a channel; killed when dropped.
pub struct Proc {
    child: Child,
    what: String,
    lines: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Proc {
    /// Starts `cmd` and reads its stdout; its stderr goes where `cmd`
    /// says (the test's stderr unless set). `what` names it in panics.
    pub fn spawn(cmd: &mut Command, what: &str) -> Self {
        Self::start(cmd.stdout(Stdio::piped()), what, false)
    }

    /// Starts `cmd` and reads its stdout and stderr as one stream of lines.
    pub fn spawn_merged(cmd: &mut Command, what: &str) -> Self {
        Self::start(
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()),
            what,
            true,
        )
    }

    /// Starts `cmd`, whose first line must be `listening on ADDR`; the
    /// process and ADDR.
    pub fn listening(cmd: &mut Command, what: &str) -> (Self, String) {
        let mut proc = Self::spawn(cmd, what);
        let line = proc.next_line().1;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the {what} said {line:?}, not `listening on ADDR`"))
            .to_string();
        (proc, addr)
    }

    fn start(cmd: &mut Command, what: &str, merged: bool) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {what}: {e}"));
        let (tx, lines) = mpsc::channel();
        let mut outputs: Vec<Box<dyn Read + Send>> =
            vec![Box::new(child.stdout.take().expect("piped stdout"))];
        if merged {
            outputs.push(Box::new(child.stderr.take().expect("piped stderr")));
        }
        for out in outputs {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send((Instant::now(), line)).is_err() {
                        return;
                    }
                }
            });
        }
        Self {
            child,
            what: what.to_string(),
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line within `within`, and when it was read; `None` if the
    /// output ended or nothing came.
    pub fn line_within(&mut self, within: Duration) -> Option<(Instant, String)> {
        let (at, line) = self.lines.recv_timeout(within).ok()?;
        self.seen.push(line.clone());
        Some((at, line))
    }

    /// The next line, and when it was read; panics naming the process if
    /// none comes within [`LINE_WITHIN`].
    pub fn next_line(&mut self) -> (Instant, String) {
        self.line_within(LINE_WITHIN).unwrap_or_else(|| {
            panic!(
                "no line from the {} within {LINE_WITHIN:?}; output so far: {:#?}",
                self.what, self.seen
            )
        })
    }

    /// Reads lines until one contains `needle`; returns it.
    pub fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LINE_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.line_within(left) {
                Some((_, line)) if line.contains(needle) => return line,
                Some(_) => {}
                None => panic!(
                    "no {needle:?} from the {}; output so far: {:#?}",
                    self.what, self.seen
                ),
            }
        }
    }

    /// Every line read so far, including any that arrived since the last
    /// read, without waiting.
    pub fn lines(&mut self) -> &[String] {
        while let Ok((_, line)) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal)
            .unwrap_or_else(|e| panic!("signal the {}: {e}", self.what));
    }

    /// Whether the process is stopped (SIGSTOP), as the kernel reports it.
    pub fn stopped(&self) -> bool {
        crate::stopped(self.child.id())
    }

    /// SIGKILL, and wait for it; the lines it wrote before are kept.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines();
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> ExitStatus {
        self.child
            .wait()
            .unwrap_or_else(|e| panic!("wait for the {}: {e}", self.what))
    }

    /// Waits for it to exit: its exit code and every line not read yet.
    pub fn exit(mut self) -> (Option<i32>, String) {
        let status = self.wait();
        // The readers end when the pipes close; a grandchild that keeps
        // one open is waited for 5 s per line, not forever.
        let mut rest = Vec::new();
        while let Ok((_, l)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            rest.push(l);
        }
        (status.code(), rest.join("\n"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
