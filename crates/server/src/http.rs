//! A minimal HTTP/1.1 endpoint for `GET /healthz` (alive), `GET /readyz`
//! (recovered and granting) and `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::metrics::Metrics;

const REQUEST_HEAD_LEN_BYTES_MAX: usize = 8 * 1024;

pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) =
                tokio::time::timeout(Duration::from_secs(5), handle(stream, &metrics)).await
            {
                debug!(error = %e, "http request timed out");
            }
        });
    }
}

async fn handle(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > REQUEST_HEAD_LEN_BYTES_MAX {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head too large\n",
            )
            .await;
        }
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match (method, path) {
        ("GET", "/healthz") => respond(&mut stream, "200 OK", "text/plain", "ok\n").await,
        ("GET", "/readyz") if metrics.ready.load(std::sync::atomic::Ordering::Acquire) => {
            respond(&mut stream, "200 OK", "text/plain", "ready\n").await
        }
        ("GET", "/readyz") => {
            respond(
                &mut stream,
                "503 Service Unavailable",
                "text/plain",
                "not ready: recovering the lease state\n",
            )
            .await
        }
        ("GET", "/metrics") => {
            respond(
                &mut stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &metrics.render(),
            )
            .await
        }
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "not found\n").await,
        _ => {
            respond(
                &mut stream,
                "405 Method Not Allowed",
                "text/plain",
                "only GET is served\n",
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
