//! The store file's format: a new file, the migrations from every earlier
//! format (ids to digests, holders, the log's use), and its meta table.

use super::*;

pub(super) fn position((epoch, counter): (Epoch, u64)) -> String {
    match FencingToken::new(epoch, counter) {
        Ok(t) => format!("epoch {} counter {counter} (token {t})", epoch.get()),
        Err(_) => format!("epoch {} counter {counter}", epoch.get()),
    }
}

pub(super) fn open_db(path: &Path) -> Result<Database, StoreError> {
    contain_panics(path, || {
        redb::Builder::new()
            .set_cache_size(CACHE_LEN_BYTES)
            .create(path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse {
                    path: path.display().to_string(),
                },
                other => StoreError::Corrupt(format!("{}: {other}", path.display())),
            })
    })
}

pub(super) fn write_new_store(
    path: &Path,
    store_id: StoreId,
    epoch: Epoch,
) -> Result<(), StoreError> {
    let db = Database::create(path).map_err(storage)?;
    let txn = begin_write(&db)?;
    {
        let mut meta = txn.open_table(META).map_err(storage)?;
        let (hi, lo) = store_id.halves();
        meta.insert("format", FORMAT).map_err(storage)?;
        meta.insert("store_id_hi", hi).map_err(storage)?;
        meta.insert("store_id_lo", lo).map_err(storage)?;
        meta.insert("epoch", u64::from(epoch.get()))
            .map_err(storage)?;
        meta.insert("counter", 0).map_err(storage)?;
        // Every new store gets its two logs right after (see `Logs::create`).
        meta.insert("log", 2).map_err(storage)?;
        txn.open_table(LEASES).map_err(storage)?;
    }
    txn.commit().map_err(storage)
}

/// Reads the meta table, first upgrading an older store if that is what
/// `path` holds: format 1 to 2, then 2 to 3.
pub(super) fn migrate_and_read_meta(
    db: Database,
    path: &Path,
) -> Result<(Database, Meta), StoreError> {
    let db = if stored_format(&db)? == Some(FORMAT_WITH_IDS) {
        migrate_ids_to_digests(db, path)?
    } else {
        db
    };
    if stored_format(&db)? == Some(FORMAT_DIGESTS) {
        migrate_to_holders(&db)?;
    }
    let meta = read_meta(&db)?;
    Ok((db, meta))
}

/// Format 2 to 3, in place and in one transaction: every lease record is
/// rewritten in the format-3 layout (with no holder). Sessions keep their
/// table; their openers are unknown (anyone who may hold their leases may
/// resume them, as before). Log records of format 2 stay readable.
pub(super) fn migrate_to_holders(db: &Database) -> Result<(), StoreError> {
    let txn = begin_write(db)?;
    {
        let mut leases = txn.open_table(LEASES).map_err(storage)?;
        let mut rewritten = Vec::new();
        for entry in leases.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            let (resource, record) = decode_v2(k.value(), v.value())?;
            rewritten.push((resource, encode(&record)));
        }
        for (resource, bytes) in rewritten {
            leases
                .insert(resource.as_str(), bytes.as_slice())
                .map_err(storage)?;
        }
        let mut meta = txn.open_table(META).map_err(storage)?;
        meta.insert("format", FORMAT).map_err(storage)?;
    }
    txn.commit().map_err(storage)
}

/// Format 1 to 2. The upgrade writes a new file beside the old one
/// (digests in place of acquisition ids, a store id drawn) and renames it
/// over the old: rewriting in place would leave the ids in the file's free
/// pages.
pub(super) fn migrate_ids_to_digests(db: Database, path: &Path) -> Result<Database, StoreError> {
    let tmp = path.with_extension("migrate-tmp");
    let _ = std::fs::remove_file(&tmp);
    {
        let new = Database::create(&tmp).map_err(storage)?;
        let txn = begin_write(&new)?;
        copy_with_digests(&db, &txn)?;
        txn.commit().map_err(storage)?;
    }
    drop(db);
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |source| StoreError::Io { path: p, source }
    };
    std::fs::rename(&tmp, path).map_err(io(path))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    open_db(path)
}

