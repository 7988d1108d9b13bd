//! `baton admin restore`: the domain logic, apart from flag parsing and
//! printing. A restore replaces a stopped server's data directory with an
//! empty store in a new token epoch above everything known to have been
//! issued: the backup, the replaced directory, the operator's minimum, the
//! highest token the protected resources recorded, and a wall-clock floor.

use std::path::Path;

use baton_core::{Epoch, FencingToken, RestoreFloors};
use prost::Message;

/// What a restore did.
pub struct Restored {
    pub backup_epoch: Option<Epoch>,
    pub resources_floor: Option<FencingToken>,
    pub epoch: Epoch,
    pub first_token: FencingToken,
    pub dropped_leases: usize,
}

/// Why a restore did not happen; `usage` errors are the operator's input.
pub struct RestoreError {
    pub usage: bool,
    pub message: String,
}

fn usage(message: String) -> RestoreError {
    RestoreError {
        usage: true,
        message,
    }
}

fn failure(message: String) -> RestoreError {
    RestoreError {
        usage: false,
        message,
    }
}

/// The backup's epoch and how many leases it held.
fn read_backup(from: &Path) -> Result<(Epoch, usize), RestoreError> {
    let bytes =
        std::fs::read(from).map_err(|e| failure(format!("cannot read {}: {e}", from.display())))?;
    let snapshot = baton_proto::v1::Snapshot::decode(bytes.as_slice())
        .map_err(|e| usage(format!("{} is not a baton backup: {e}", from.display())))?;
    let known = [
        baton_proto::SNAPSHOT_FORMAT,
        baton_proto::SNAPSHOT_FORMAT_WITH_IDS,
    ];
    if !known.contains(&snapshot.format) {
        return Err(usage(format!(
            "backup format {} is not supported; this build reads formats {} and {}",
            snapshot.format,
            baton_proto::SNAPSHOT_FORMAT_WITH_IDS,
            baton_proto::SNAPSHOT_FORMAT
        )));
    }
    let epoch = Epoch::new(snapshot.epoch).map_err(|e| usage(format!("backup: {e}")))?;
    Ok((epoch, snapshot.leases.len() + snapshot.stored_leases.len()))
}

/// Reads the highest token recorded by the fence kit at `url`:
/// `postgres://…` / `postgresql://…` or a libpq `key=value` string, or
/// `sqlite:PATH`.
pub async fn resources_floor(url: &str) -> Result<Option<FencingToken>, RestoreError> {
    let postgres = url.starts_with("postgres://")
        || url.starts_with("postgresql://")
        || (!url.starts_with("sqlite:") && url.contains('='));
    let token = if postgres {
        use baton_fence::postgres::redact_url;
        let shown = redact_url(url);
        let client = baton_pgconn::connect(url)
            .await
            .map_err(|e| failure(format!("--floor-from {shown}: cannot connect: {e}")))?;
        baton_fence::postgres::PgFence::highest_token(&client)
            .await
            .map_err(|e| {
                failure(format!(
                    "--floor-from {shown}: cannot read the fence kit's tables (schema baton): {e}"
                ))
            })?
    } else if let Some(path) = url.strip_prefix("sqlite:") {
        if !Path::new(path).exists() {
            return Err(usage(format!("--floor-from {url}: no such file {path}")));
        }
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| failure(format!("--floor-from {url}: {e}")))?;
        baton_fence::sqlite::SqliteFence::highest_token(&conn).map_err(|e| {
            failure(format!(
                "--floor-from {url}: cannot read the fence kit's tables (baton_resources): {e}"
            ))
        })?
    } else {
        return Err(usage(format!(
            "--floor-from {url:?}: write a PostgreSQL URL (postgres://user@host/db or \"host=... dbname=...\") or sqlite:PATH"
        )));
    };
    token
        .map(|t| FencingToken::from_u64(t.get()))
        .transpose()
        .map_err(|e| {
            failure(format!(
                "--floor-from {url}: recorded token out of range: {e}"
            ))
        })
}

/// The backup's epoch and lease count (if `from`) and `--min-epoch`, checked.
#[allow(clippy::type_complexity)]
fn operator_floors(
    from: Option<&Path>,
    min_epoch: Option<u32>,
) -> Result<(Option<(Epoch, usize)>, Option<Epoch>), RestoreError> {
    let backup = from.map(read_backup).transpose()?;
    let min_epoch = min_epoch
        .map(Epoch::new)
        .transpose()
        .map_err(|e| usage(format!("--min-epoch: {e}")))?;
    Ok((backup, min_epoch))
}

/// Restores a cluster's store in PostgreSQL (`--store`), online: the
/// running leader's term ends with it, and the next leader loads the new
/// epoch.
pub async fn restore_cluster(
    from: Option<&Path>,
    store_url: &str,
    cluster: &str,
    min_epoch: Option<u32>,
    resources_floor: Option<FencingToken>,
    now_unix_s: u64,
) -> Result<Restored, RestoreError> {
    let (backup, min_epoch) = operator_floors(from, min_epoch)?;
    let pg = baton_store_pg::parse_url(store_url).map_err(|e| usage(format!("--store: {e}")))?;
    let mut client = baton_store_pg::connect(&pg)
        .await
        .map_err(|e| failure(format!("--store: {e}")))?;
    let r = baton_store_pg::schema::restore(&mut client, cluster, |replaced| {
        baton_core::restore_epoch(&RestoreFloors {
            backup: backup.map(|(e, _)| e),
            replaced: Some(replaced),
            min_epoch,
            resources: resources_floor,
            now_unix_s,
        })
    })
    .await
    .map_err(|e| failure(format!("--store: {e}")))?;
    Ok(Restored {
        backup_epoch: backup.map(|(e, _)| e),
        resources_floor,
        epoch: r.epoch,
        first_token: FencingToken::new(r.epoch, 1).expect("counter 1 is in range"),
        dropped_leases: r.dropped_leases as usize,
    })
}

/// Restores `data_dir` from `from` (or to an empty store when `None`).
pub fn restore(
    from: Option<&Path>,
    data_dir: &Path,
    min_epoch: Option<u32>,
    resources_floor: Option<FencingToken>,
    now_unix_s: u64,
) -> Result<Restored, RestoreError> {
    let (backup, min_epoch) = operator_floors(from, min_epoch)?;
    let replaced = match baton_store::RedbStore::peek_epoch(data_dir) {
        Ok(epoch) => epoch,
        Err(e @ baton_store::StoreError::InUse { .. }) => return Err(failure(e.to_string())),
        // Nothing in the directory can be read: the operator's floors must
        // stand in for it.
        Err(e) if min_epoch.is_some() || resources_floor.is_some() => {
            eprintln!("warning: {e}; restoring above --min-epoch / --floor-from instead");
            None
        }
        Err(e) => {
            return Err(failure(format!(
                "{e}; pass --floor-from (or --min-epoch) to restore without reading it"
            )))
        }
    };
    let epoch = baton_core::restore_epoch(&RestoreFloors {
        backup: backup.map(|(e, _)| e),
        replaced,
        min_epoch,
        resources: resources_floor,
        now_unix_s,
    })
    .map_err(|e| failure(e.to_string()))?;
    baton_store::RedbStore::create_fresh(data_dir, epoch).map_err(|e| failure(e.to_string()))?;
    Ok(Restored {
        backup_epoch: backup.map(|(e, _)| e),
        resources_floor,
        epoch,
        first_token: FencingToken::new(epoch, 1).expect("counter 1 is in range"),
        dropped_leases: backup.map_or(0, |(_, n)| n),
    })
}
