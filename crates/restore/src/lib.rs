//! `baton admin restore`: the domain logic, apart from flag parsing and
//! printing (crate `baton-restore`). A restore replaces a stopped server's data directory with an
//! empty store in a new token epoch above everything known to have been
//! issued: the backup, the replaced directory, the operator's minimum, the
//! highest token the protected resources recorded, and a wall-clock floor.

use std::path::{Path, PathBuf};

use baton_core::{Epoch, FencingToken, RestoreFloors, TokenError};
use baton_store::StoreError;
use prost::Message;

/// What a restore did.
pub struct Restored {
    pub backup_epoch: Option<Epoch>,
    pub resources_floor: Option<FencingToken>,
    pub epoch: Epoch,
    pub first_token: FencingToken,
    pub dropped_leases: usize,
    /// The replaced directory could not be read (why): the operator's
    /// floors stood in for it.
    pub unread_directory: Option<StoreError>,
}

/// Why a restore did not happen. The messages name the flag and the value
/// they concern; [`RestoreError::is_usage`] tells the operator's input
/// apart from a failure to read or write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    #[error("cannot read {}: {source}", path.display())]
    ReadBackup {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a baton backup: {source}", path.display())]
    NotABackup {
        path: PathBuf,
        source: prost::DecodeError,
    },
    #[error(
        "backup format {format} is not supported; this build reads formats {} and {}",
        baton_proto::SNAPSHOT_FORMAT_WITH_IDS,
        baton_proto::SNAPSHOT_FORMAT
    )]
    BackupFormat { format: u32 },
    #[error("backup: {0}")]
    BackupEpoch(TokenError),
    #[error("--min-epoch: {0}")]
    MinEpoch(TokenError),
    #[error("--floor-from {url}: write a PostgreSQL URL (postgres://user@host/db or \"host=... dbname=...\") or sqlite:PATH")]
    FloorUrl { url: String },
    #[error("--floor-from {url}: cannot connect: {source}")]
    FloorConnect {
        url: String,
        source: baton_pgconn::ConnectError,
    },
    #[error("--floor-from {url}: no such file {path}")]
    FloorNoFile { url: String, path: String },
    #[error("--floor-from {url}: {source}")]
    FloorOpen {
        url: String,
        source: rusqlite::Error,
    },
    #[error("--floor-from {url}: cannot read the fence kit's tables ({tables}): {source}")]
    FloorRead {
        url: String,
        tables: &'static str,
        source: baton_fence::FenceError,
    },
    #[error("--floor-from {url}: recorded token out of range: {source}")]
    FloorToken { url: String, source: TokenError },
    #[error("--store: {0}")]
    StoreUrl(baton_store_pg::PgError),
    #[error("--store: {0}")]
    Store(baton_store_pg::PgError),
    #[error("{0}")]
    DataDirInUse(StoreError),
    #[error("{0}; pass --floor-from (or --min-epoch) to restore without reading it")]
    DataDirUnreadable(StoreError),
    #[error("{0}")]
    NewEpoch(TokenError),
    #[error("{0}")]
    Create(StoreError),
}

impl RestoreError {
    /// Whether the operator's input is at fault (a usage error), not the
    /// reading or writing of a store.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            RestoreError::NotABackup { .. }
                | RestoreError::BackupFormat { .. }
                | RestoreError::BackupEpoch(_)
                | RestoreError::MinEpoch(_)
                | RestoreError::FloorUrl { .. }
                | RestoreError::FloorNoFile { .. }
                | RestoreError::StoreUrl(_)
        )
    }
}

/// The backup's epoch and how many leases it held.
fn read_backup(from: &Path) -> Result<(Epoch, usize), RestoreError> {
    let path = || from.to_path_buf();
    let bytes = std::fs::read(from).map_err(|source| RestoreError::ReadBackup {
        path: path(),
        source,
    })?;
    let snapshot = baton_proto::v1::Snapshot::decode(bytes.as_slice()).map_err(|source| {
        RestoreError::NotABackup {
            path: path(),
            source,
        }
    })?;
    let known = [
        baton_proto::SNAPSHOT_FORMAT,
        baton_proto::SNAPSHOT_FORMAT_WITH_IDS,
    ];
    if !known.contains(&snapshot.format) {
        return Err(RestoreError::BackupFormat {
            format: snapshot.format,
        });
    }
    let epoch = Epoch::new(snapshot.epoch).map_err(RestoreError::BackupEpoch)?;
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
        let shown = baton_fence::postgres::redact_url(url);
        let client =
            baton_pgconn::connect(url)
                .await
                .map_err(|source| RestoreError::FloorConnect {
                    url: shown.clone(),
                    source,
                })?;
        baton_fence::postgres::PgFence::highest_token(&client)
            .await
            .map_err(|source| RestoreError::FloorRead {
                url: shown,
                tables: "schema baton",
                source,
            })?
    } else if let Some(path) = url.strip_prefix("sqlite:") {
        if !Path::new(path).exists() {
            return Err(RestoreError::FloorNoFile {
                url: url.into(),
                path: path.into(),
            });
        }
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|source| RestoreError::FloorOpen {
                    url: url.into(),
                    source,
                })?;
        baton_fence::sqlite::SqliteFence::highest_token(&conn).map_err(|source| {
            RestoreError::FloorRead {
                url: url.into(),
                tables: "baton_resources",
                source,
            }
        })?
    } else {
        return Err(RestoreError::FloorUrl {
            url: format!("{url:?}"),
        });
    };
    token
        .map(|t| FencingToken::from_u64(t.get()))
        .transpose()
        .map_err(|source| RestoreError::FloorToken {
            url: url.into(),
            source,
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
        .map_err(RestoreError::MinEpoch)?;
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
    let pg = baton_store_pg::parse_url(store_url).map_err(RestoreError::StoreUrl)?;
    let mut client = baton_store_pg::connect(&pg)
        .await
        .map_err(RestoreError::Store)?;
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
    .map_err(RestoreError::Store)?;
    Ok(Restored {
        backup_epoch: backup.map(|(e, _)| e),
        resources_floor,
        epoch: r.epoch,
        first_token: FencingToken::new(r.epoch, 1).expect("counter 1 is in range"),
        dropped_leases: r.dropped_leases as usize,
        unread_directory: None,
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
    let mut unread_directory = None;
    let replaced = match baton_store::RedbStore::peek_epoch(data_dir) {
        Ok(epoch) => epoch,
        Err(e @ StoreError::InUse { .. }) => return Err(RestoreError::DataDirInUse(e)),
        // Nothing in the directory can be read: the operator's floors must
        // stand in for it.
        Err(e) if min_epoch.is_some() || resources_floor.is_some() => {
            unread_directory = Some(e);
            None
        }
        Err(e) => return Err(RestoreError::DataDirUnreadable(e)),
    };
    let epoch = baton_core::restore_epoch(&RestoreFloors {
        backup: backup.map(|(e, _)| e),
        replaced,
        min_epoch,
        resources: resources_floor,
        now_unix_s,
    })
    .map_err(RestoreError::NewEpoch)?;
    baton_store::RedbStore::create_fresh(data_dir, epoch).map_err(RestoreError::Create)?;
    Ok(Restored {
        backup_epoch: backup.map(|(e, _)| e),
        resources_floor,
        epoch,
        first_token: FencingToken::new(epoch, 1).expect("counter 1 is in range"),
        dropped_leases: backup.map_or(0, |(_, n)| n),
        unread_directory,
    })
}
