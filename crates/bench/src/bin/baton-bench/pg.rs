//! PostgreSQL session advisory locks: `pg_advisory_lock` waits in line on the
//! server, `pg_try_advisory_lock` tries once. No token: this is the hand-off
//! rate reference for one contended resource.

use baton_bench::{Conn, Target};
use tokio_postgres::{Client, NoTls};

pub struct Advisory {
    conninfo: String,
}

async fn connect(conninfo: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

impl Advisory {
    pub async fn probe(conninfo: &str) -> Result<Self, String> {
        connect(conninfo)
            .await?
            .simple_query("SELECT 1")
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            conninfo: conninfo.to_string(),
        })
    }
}

impl Target for Advisory {
    type Conn = AdvisoryConn;

    fn name(&self) -> String {
        "postgres advisory lock".into()
    }

    async fn connect(&self) -> Result<AdvisoryConn, String> {
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

    async fn acquire(&mut self, resource: &str, wait: bool) -> Result<i64, String> {
        let k = key(resource);
        if wait {
            self.client
                .execute("SELECT pg_advisory_lock($1)", &[&k])
                .await
                .map_err(|e| e.to_string())?;
        } else {
            let row = self
                .client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&k])
                .await
                .map_err(|e| e.to_string())?;
            if !row.get::<_, bool>(0) {
                return Err("held".into());
            }
        }
        Ok(k)
    }

    async fn release(&mut self, k: i64) -> Result<(), String> {
        self.client
            .execute("SELECT pg_advisory_unlock($1)", &[&k])
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
