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
        let mut commits = 0;
        for &addr in &self.http {
            let value = baton_bench::metric(addr, "baton_store_commits_total")
                .await
                .with_context(|| format!("{addr}/metrics"))?;
            commits += value.parse::<u64>()?;
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
