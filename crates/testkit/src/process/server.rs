//! A real `baton serve` process on loopback, owning its own data directory,
//! killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Proc;

/// A `baton serve` process.
pub struct Server {
    /// The `baton serve` process.
    pub proc: Proc,
    /// The binary it runs.
    pub bin: PathBuf,
    /// The gRPC address it listens on.
    pub grpc: SocketAddr,
    /// The HTTP address (`/healthz`, `/readyz`, `/metrics`).
    pub http: SocketAddr,
    /// Its data directory, kept across restarts.
    pub data_dir: PathBuf,
    /// Extra `serve` flags, kept across restarts.
    pub extra: Vec<String>,
    /// Where its log goes (at `info`), if not to the test's stderr (at `warn`).
    pub log: Option<PathBuf>,
}

impl Server {
    /// Starts `bin serve` on ephemeral ports with short TTL bounds for tests.
    pub fn start(bin: &Path, data_dir: &Path, extra: &[&str]) -> Self {
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Self::spawn(bin, "127.0.0.1:0", data_dir, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::start`] with its log at `info` appended to `log`.
    pub fn start_logged(bin: &Path, data_dir: &Path, extra: &[&str], log: &Path) -> Self {
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Self::spawn_logged(bin, "127.0.0.1:0", data_dir, extra, Some(log))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `bin serve` on `listen`; `Err` if it did not report listening.
    pub fn spawn(
        bin: &Path,
        listen: &str,
        data_dir: &Path,
        extra: Vec<String>,
    ) -> std::io::Result<Self> {
        Self::spawn_logged(bin, listen, data_dir, extra, None)
    }

    fn spawn_logged(
        bin: &Path,
        listen: &str,
        data_dir: &Path,
        extra: Vec<String>,
        log: Option<&Path>,
    ) -> std::io::Result<Self> {
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("open the server log"),
            ),
            None => Stdio::inherit(),
        };
        let mut cmd = Command::new(bin);
        cmd.args([
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
        .env("RUST_LOG", if log.is_some() { "info" } else { "warn" })
        .stderr(stderr);
        let mut proc = Proc::spawn(&mut cmd, "baton server");
        let line = match proc.line_within(super::LINE_WITHIN) {
            Some((_, line)) if line.starts_with("baton listening") => line,
            first => {
                proc.kill9();
                let status = proc.wait();
                return Err(std::io::Error::other(format!(
                    "server did not start: {first:?} {status:?}"
                )));
            }
        };
        let field = |key: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                .parse()
                .unwrap()
        };
        let (grpc, http) = (field("grpc="), field("http="));
        Ok(Server {
            proc,
            bin: bin.to_path_buf(),
            grpc,
            http,
            data_dir: data_dir.to_path_buf(),
            extra,
            log: log.map(Path::to_path_buf),
        })
    }

    /// `http://` + the gRPC address.
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `https://` + the gRPC address (a server started with `--tls-cert`).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.grpc)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.proc.signal(signal);
    }

    /// SIGKILL, and wait for it.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.proc.signal(nix::sys::signal::Signal::SIGTERM);
        self.proc.wait()
    }

    /// Kills (if running) and restarts on the same gRPC port and data directory.
    pub fn restart(&mut self) {
        self.kill9();
        let listen = self.grpc.to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log.clone();
            match Server::spawn_logged(
                &self.bin,
                &listen,
                &self.data_dir,
                self.extra.clone(),
                log.as_deref(),
            ) {
                Ok(s) => {
                    *self = s;
                    return;
                }
                Err(e) if Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::yield_now(),
            }
        }
    }

    /// The value of an unlabelled counter or gauge on `/metrics`; panics
    /// naming it if the server does not export it.
    pub fn metric(&self, name: &str) -> u64 {
        let text = self.http_get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// One `GET path` on the HTTP port: the whole response.
    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.http).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nhost: {}\r\n\r\n", self.http).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}
