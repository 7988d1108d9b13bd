//! Writing to redb: a fold's (or a checkpoint's) writes in one
//! transaction.

use super::*;

/// Applies `writes` in order to redb in one durable transaction.
pub(super) fn write_to_redb(db: &Database, writes: &[Write]) -> Result<(), StoreError> {
    let txn = begin_write(db)?;
    let mut ended = Vec::new();
    let mut changes = Vec::new();
    {
        let mut leases = txn.open_table(LEASES).map_err(storage)?;
        let mut meta = txn.open_table(META).map_err(storage)?;
        let mut sessions = None;
        for write in writes {
            match write {
                Write::PutLease { resource, record } => {
                    leases
                        .insert(resource.as_str(), encode(record).as_slice())
                        .map_err(storage)?;
                }
                Write::PutSession { record } => {
                    let (table, openers) = open_sessions(&txn, &mut sessions)?;
                    let key = &record.digest.as_bytes()[..];
                    table.insert(key, record.ttl_ms).map_err(storage)?;
                    match &record.opener {
                        Some(opener) => openers.insert(key, opener.as_str()),
                        None => openers.remove(key),
                    }
                    .map_err(storage)?;
                }
                Write::DeleteSession { digest } => {
                    let (table, openers) = open_sessions(&txn, &mut sessions)?;
                    table.remove(&digest.as_bytes()[..]).map_err(storage)?;
                    openers.remove(&digest.as_bytes()[..]).map_err(storage)?;
                }
                Write::DeleteLease { resource } => {
                    leases.remove(resource.as_str()).map_err(storage)?;
                }
                Write::Tokens { epoch, counter } => {
                    meta.insert("epoch", u64::from(epoch.get()))
                        .map_err(storage)?;
                    meta.insert("counter", *counter).map_err(storage)?;
                }
                Write::LeaseEnded { digest } => ended.push(*digest),
                Write::Changed(change) => changes.push(change.clone()),
            }
        }
        changes.sort_unstable_by_key(|c| c.seq);
        history::keep(&txn, &mut meta, &changes)?;
    }
    ended::keep(&txn, &ended, ended::wall_ms())?;
    txn.commit().map_err(storage)
}

type SessionTables<'t> = (
    redb::Table<'t, &'static [u8], u64>,
    redb::Table<'t, &'static [u8], &'static str>,
);

/// The session tables of a commit, opened (or created) on first use:
/// most commits touch no session.
fn open_sessions<'a, 't>(
    txn: &'t redb::WriteTransaction,
    tables: &'a mut Option<SessionTables<'t>>,
) -> Result<&'a mut SessionTables<'t>, StoreError> {
    if tables.is_none() {
        *tables = Some((
            txn.open_table(SESSIONS).map_err(storage)?,
            txn.open_table(SESSION_OPENERS).map_err(storage)?,
        ));
    }
    Ok(tables.as_mut().expect("opened"))
}
