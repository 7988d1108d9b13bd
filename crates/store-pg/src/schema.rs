//! The `baton_server` schema: created on first start, checked on every start.

use tokio_postgres::Client;

use crate::PgError;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Migrations in order; file `N` brings the schema to version `N`.
const MIGRATIONS: [&str; 1] = [include_str!("../sql/001_cluster.sql")];

/// What the schema says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The cluster that owns the schema.
    pub cluster: String,
    /// The store's id (a restore writes a new one).
    pub store_id: String,
}

/// Checks a cluster name: 1 to 64 of `a-z 0-9 - _`.
pub fn check_cluster_name(name: &str) -> Result<(), PgError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(PgError::BadClusterName(name.to_string()))
    }
}

fn privileges(action: &'static str) -> impl Fn(tokio_postgres::Error) -> PgError {
    move |e| match PgError::from(e) {
        PgError::Privileges { message, .. } => PgError::Privileges { action, message },
        other => other,
    }
}

/// Creates or upgrades the schema for `cluster` (under an advisory lock, so
/// servers starting together create it once) and checks that it is ours.
pub async fn prepare(client: &mut Client, cluster: &str) -> Result<Meta, PgError> {
    check_cluster_name(cluster)?;
    let txn = client.transaction().await?;
    txn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('baton_server.schema'))",
        &[],
    )
    .await?;
    let exists: bool = txn
        .query_one("SELECT to_regclass('baton_server.meta') IS NOT NULL", &[])
        .await?
        .get(0);
    let mut version = 0;
    if exists {
        version = txn
            .query_one(
                "SELECT schema_version FROM baton_server.meta WHERE id = 1",
                &[],
            )
            .await
            .map_err(privileges("reading baton_server.meta"))?
            .get(0);
        if version > SCHEMA_VERSION {
            return Err(PgError::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        txn.batch_execute(sql)
            .await
            .map_err(privileges("creating the baton_server schema"))?;
        if i == 0 {
            txn.execute(
                "INSERT INTO baton_server.meta VALUES (1, 0, $1, $2, 1, 0)",
                &[&cluster, &crate::random_id()],
            )
            .await?;
            txn.execute(
                "INSERT INTO baton_server.leader VALUES (1, 0, NULL, NULL, 0)",
                &[],
            )
            .await?;
        }
        txn.execute(
            "UPDATE baton_server.meta SET schema_version = $1",
            &[&(i as i32 + 1)],
        )
        .await?;
    }
    let row = txn
        .query_one(
            "SELECT cluster, store_id FROM baton_server.meta WHERE id = 1",
            &[],
        )
        .await
        .map_err(privileges("reading baton_server.meta"))?;
    let meta = Meta {
        cluster: row.get(0),
        store_id: row.get(1),
    };
    if meta.cluster != cluster {
        return Err(PgError::ClusterMismatch {
            expected: cluster.to_string(),
            found: meta.cluster,
        });
    }
    // Writing is checked now, not at the first grant.
    txn.execute(
        "UPDATE baton_server.leader SET beats = beats WHERE id = 1",
        &[],
    )
    .await
    .map_err(privileges("writing baton_server.leader"))?;
    txn.commit().await?;
    Ok(meta)
}
