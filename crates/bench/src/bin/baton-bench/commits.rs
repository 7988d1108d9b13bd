//! What a Baton target's store did during a run: its servers' commits
//! (`baton_store_commits_total` on their /metrics: one fsync of the
//! embedded store's log, or one PostgreSQL transaction of a cluster's
//! leader, each), and for a cluster PostgreSQL's WAL (`pg_current_wal_lsn`,
//! the database's whole log: run nothing else against it meanwhile).

use anyhow::{bail, Context};
use baton_bench::Report;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The servers' HTTP addresses and, for a cluster, its database.
pub struct Probe {
    http: Vec<String>,
    store: Option<tokio_postgres::Client>,
}

/// The counters at one moment.
pub struct Mark {
    commits: u64,
    wal_bytes: Option<u64>,
}

impl Probe {
    /// `http`: comma-separated host:port of every server's HTTP listener;
    /// `store`: the cluster's PostgreSQL connection string, or empty.
    pub async fn new(http: &str, store: &str) -> anyhow::Result<Self> {
        let http: Vec<String> = http
            .split(',')
            .map(|a| a.trim().trim_start_matches("http://").to_string())
            .filter(|a| !a.is_empty())
            .collect();
        let store = if store.is_empty() {
            None
        } else {
            Some(
                baton_pgconn::connect(store)
                    .await
                    .context("connect to the cluster's PostgreSQL")?,
            )
        };
        let probe = Self { http, store };
        probe.mark().await?;
        Ok(probe)
    }

    pub async fn mark(&self) -> anyhow::Result<Mark> {
        let mut commits = 0;
        for addr in &self.http {
            commits += store_commits(addr).await?;
        }
        let wal_bytes = match &self.store {
            None => None,
            Some(c) => {
                let row = c
                    .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
                    .await?;
                Some(row.get::<_, i64>(0) as u64)
            }
        };
        Ok(Mark { commits, wal_bytes })
    }

    /// The line printed under a run's report.
    pub fn line(before: &Mark, after: &Mark, report: &Report) -> String {
        let commits = after.commits.saturating_sub(before.commits);
        let seconds = report.cycles as f64 / report.cycles_per_s.max(1.0);
        let mut line = format!(
            "{:<26}   store commits {:.0}/s, {:.2} cycles per commit",
            "",
            commits as f64 / seconds.max(1e-9),
            report.cycles as f64 / commits.max(1) as f64
        );
        if let (Some(a), Some(b)) = (before.wal_bytes, after.wal_bytes) {
            line.push_str(&format!(
                ", PostgreSQL WAL {:.0} bytes per cycle",
                b.saturating_sub(a) as f64 / report.cycles.max(1) as f64
            ));
        }
        line
    }
}

/// `baton_store_commits_total` from one server's /metrics.
async fn store_commits(addr: &str) -> anyhow::Result<u64> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect to {addr} for /metrics"))?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    for line in body.lines() {
        if let Some(v) = line.strip_prefix("baton_store_commits_total ") {
            return Ok(v.trim().parse()?);
        }
    }
    bail!("{addr}/metrics has no baton_store_commits_total")
}
