//! `baton bench --page HTTP_ADDR`: what open operator pages cost the lease
//! path, side by side in alternating rounds (clients alone, then beside
//! `--pages` pollers that each make the page's calls once a second, as an
//! open tab does), and how long the page's first data takes: the median
//! of 21 fetches of `/api/overview` plus the first `/api/leases` page.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::watch::{alternating, median};
use super::{emit, Args, BenchError, Endpoint};

/// How often an open page refreshes.
const REFRESH: Duration = Duration::from_secs(1);
/// Fetches of the first data, for its median.
const FIRST_ROWS_SAMPLES: usize = 21;

/// `GET path` on `addr` with an optional bearer token: the status and the
/// body's length.
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<(u16, usize)> {
    let context =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("GET {path} from {addr}: {e}"));
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(context)?;
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nhost: {addr}\r\n{auth}\r\n").as_bytes())
        .await
        .map_err(context)?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.map_err(context)?;
    let status = std::str::from_utf8(out.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("GET {path} from {addr}: not an HTTP answer"),
            )
        })?;
    Ok((status, out.len()))
}

/// The calls one refresh of the page makes; `false` if one did not answer 200.
async fn refresh(addr: SocketAddr, token: Option<&str>) -> std::io::Result<bool> {
    for path in [
        "/api/overview",
        "/api/leases?limit=50&prefix=",
        "/api/history?resource=bench%3Apage",
    ] {
        let (status, _) = get(addr, path, token).await?;
        if status != 200 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Open pages; dropping them closes every one.
struct Pages {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    refreshes: Arc<AtomicU64>,
}

impl Drop for Pages {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn open(addr: SocketAddr, n: usize, token: Option<String>) -> Pages {
    let refreshes = Arc::new(AtomicU64::new(0));
    let tasks = (0..n)
        .map(|_| {
            let (refreshes, token) = (refreshes.clone(), token.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(REFRESH);
                loop {
                    tick.tick().await;
                    if refresh(addr, token.as_deref()).await.is_ok_and(|ok| ok) {
                        refreshes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    Pages { tasks, refreshes }
}

pub(super) async fn overhead(
    a: &Args,
    to: &Endpoint,
    json: bool,
    addr: &str,
) -> Result<(), BenchError> {
    let addr: SocketAddr = addr.parse().map_err(|_| {
        BenchError::Usage(format!(
            "--page {addr:?}: write the server's HTTP address, like 127.0.0.1:7701"
        ))
    })?;
    let token = match &to.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| BenchError::Usage(format!("--token-file {}: {e}", path.display())))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    // The first data, before the load: the median of a few fetches.
    let mut first_ms = Vec::new();
    for _ in 0..FIRST_ROWS_SAMPLES {
        let started = Instant::now();
        for path in ["/api/overview", "/api/leases?limit=50&prefix="] {
            let (status, _) = get(addr, path, token.as_deref())
                .await
                .map_err(|e| BenchError::Failed(format!("--page: {e}")))?;
            if status != 200 {
                return Err(BenchError::Failed(format!(
                    "--page: {path} answered {status} (with an auth file, pass --token of a principal with read)"
                )));
            }
        }
        first_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let mut refreshes = 0;
    let sides = alternating(
        a,
        to,
        async || Ok(open(addr, a.pages, token.clone())),
        |p: &Pages| refreshes += p.refreshes.load(Ordering::Relaxed),
    )
    .await?;
    let out = PageOverhead {
        clients: sides.clients,
        pages: a.pages,
        rounds: sides.rounds,
        first_data_ms: median(first_ms),
        cycles_per_s_without: sides.cycles_per_s_without,
        cycles_per_s_with: sides.cycles_per_s_with,
        ratio: sides.ratio(),
        acquire_p99_us_without: sides.acquire_p99_us_without,
        acquire_p99_us_with: sides.acquire_p99_us_with,
        page_refreshes: refreshes,
    };
    emit(json, &out, PageOverhead::text);
    Ok(())
}

#[derive(Serialize)]
struct PageOverhead {
    clients: usize,
    pages: usize,
    rounds: usize,
    first_data_ms: f64,
    cycles_per_s_without: u64,
    cycles_per_s_with: u64,
    ratio: f64,
    acquire_p99_us_without: u64,
    acquire_p99_us_with: u64,
    page_refreshes: u64,
}

impl PageOverhead {
    fn text(&self) -> String {
        format!(
            "first data (overview + 50 rows): {:.1} ms median of {FIRST_ROWS_SAMPLES}\nC={} distinct, medians of {} rounds: {} cycles/s without pages, {} with {} page(s) refreshing every second ({:.3}x); acquire p99 {} us -> {} us; {} refreshes",
            self.first_data_ms,
            self.clients,
            self.rounds,
            self.cycles_per_s_without,
            self.cycles_per_s_with,
            self.pages,
            self.ratio,
            self.acquire_p99_us_without,
            self.acquire_p99_us_with,
            self.page_refreshes
        )
    }
}
