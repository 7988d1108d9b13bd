//! What a Baton target's store did during a run: its servers' commits
//! (`baton_store_commits_total` on their /metrics: one fsync of the
//! embedded store's log, or one PostgreSQL transaction of a cluster's
//! leader, each), and for a cluster PostgreSQL's WAL (`pg_current_wal_lsn`,
//! the database's whole log: run nothing else against it meanwhile).

use std::net::SocketAddr;

use anyhow::Context;
use baton_bench::Report;

/// The servers' HTTP addresses and, for a cluster, its database.
pub struct Probe {
    http: Vec<SocketAddr>,
    store: Option<tokio_postgres::Client>,
}

/// The counters at one moment.
pub struct Mark {
    commits: u64,
    /// The sum of the commits' latencies, and how many.
    latency_s: f64,
    latency_count: u64,
    wal_bytes: Option<u64>,
}

impl Probe {
    /// `http`: comma-separated host:port of every server's HTTP listener;
    /// `store`: the cluster's PostgreSQL connection string, or empty.
    pub async fn new(http: &str, store: &str) -> anyhow::Result<Self> {
        let http = http
            .split(',')
            .map(|a| a.trim().trim_start_matches("http://"))
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.parse()
                    .with_context(|| format!("{a:?} is not an HTTP listener's IP:PORT"))
            })
            .collect::<anyhow::Result<Vec<SocketAddr>>>()?;
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
        let (mut commits, mut latency_s, mut latency_count) = (0, 0.0, 0);
        for &addr in &self.http {
            let read = async |name: &str| {
                baton_bench::metric(addr, name)
                    .await
                    .with_context(|| format!("{addr}/metrics"))
            };
            commits += read("baton_store_commits_total").await?.parse::<u64>()?;
            latency_s += read("baton_store_commit_latency_seconds_sum")
                .await?
                .parse::<f64>()?;
            latency_count += read("baton_store_commit_latency_seconds_count")
                .await?
                .parse::<u64>()?;
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
        Ok(Mark {
            commits,
            latency_s,
            latency_count,
            wal_bytes,
        })
    }

    /// Runs `run`, printing every `every` the commits in the interval and
    /// their mean latency (a probe that fails ends the process, as
    /// elsewhere).
    pub async fn every<T>(
        &self,
        label: &str,
        every: std::time::Duration,
        run: impl std::future::Future<Output = T>,
    ) -> T {
        let start = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval_at(start + every, every);
        let mut last = self
            .mark()
            .await
            .unwrap_or_else(|e| crate::probe_failed(&e));
        let mut run = std::pin::pin!(run);
        loop {
            tokio::select! {
                out = &mut run => return out,
                _ = ticks.tick() => {
                    let now = self.mark().await.unwrap_or_else(|e| crate::probe_failed(&e));
                    let commits = now.commits.saturating_sub(last.commits);
                    let n = now.latency_count.saturating_sub(last.latency_count);
                    let mean_ms = (now.latency_s - last.latency_s) * 1e3 / n.max(1) as f64;
                    println!(
                        "{label:<26}   at {:>5.0} s: {commits} store commits, {mean_ms:.2} ms mean commit",
                        start.elapsed().as_secs_f64()
                    );
                    last = now;
                }
            }
        }
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
