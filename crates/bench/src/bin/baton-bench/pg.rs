//! Two PostgreSQL references.
//!
//! - Session advisory locks: `pg_advisory_lock` waits in line on the server,
//!   `pg_try_advisory_lock` tries once. No token, nothing durable: the
//!   hand-off rate reference for one contended resource.
//! - The plain lease table users write themselves: one autocommitted
//!   statement (one transaction, one WAL flush) per acquire and per release,
//!   a token column incremented on every grant, expiry by the database's
//!   clock. A waiting acquire polls every millisecond: the table has no queue.

use anyhow::Context;
use baton_bench::{Conn, Target};
use tokio_postgres::Client;

pub struct Advisory {
    conninfo: String,
}

/// A connection as every part of Baton makes one (libpq's SSL settings;
/// pass `sslmode=disable` to measure without TLS).
async fn connect(conninfo: &str) -> anyhow::Result<Client> {
    baton_pgconn::connect(conninfo)
        .await
        .context("connect to PostgreSQL")
}

impl Advisory {
    pub async fn probe(conninfo: &str) -> anyhow::Result<Self> {
        connect(conninfo).await?.simple_query("SELECT 1").await?;
        Ok(Self {
            conninfo: conninfo.to_string(),
        })
    }
}

impl Target for Advisory {
    type Conn = AdvisoryConn;

    fn server_processes(&self) -> &'static [&'static str] {
        &["postgres"]
    }

    fn name(&self) -> String {
        "postgres advisory lock".into()
    }

    async fn connect(&self) -> anyhow::Result<AdvisoryConn> {
        Ok(AdvisoryConn {
            client: connect(&self.conninfo).await?,
        })
    }
}

pub struct AdvisoryConn {
    client: Client,
}

fn key(resource: &str) -> i64 {
    // FNV-1a: a stable 64-bit key per resource name.
    resource.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) as i64
}

impl Conn for AdvisoryConn {
    type Held = i64;

    async fn acquire(&mut self, resource: &str, wait: bool) -> anyhow::Result<i64> {
        let k = key(resource);
        if wait {
            self.client
                .execute("SELECT pg_advisory_lock($1)", &[&k])
                .await?;
        } else {
            let row = self
                .client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&k])
                .await?;
            if !row.get::<_, bool>(0) {
                return Err(anyhow::anyhow!("held"));
            }
        }
        Ok(k)
    }

    async fn release(&mut self, k: i64) -> anyhow::Result<()> {
        self.client
            .execute("SELECT pg_advisory_unlock($1)", &[&k])
            .await?;
        Ok(())
    }
}

/// The plain lease-table pattern (see the module comment).
pub struct LeaseTable {
    conninfo: String,
    ttl_s: u64,
}

impl LeaseTable {
    pub async fn probe(conninfo: &str, ttl_s: u64) -> anyhow::Result<Self> {
        connect(conninfo)
            .await?
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS bench_leases (
                    resource text PRIMARY KEY,
                    holder text,
                    token bigint NOT NULL,
                    expires_at timestamptz NOT NULL)",
            )
            .await?;
        Ok(Self {
            conninfo: conninfo.to_string(),
            ttl_s,
        })
    }
}

impl Target for LeaseTable {
    type Conn = LeaseTableConn;

    fn server_processes(&self) -> &'static [&'static str] {
        &["postgres"]
    }

    fn name(&self) -> String {
        "postgres lease table".into()
    }

    async fn connect(&self) -> anyhow::Result<LeaseTableConn> {
        let client = connect(&self.conninfo).await?;
        let acquire = client
            .prepare(
                "INSERT INTO bench_leases AS l (resource, holder, token, expires_at)
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3))
                 ON CONFLICT (resource) DO UPDATE
                    SET holder = excluded.holder, token = l.token + 1, expires_at = excluded.expires_at
                    WHERE l.holder IS NULL OR l.expires_at < now()
                 RETURNING token",
            )
            .await
            ?;
        let release = client
            .prepare("UPDATE bench_leases SET holder = NULL WHERE resource = $1 AND holder = $2")
            .await?;
        let mut id = [0u8; 8];
        getrandom_id(&mut id);
        Ok(LeaseTableConn {
            client,
            acquire,
            release,
            holder: id.iter().map(|b| format!("{b:02x}")).collect(),
            ttl_s: self.ttl_s as f64,
        })
    }
}

/// A holder id per connection: the process id and a counter are enough here.
fn getrandom_id(out: &mut [u8; 8]) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    out[..4].copy_from_slice(&std::process::id().to_le_bytes());
    out[4..].copy_from_slice(&n.to_le_bytes());
}

pub struct LeaseTableConn {
    client: Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    holder: String,
    ttl_s: f64,
}

impl Conn for LeaseTableConn {
    type Held = (String, i64);

    async fn acquire(&mut self, resource: &str, wait: bool) -> anyhow::Result<(String, i64)> {
        loop {
            let rows = self
                .client
                .query(&self.acquire, &[&resource, &self.holder, &self.ttl_s])
                .await?;
            if let Some(row) = rows.first() {
                return Ok((resource.to_string(), row.get(0)));
            }
            if !wait {
                return Err(anyhow::anyhow!("held"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    async fn release(&mut self, held: (String, i64)) -> anyhow::Result<()> {
        self.client
            .execute(&self.release, &[&held.0, &self.holder])
            .await?;
        Ok(())
    }
}
