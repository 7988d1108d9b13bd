use std::path::{Path, PathBuf};

use baton_core::{AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName, Write};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{LeaseStore, StoreError, Stored};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
const FORMAT: u64 = 1;
const FILE_NAME: &str = "baton.redb";
const LEASE_LEN_BYTES: usize = 32;

/// The embedded backend: one redb file under the data directory. Every
/// commit is `Durability::Immediate` (fsync before it returns).
pub struct RedbStore {
    db: Database,
    poisoned: bool,
}

fn storage(e: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(e.to_string())
}

fn encode(record: &LeaseRecord) -> [u8; LEASE_LEN_BYTES] {
    let mut out = [0u8; LEASE_LEN_BYTES];
    out[..16].copy_from_slice(record.acquisition_id.as_bytes());
    out[16..24].copy_from_slice(&record.token.get().to_be_bytes());
    out[24..].copy_from_slice(&record.ttl_ms.to_be_bytes());
    out
}

fn decode(name: &str, bytes: &[u8]) -> Result<(ResourceName, LeaseRecord), StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("lease {name:?}: {what}"));
    let resource = ResourceName::parse(name).map_err(|e| corrupt(e.to_string()))?;
    if bytes.len() != LEASE_LEN_BYTES {
        return Err(corrupt(format!(
            "{} bytes, expected {LEASE_LEN_BYTES}",
            bytes.len()
        )));
    }
    let acquisition_id = AcquisitionId::from_slice(&bytes[..16]).expect("16 bytes");
    let token = u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let token = FencingToken::from_u64(token).map_err(|e| corrupt(e.to_string()))?;
    let ttl_ms = u64::from_be_bytes(bytes[24..].try_into().expect("8 bytes"));
    Ok((
        resource,
        LeaseRecord {
            acquisition_id,
            token,
            ttl_ms,
        },
    ))
}

impl RedbStore {
    pub fn path_in(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE_NAME)
    }

    /// Opens the store under `data_dir`, creating an empty one (epoch 1) if none exists.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::Io {
            path: data_dir.display().to_string(),
            source,
        })?;
        let path = Self::path_in(data_dir);
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse {
                path: path.display().to_string(),
            },
            other => storage(other),
        })?;
        let mut store = Self {
            db,
            poisoned: false,
        };
        store.init()?;
        Ok(store)
    }

    fn init(&mut self) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut meta = txn.open_table(META).map_err(storage)?;
            let format = meta.get("format").map_err(storage)?.map(|v| v.value());
            match format {
                None => {
                    meta.insert("format", FORMAT).map_err(storage)?;
                    meta.insert("epoch", u64::from(Epoch::FIRST.get()))
                        .map_err(storage)?;
                    meta.insert("counter", 0).map_err(storage)?;
                }
                Some(FORMAT) => {}
                Some(found) => {
                    return Err(StoreError::UnsupportedFormat {
                        found,
                        supported: FORMAT,
                    })
                }
            }
            txn.open_table(LEASES).map_err(storage)?;
        }
        txn.commit().map_err(storage)
    }

    /// Replaces whatever is in `data_dir` with an empty store whose tokens
    /// start in `epoch`. Leases are not carried over: after a restore every
    /// holder must acquire again. The new file is written beside the old one
    /// and renamed over it, so a crash leaves either the old or the new store.
    pub fn create_fresh(data_dir: &Path, epoch: Epoch) -> Result<(), StoreError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| StoreError::Io { path, source }
        };
        std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let tmp = data_dir.join(format!("{FILE_NAME}.restore-tmp"));
        let _ = std::fs::remove_file(&tmp);
        {
            let db = Database::create(&tmp).map_err(storage)?;
            let txn = db.begin_write().map_err(storage)?;
            {
                let mut meta = txn.open_table(META).map_err(storage)?;
                meta.insert("format", FORMAT).map_err(storage)?;
                meta.insert("epoch", u64::from(epoch.get()))
                    .map_err(storage)?;
                meta.insert("counter", 0).map_err(storage)?;
                txn.open_table(LEASES).map_err(storage)?;
            }
            txn.commit().map_err(storage)?;
        }
        let target = Self::path_in(data_dir);
        std::fs::rename(&tmp, &target).map_err(io(&target))?;
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(io(data_dir))?;
        Ok(())
    }

    /// Reads the epoch of an existing store without keeping it open.
    /// `Ok(None)` if there is no store in `data_dir`.
    pub fn peek_epoch(data_dir: &Path) -> Result<Option<Epoch>, StoreError> {
        if !Self::path_in(data_dir).exists() {
            return Ok(None);
        }
        let store = Self::open(data_dir)?;
        Ok(Some(store.load()?.epoch))
    }
}

