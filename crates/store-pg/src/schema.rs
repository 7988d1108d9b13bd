//! The `baton_server` schema: created on first start, checked on every start.

use tokio_postgres::Client;

use crate::PgError;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 8;

/// Migrations in order; file `N` brings the schema to version `N`.
pub const MIGRATIONS: [&str; 8] = [
    include_str!("../sql/001_cluster.sql"),
    include_str!("../sql/002_sessions.sql"),
    include_str!("../sql/003_holders.sql"),
    include_str!("../sql/004_ended.sql"),
    include_str!("../sql/005_shapes.sql"),
    include_str!("../sql/006_changes.sql"),
    include_str!("../sql/007_trim.sql"),
    include_str!("../sql/008_pipelined.sql"),
];

/// The definition in force of every `baton_server` function, one file per
/// function (`sql/functions/NAME.sql`, every overload in it), as the
/// migrations leave them: read these to know what a commit does. Applied
/// again after the migrations whenever a start installs or upgrades the
/// schema; a test checks they are exactly what the migrations leave in
/// force.
pub const FUNCTIONS: [(&str, &str); 1] = [(
    "commit_batch.sql",
    include_str!("../sql/functions/commit_batch.sql"),
)];

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

/// Takes the schema's advisory lock for the transaction (servers starting
/// together, and restores, serialize on it); whether the schema exists.
async fn lock_schema(txn: &tokio_postgres::Transaction<'_>) -> Result<bool, PgError> {
    txn.execute(
        "SELECT pg_advisory_xact_lock(hashtext('baton_server.schema'))",
        &[],
    )
    .await?;
    Ok(txn
        .query_one("SELECT to_regclass('baton_server.meta') IS NOT NULL", &[])
        .await?
        .get(0))
}

/// Creates or upgrades the schema for `cluster` (under an advisory lock, so
/// servers starting together create it once) and checks that it is ours.
pub async fn prepare(client: &mut Client, cluster: &str) -> Result<Meta, PgError> {
    prepare_version(client, cluster, SCHEMA_VERSION).await
}

/// The schema's version; refused if a newer Baton wrote it.
async fn stored_version(txn: &tokio_postgres::Transaction<'_>) -> Result<i32, PgError> {
    let version: i32 = txn
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
    Ok(version)
}

/// Runs the migrations after `version` up to `target`; the first one
/// creates the meta and leadership rows.
async fn migrate(
    txn: &tokio_postgres::Transaction<'_>,
    cluster: &str,
    version: i32,
    target: i32,
) -> Result<(), PgError> {
    let upto = target.clamp(1, SCHEMA_VERSION) as usize;
    let mut ran = false;
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .take(upto)
        .skip(version.max(0) as usize)
    {
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
        ran = true;
    }
    // The definitions in force, after an install or upgrade to this
    // build's version (a start that migrates nothing needs no DDL right).
    if ran && upto == MIGRATIONS.len() {
        for (_, sql) in FUNCTIONS {
            txn.batch_execute(sql)
                .await
                .map_err(privileges("creating the baton_server schema"))?;
        }
    }
    Ok(())
}

/// [`prepare`], stopping at schema version `target`: what an older
/// release creates (upgrade tests write a store as that release did).
#[doc(hidden)]
pub async fn prepare_version(
    client: &mut Client,
    cluster: &str,
    target: i32,
) -> Result<Meta, PgError> {
    check_cluster_name(cluster)?;
    let txn = client.transaction().await?;
    let exists = lock_schema(&txn).await?;
    let version = if exists {
        stored_version(&txn).await?
    } else {
        0
    };
    migrate(&txn, cluster, version, target).await?;
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

/// What a restore onto a cluster did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The epoch the store was in.
    pub replaced: baton_core::Epoch,
    /// The new epoch; the next token is its counter 1.
    pub epoch: baton_core::Epoch,
    /// Leases dropped (holders acquire again).
    pub dropped_leases: u64,
    /// The leadership term the restore ended: a leader of it commits nothing more.
    pub ended_term: u64,
    /// The new store id.
    pub store_id: String,
}

/// Empties what a restore replaces: the leases (their count is returned),
/// the sessions and the kept changes (the new epoch numbers its changes
/// above every earlier one, `baton_core::first_seq`: the history before it
/// is not this state's).
async fn drop_state(
    txn: &tokio_postgres::Transaction<'_>,
    version: i32,
) -> Result<u64, tokio_postgres::Error> {
    let dropped = txn.execute("DELETE FROM baton_server.leases", &[]).await?;
    if version >= 2 {
        txn.execute("DELETE FROM baton_server.sessions", &[])
            .await?;
    }
    if version >= 6 {
        txn.batch_execute("DELETE FROM baton_server.changes; UPDATE baton_server.meta SET seq = 0")
            .await?;
    }
    Ok(dropped)
}

/// Restores the cluster's store in place, in one transaction: a new store
/// id, no leases, no sessions and no kept changes, and the token position at the start of the epoch that
/// `new_epoch` picks from the replaced one. The leadership term is ended
/// too, so the running leader's next commit is refused; the row is marked
/// as changed, not released, so no server takes over before the old
/// leader's answer deadline has passed (it may still answer renewals of
/// dropped leases from memory until then).
pub async fn restore(
    client: &mut Client,
    cluster: &str,
    new_epoch: impl FnOnce(baton_core::Epoch) -> Result<baton_core::Epoch, baton_core::TokenError>,
) -> Result<Restored, PgError> {
    check_cluster_name(cluster)?;
    let txn = client.transaction().await?;
    let exists = lock_schema(&txn).await?;
    if !exists {
        return Err(PgError::Db(
            "this database has no baton_server schema: there is no cluster store to restore (start `baton serve --store` once to create it)".into(),
        ));
    }
    let row = txn
        .query_one(
            "SELECT schema_version, cluster, epoch FROM baton_server.meta WHERE id = 1",
            &[],
        )
        .await?;
    let (version, found, epoch): (i32, String, i64) = (row.get(0), row.get(1), row.get(2));
    if version > SCHEMA_VERSION {
        return Err(PgError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if found != cluster {
        return Err(PgError::ClusterMismatch {
            expected: cluster.to_string(),
            found,
        });
    }
    // Waits for a leader commit in flight, like a takeover.
    let term: i64 = txn
        .query_one(
            "SELECT term FROM baton_server.leader WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await?
        .get(0);
    let replaced = u32::try_from(epoch)
        .ok()
        .and_then(|e| baton_core::Epoch::new(e).ok())
        .ok_or_else(|| PgError::Db(format!("stored epoch {epoch} is out of range")))?;
    let epoch = new_epoch(replaced).map_err(|e| PgError::Db(e.to_string()))?;
    let dropped = drop_state(&txn, version).await?;
    let store_id = crate::random_id();
    txn.execute(
        "UPDATE baton_server.meta SET epoch = $1, counter = 0, store_id = $2 WHERE id = 1",
        &[&i64::from(epoch.get()), &store_id],
    )
    .await?;
    txn.execute(
        "UPDATE baton_server.leader SET term = term + 1, holder = 'restore', advertise = NULL, beats = beats + 1 WHERE id = 1",
        &[],
    )
    .await?;
    txn.commit().await?;
    Ok(Restored {
        replaced,
        epoch,
        dropped_leases: dropped,
        ended_term: term as u64,
        store_id,
    })
}
