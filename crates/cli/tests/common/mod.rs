//! Shared fixtures: a real `baton serve` process on loopback, owning its own
//! data directory, killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_baton");

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("baton-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Server {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    pub extra: Vec<String>,
}

impl Server {
    /// Starts `baton serve` on ephemeral ports with short TTL bounds for tests.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Self::spawn("127.0.0.1:0", data_dir, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn spawn(listen: &str, data_dir: &Path, extra: Vec<String>) -> Result<Self, String> {
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                listen,
                "--http-listen",
                "127.0.0.1:0",
                "--ttl-min",
                "100ms",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(&extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn baton serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ready line");
        if !line.starts_with("baton listening") {
            let _ = child.kill();
            let status = child.wait();
            return Err(format!("server did not start: {line:?} {status:?}"));
        }
        let field = |key: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                .parse()
                .unwrap()
        };
        let (grpc, http) = (field("grpc="), field("http="));
        Ok(Server {
            child,
            grpc,
            http,
            data_dir: data_dir.to_path_buf(),
            extra,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        self.child.wait().unwrap()
    }

    /// Kills (if running) and restarts on the same gRPC port and data directory.
    pub fn restart(&mut self) {
        self.kill9();
        let listen = self.grpc.to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Server::spawn(&listen, &self.data_dir, self.extra.clone()) {
                Ok(s) => {
                    *self = s;
                    return;
                }
                Err(e) if Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::yield_now(),
            }
        }
    }

    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.http).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs the `baton` CLI and returns its output.
pub fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run baton")
}

/// Extracts a numeric field from a one-line JSON object.
pub fn json_u64(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    json[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

pub fn json_str(json: &str, key: &str) -> Option<String> {
    let at = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    Some(json[at..].split('"').next()?.to_string())
}

/// Polls `check` until it holds, for at most `timeout`. Used to wait for a
/// server-side state change (a waiter queued), never to wait out time.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