impl LeaseStore for RedbStore {
    fn load(&self) -> Result<Stored, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        let get = |key: &str| -> Result<u64, StoreError> {
            meta.get(key)
                .map_err(storage)?
                .map(|v| v.value())
                .ok_or_else(|| StoreError::Corrupt(format!("meta key {key:?} missing")))
        };
        let epoch = u32::try_from(get("epoch")?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let epoch = Epoch::new(epoch).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let counter = get("counter")?;
        FencingToken::new(epoch, counter).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let table = txn.open_table(LEASES).map_err(storage)?;
        let mut leases = Vec::new();
        for entry in table.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            leases.push(decode(k.value(), v.value())?);
        }
        Ok(Stored {
            epoch,
            counter,
            leases,
        })
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::PreviousIo);
        }
        // Any failure below may leave the file state unknown to us (for
        // example a failed fsync): stop trusting the handle.
        self.poisoned = true;
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut leases = txn.open_table(LEASES).map_err(storage)?;
            let mut meta = txn.open_table(META).map_err(storage)?;
            for write in writes {
                match write {
                    Write::PutLease { resource, record } => {
                        leases
                            .insert(resource.as_str(), &encode(record)[..])
                            .map_err(storage)?;
                    }
                    Write::DeleteLease { resource } => {
                        leases.remove(resource.as_str()).map_err(storage)?;
                    }
                    Write::Tokens { epoch, counter } => {
                        meta.insert("epoch", u64::from(epoch.get()))
                            .map_err(storage)?;
                        meta.insert("counter", *counter).map_err(storage)?;
                    }
                }
            }
        }
        txn.commit().map_err(storage)?;
        self.poisoned = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("baton-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn lease(n: u8, counter: u64) -> (ResourceName, LeaseRecord) {
        let record = LeaseRecord {
            acquisition_id: AcquisitionId::from_bytes([n; 16]),
            token: FencingToken::new(Epoch::FIRST, counter).unwrap(),
            ttl_ms: 5_000,
        };
        (ResourceName::parse(&format!("r{n}")).unwrap(), record)
    }

    #[test]
    fn commits_survive_reopen_and_deletes_apply_in_order() {
        let d = dir("reopen");
        {
            let mut s = RedbStore::open(&d).unwrap();
            let (r1, l1) = lease(1, 1);
            let (r2, l2) = lease(2, 2);
            s.commit(&[
                Write::PutLease {
                    resource: r1.clone(),
                    record: l1,
                },
                Write::PutLease {
                    resource: r2,
                    record: l2.clone(),
                },
                Write::DeleteLease { resource: r1 },
                Write::Tokens {
                    epoch: Epoch::FIRST,
                    counter: 2,
                },
            ])
            .unwrap();
        }
        let s = RedbStore::open(&d).unwrap();
        let stored = s.load().unwrap();
        assert_eq!(stored.counter, 2);
        assert_eq!(stored.leases, vec![lease(2, 2)]);
        assert!(matches!(RedbStore::open(&d), Err(StoreError::InUse { .. })));
        drop(s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn fresh_store_replaces_old_state_with_new_epoch() {
        let d = dir("fresh");
        {
            let mut s = RedbStore::open(&d).unwrap();
            let (r, l) = lease(1, 9);
            s.commit(&[
                Write::PutLease {
                    resource: r,
                    record: l,
                },
                Write::Tokens {
                    epoch: Epoch::FIRST,
                    counter: 9,
                },
            ])
            .unwrap();
        }
        assert_eq!(RedbStore::peek_epoch(&d).unwrap(), Some(Epoch::FIRST));
        let e7 = Epoch::new(7).unwrap();
        RedbStore::create_fresh(&d, e7).unwrap();
        let stored = RedbStore::open(&d).unwrap().load().unwrap();
        assert_eq!(
            (stored.epoch, stored.counter, stored.leases.len()),
            (e7, 0, 0)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
