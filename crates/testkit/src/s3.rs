//! An S3-compatible server for tests: `moto`'s server mode (from PyPI,
//! installed by `scripts/test` into `target/s3-venv`; `BATON_TEST_MOTO`
//! names another `moto_server`), one process per test on a free loopback
//! port, with a bucket made for it. And [`Proxy`], an HTTP proxy in front
//! of it that can strip `If-None-Match` (a store that ignores conditional
//! create) or cut a request's body short (an interrupted upload).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::process::Proc;

use crate::pg_cluster::free_port;

/// Access key and secret moto accepts (it checks neither).
pub const ACCESS_KEY: &str = "baton-test";
/// The secret that goes with [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "baton-test-secret";

fn moto_server() -> PathBuf {
    if let Ok(p) = std::env::var("BATON_TEST_MOTO") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/s3-venv/bin/moto_server");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test (it installs moto[server] from PyPI into target/s3-venv) or set BATON_TEST_MOTO",
        p.display()
    );
    p
}

/// A moto server process with one bucket, killed when dropped.
pub struct S3Server {
    _proc: Proc,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket made for the test.
    pub bucket: String,
}

impl S3Server {
    /// Starts a server and makes `bucket` (3 to 63 lowercase letters,
    /// digits and hyphens).
    pub fn start(bucket: &str) -> Self {
        let port = free_port();
        let proc = Proc::spawn(
            Command::new(moto_server())
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stderr(Stdio::null()),
            "moto_server",
        );
        let server = Self {
            _proc: proc,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(code) = raw_request(
                port,
                &format!("PUT /{bucket} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n"),
            ) {
                assert_eq!(code, 200, "creating bucket {bucket}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer on port {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The environment an S3 client reads to reach this server (as the AWS
    /// SDKs name it).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ]
    }
}

/// Sends one request on a new connection; the answer's status code.
fn raw_request(port: u16, request: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(request.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    out.get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {out:?}")))
}

/// What the proxy does to each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mischief {
    /// Forward as it is.
    None,
    /// Drop the `If-None-Match` header: the store behind it overwrites.
    StripIfNoneMatch,
    /// Forward half of a PUT's body, then close both connections: an
    /// upload interrupted mid-way.
    CutPutBody,
}

/// An HTTP/1 proxy to a server on loopback, one request per connection
/// (it asks both sides to close after each answer).
pub struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Starts a proxy to `upstream_port` doing `mischief`.
    pub async fn start(upstream_port: u16, mischief: Mischief) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let mischief = Arc::new(mischief);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mischief = *mischief;
                tokio::spawn(async move {
                    let _ = relay(client, upstream_port, mischief).await;
                });
            }
        });
        Self { endpoint, task }
    }
}

async fn relay(
    mut client: TcpStream,
    upstream_port: u16,
    mischief: Mischief,
) -> std::io::Result<()> {
    // The request head.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines: Vec<&str> = head.trim_end().split("\r\n").collect();
    let is_put = lines[0].starts_with("PUT ");
    let length: usize = lines
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let dropped = |name: &str| {
        name.eq_ignore_ascii_case("connection")
            || (mischief == Mischief::StripIfNoneMatch
                && name.eq_ignore_ascii_case("if-none-match"))
    };
    lines.retain(|l| !dropped(l.split(':').next().unwrap_or_default()));
    let mut body = vec![0; length];
    client.read_exact(&mut body).await?;
    let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port)).await?;
    let head = format!("{}\r\nconnection: close\r\n\r\n", lines.join("\r\n"));
    upstream.write_all(head.as_bytes()).await?;
    if mischief == Mischief::CutPutBody && is_put && length > 1 {
        upstream.write_all(&body[..length / 2]).await?;
        // Both sides see the connection end mid-body.
        return Ok(());
    }
    upstream.write_all(&body).await?;
    let mut answer = Vec::new();
    upstream.read_to_end(&mut answer).await?;
    // Tell the client too that this connection ends with the answer.
    if let Some(at) = answer.windows(2).position(|w| w == b"\r\n") {
        answer.splice(at + 2..at + 2, b"connection: close\r\n".iter().copied());
    }
    client.write_all(&answer).await?;
    client.shutdown().await
}