pub(super) fn stored_format(db: &Database) -> Result<Option<u64>, StoreError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    let format = meta.get("format").map_err(storage)?.map(|v| v.value());
    Ok(format)
}

pub(super) fn copy_with_digests(
    old: &Database,
    txn: &redb::WriteTransaction,
) -> Result<(), StoreError> {
    let read = old.begin_read().map_err(storage)?;
    let old_meta = read.open_table(META).map_err(storage)?;
    let mut meta = txn.open_table(META).map_err(storage)?;
    for key in ["epoch", "counter"] {
        let value = old_meta
            .get(key)
            .map_err(storage)?
            .ok_or_else(|| StoreError::Corrupt(format!("meta key {key:?} missing")))?
            .value();
        meta.insert(key, value).map_err(storage)?;
    }
    let (hi, lo) = StoreId::random()?.halves();
    meta.insert("store_id_hi", hi).map_err(storage)?;
    meta.insert("store_id_lo", lo).map_err(storage)?;
    meta.insert("format", FORMAT_DIGESTS).map_err(storage)?;
    let mut leases = txn.open_table(LEASES).map_err(storage)?;
    for entry in read
        .open_table(LEASES)
        .map_err(storage)?
        .iter()
        .map_err(storage)?
    {
        let (k, v) = entry.map_err(storage)?;
        let mut value = v.value().to_vec();
        if value.len() != LEASE_LEN_BYTES {
            return Err(StoreError::Corrupt(format!(
                "lease {:?}: {} bytes, expected {LEASE_LEN_BYTES}",
                k.value(),
                value.len()
            )));
        }
        let id = AcquisitionId::from_slice(&value[..16]).expect("16 bytes");
        value[..16].copy_from_slice(id.digest().as_bytes());
        leases
            .insert(k.value(), value.as_slice())
            .map_err(storage)?;
    }
    Ok(())
}

/// Records that the store has two logs (meta `log` 2; 1 was one log) and
/// may log ended leases, with the format that says so: format 3 or 4 to 5.
pub(super) fn mark_current(db: &Database) -> Result<(), StoreError> {
    let txn = begin_write(db)?;
    {
        let mut meta = txn.open_table(META).map_err(storage)?;
        meta.insert("log", 2).map_err(storage)?;
        meta.insert("format", FORMAT).map_err(storage)?;
    }
    txn.commit().map_err(storage)
}

pub(super) fn read_meta(db: &Database) -> Result<Meta, StoreError> {
    read_meta_in(&db.begin_read().map_err(storage)?)
}

/// The meta table as `txn` sees it.
pub(super) fn read_meta_in(txn: &redb::ReadTransaction) -> Result<Meta, StoreError> {
    let meta = txn.open_table(META).map_err(storage)?;
    let get = |key: &str| -> Result<u64, StoreError> {
        meta.get(key)
            .map_err(storage)?
            .map(|v| v.value())
            .ok_or_else(|| StoreError::Corrupt(format!("meta key {key:?} missing")))
    };
    // Format 2's meta is format 3's: a restore may peek at either.
    let format = get("format")?;
    if !(FORMAT_DIGESTS..=FORMAT).contains(&format) {
        return Err(StoreError::UnsupportedFormat {
            found: format,
            supported: FORMAT,
        });
    }
    let epoch = u32::try_from(get("epoch")?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let epoch = Epoch::new(epoch).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let counter = get("counter")?;
    FencingToken::new(epoch, counter).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let store_id = StoreId::from_halves(get("store_id_hi")?, get("store_id_lo")?);
    let logs = meta.get("log").map_err(storage)?.map_or(0, |v| v.value());
    Ok(Meta {
        store_id,
        epoch,
        counter,
        uses_log: logs >= 1,
        two_logs: logs >= 2,
        format,
    })
}
