use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_core::{
    AcquisitionDigest, AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName,
    SessionRecord, Write,
};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::identity::{Identity, StoreId};
use crate::quiet::contain_panics;
use crate::record::{decode, decode_v2, encode, LEASE_LEN_BYTES};
use crate::wal::{self, Pending, Wal};
use crate::{LeaseStore, StoreError, Stored};
use fold::Folder;
use logs::Logs;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
/// Open sessions: the session digest to its TTL in milliseconds. Created by
/// the first session; a store without it has none.
const SESSIONS: TableDefinition<&[u8], u64> = TableDefinition::new("sessions");
/// The principal that opened a session, for the sessions opened with one
/// (format 3). Created by the first such session.
const SESSION_OPENERS: TableDefinition<&[u8], &str> = TableDefinition::new("session_openers");
/// Format 1 stored acquisition ids; format 2 stores their digests and a
/// store id; format 3 adds holder descriptions to lease records (see
/// `record`) and session openers; format 4 has two logs (a build that
/// knows one would not replay the second); format 5 keeps ended leases
/// (`ended.rs`; a build without them would take their log records for
/// corruption); format 6 keeps the latest holder changes (`history.rs`).
const FORMAT: u64 = 6;
const FORMAT_DIGESTS: u64 = 2;
const FORMAT_WITH_IDS: u64 = 1;
const FILE_NAME: &str = "baton.redb";
/// redb's page cache. Its default (1 GiB) would hold most of the file in
/// memory next to the lease table, which already holds every lease: a grant
/// only needs the pages on its path, and the kernel's page cache serves the
/// rest. At 10M live leases the file is about 1.4 GB, of which the branch
/// pages (every path's upper levels) are about 15 MB: 32 MiB holds them.
const CACHE_LEN_BYTES: usize = 32 << 20;
/// The embedded backend: one redb file under the data directory, guarded by
/// the directory's identity file, with two write-ahead logs in front (see
/// the `wal` module): a commit is one record appended to the active log and
/// one `fdatasync`; a full log is folded into redb by a thread of its own
/// (`fold.rs`) while commits go on in the other; an epoch change folds
/// everything into redb at once.
pub struct RedbStore {
    db: Arc<Database>,
    data_dir: PathBuf,
    identity: Identity,
    poisoned: bool,
    logs: Logs,
    /// The active log's writes, one per key (not yet in redb).
    pending: Pending,
    /// Folds the other log's writes into redb.
    folder: Folder,
}

fn storage(e: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(e.to_string())
}

/// A write transaction that saves redb's allocator state with its commit
/// and commits in two phases ("quick repair"): after a crash redb opens
/// the file from the last commit at once, instead of walking every page
/// of it to rebuild that state (about a second at ten million leases,
/// before the first grant). Commits to redb are the background folds of
/// the log, never on a client's path, so their extra write and sync cost
/// no answer anything.
fn begin_write(db: &Database) -> Result<redb::WriteTransaction, StoreError> {
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_quick_repair(true);
    Ok(txn)
}

/// What is at the store file's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileState {
    Missing,
    Empty,
    Present,
}

fn file_state(path: &Path) -> Result<FileState, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() == 0 => Ok(FileState::Empty),
        Ok(_) => Ok(FileState::Present),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileState::Missing),
        Err(source) => Err(StoreError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// The store's meta table as read at open.
struct Meta {
    store_id: StoreId,
    epoch: Epoch,
    counter: u64,
    /// Whether the store has a write-ahead log (meta key `log`): then a
    /// missing log is lost commits, not an upgrade from before logs.
    uses_log: bool,
    /// Whether it has two (meta key `log` at 2): then the second is needed too.
    two_logs: bool,
    /// Its format (from format 2 on; older ones are upgraded first).
    format: u64,
}

impl RedbStore {
    /// Where the store file of `data_dir` lives.
    pub fn path_in(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE_NAME)
    }

    /// Opens the store under `data_dir`. An empty or missing directory is
    /// initialized (epoch 1). A directory that has an identity but no valid
    /// store, a store of another identity, or a store whose tokens went back
    /// below the identity's floor is refused: starting would issue tokens again.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_log(data_dir, wal::LEN_BYTES_DEFAULT)
    }

    /// [`RedbStore::open`] with write-ahead logs of `log_len_bytes` each
    /// (new logs; existing ones keep their size). Bigger logs absorb a
    /// bigger burst of writes (a mass expiry) before a rotation must wait
    /// for the last fold; crash tests use small ones, so that folds and
    /// rotations come every few commits.
    pub fn open_with_log(data_dir: &Path, log_len_bytes: u64) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::Io {
            path: data_dir.display().to_string(),
            source,
        })?;
        let path = Self::path_in(data_dir);
        let identity = Identity::read(data_dir)?;
        let state = file_state(&path)?;
        if identity.is_none() && state == FileState::Missing {
            return Self::initialize(data_dir, log_len_bytes);
        }
        refuse_lost(data_dir, &path, identity.as_ref(), state)?;
        let db = open_db(&path)?;
        let (db, meta) = contain_panics(&path, || migrate_and_read_meta(db, &path))?;
        if let Some(identity) = &identity {
            if identity.store_id != meta.store_id {
                return Err(StoreError::IdentityMismatch {
                    data_dir: data_dir.display().to_string(),
                    expected: identity.store_id.to_hex(),
                    found: meta.store_id.to_hex(),
                });
            }
        }
        for (slot, needed) in [(0, meta.uses_log), (1, meta.two_logs)] {
            let wal_path = Wal::path_of(data_dir, slot);
            if needed && !wal_path.exists() {
                return Err(StoreError::LogLost {
                    path: wal_path.display().to_string(),
                    data_dir: data_dir.display().to_string(),
                });
            }
        }
        let opened = Logs::open(data_dir, meta.store_id, log_len_bytes)?;
        if !meta.two_logs || meta.format < FORMAT {
            // A store from before the logs, or before the second, or
            // before ended leases: from now on it has two logs and may log
            // ended leases, and a build that knows neither refuses it.
            contain_panics(&path, || mark_current(&db))?;
        }
        contain_panics(&path, || ended::drop_one_per_row_table(&db))?;
        let replayed = [&opened.older[..], &opened.newer[..]].concat();
        let found = checked_position(&path, identity.as_ref(), &meta, &replayed)?;
        // Raise the floor to where the store is now (and write it for a
        // directory from before identity files existed).
        let identity = Identity {
            store_id: meta.store_id,
            floor_epoch: found.0,
            floor_counter: found.1,
        };
        identity.write(data_dir)?;
        // The older log's writes are folded again (whatever part of them
        // already is in redb), in the background.
        let mut frozen = Pending::default();
        frozen.absorb(&opened.older);
        let mut pending = Pending::default();
        pending.absorb(&opened.newer);
        let db = Arc::new(db);
        Ok(Self {
            folder: Folder::start(db.clone(), frozen)?,
            db,
            data_dir: data_dir.to_path_buf(),
            identity,
            poisoned: false,
            logs: opened.logs,
            pending,
        })
    }

    fn initialize(data_dir: &Path, log_len_bytes: u64) -> Result<Self, StoreError> {
        let path = Self::path_in(data_dir);
        let store_id = StoreId::random()?;
        write_new_store(&path, store_id, Epoch::FIRST)?;
        let identity = Identity {
            store_id,
            floor_epoch: Epoch::FIRST,
            floor_counter: 0,
        };
        let logs = Logs::create(data_dir, store_id, log_len_bytes)?;
        identity.write(data_dir)?;
        let db = Arc::new(open_db(&path)?);
        Ok(Self {
            folder: Folder::start(db.clone(), Pending::default())?,
            db,
            data_dir: data_dir.to_path_buf(),
            identity,
            poisoned: false,
            logs,
            pending: Pending::default(),
        })
    }

    /// Replaces whatever is in `data_dir` with an empty store whose tokens
    /// start in `epoch`, under a new store id. Leases are not carried over:
    /// after a restore every holder must acquire again. The new file is
    /// written beside the old one and renamed over it, then the identity is
    /// rewritten; a crash in between leaves a directory that refuses to start
    /// until the restore is run again.
    pub fn create_fresh(data_dir: &Path, epoch: Epoch) -> Result<(), StoreError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| StoreError::Io { path, source }
        };
        std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let tmp = data_dir.join(format!("{FILE_NAME}.restore-tmp"));
        let _ = std::fs::remove_file(&tmp);
        let store_id = StoreId::random()?;
        write_new_store(&tmp, store_id, epoch)?;
        let target = Self::path_in(data_dir);
        std::fs::rename(&tmp, &target).map_err(io(&target))?;
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(io(data_dir))?;
        // The old logs belong to the old store id: until they are replaced,
        // the directory refuses to open.
        Logs::create(data_dir, store_id, wal::LEN_BYTES_DEFAULT)?;
        Identity {
            store_id,
            floor_epoch: epoch,
            floor_counter: 0,
        }
        .write(data_dir)
    }

    /// The highest epoch the directory is known to have used, from the store
    /// if it can be read and from the identity file: what a restore must
    /// start above. `Ok(None)` for a directory that never held a store.
    /// A store that cannot be read is an error only when no identity file
    /// vouches for its epoch.
    pub fn peek_epoch(data_dir: &Path) -> Result<Option<Epoch>, StoreError> {
        // An unreadable identity file is only fatal when the store cannot
        // vouch for the epoch either.
        let (identity, identity_error) = match Identity::read(data_dir) {
            Ok(identity) => (identity, None),
            Err(e) => (None, Some(e)),
        };
        let path = Self::path_in(data_dir);
        let from_store = match file_state(&path)? {
            FileState::Present => {
                let read = open_db(&path).and_then(|db| contain_panics(&path, || read_meta(&db)));
                match (read, &identity) {
                    (Ok(meta), _) => Some(meta.epoch),
                    (Err(e @ StoreError::InUse { .. }), _) => return Err(e),
                    (Err(_), Some(_)) => None,
                    (Err(e), None) => return Err(e),
                }
            }
            FileState::Empty if identity.is_none() => {
                return Err(StoreError::StoreLost {
                    path: path.display().to_string(),
                    state: "empty",
                    data_dir: data_dir.display().to_string(),
                    floor_epoch: 1,
                })
            }
            _ => None,
        };
        match (from_store, identity_error) {
            (None, Some(e)) => Err(e),
            _ => Ok(from_store.max(identity.map(|i| i.floor_epoch))),
        }
    }
}

/// A store file missing or empty in a directory that served before is
/// lost, not new: starting would issue tokens again from epoch 1.
fn refuse_lost(
    data_dir: &Path,
    path: &Path,
    identity: Option<&Identity>,
    state: FileState,
) -> Result<(), StoreError> {
    if state == FileState::Present {
        return Ok(());
    }
    Err(StoreError::StoreLost {
        path: path.display().to_string(),
        state: if state == FileState::Empty {
            "empty"
        } else {
            "missing"
        },
        data_dir: data_dir.display().to_string(),
        floor_epoch: identity.map_or(1, |i| i.floor_epoch.get()),
    })
}

/// Where the tokens are: redb's position, moved on by the log; refused if
/// it is below the floor the directory's identity recorded (an older copy
/// of the store).
fn checked_position(
    path: &Path,
    identity: Option<&Identity>,
    meta: &Meta,
    replayed: &[Write],
) -> Result<(Epoch, u64), StoreError> {
    let found = replayed
        .iter()
        .rev()
        .find_map(|w| match w {
            Write::Tokens { epoch, counter } => Some((*epoch, *counter)),
            _ => None,
        })
        .unwrap_or((meta.epoch, meta.counter));
    if let Some(identity) = identity {
        if found < identity.floor() {
            return Err(StoreError::BehindFloor {
                path: path.display().to_string(),
                found: position(found),
                floor: position(identity.floor()),
            });
        }
    }
    Ok(found)
}

impl RedbStore {
    /// Folds both logs into redb and starts them again: for an epoch
    /// change (whose floor is raised only once redb holds it) and for a
    /// commit bigger than a log.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.folder.wait_idle()?;
        let writes = self.pending.drain();
        write_to_redb(&self.db, &writes)?;
        self.logs.restart_both()
    }

    /// The active log is full: once the background fold has the other
    /// wholly in redb, commits go on in that one, and this one is folded.
    fn rotate(&mut self) -> Result<(), StoreError> {
        self.folder.wait_idle()?;
        self.logs.rotate()?;
        self.folder.hand_over(std::mem::take(&mut self.pending));
        Ok(())
    }

    /// One commit: appended to the active log (the other one first if this
    /// one is full), or, when the epoch changes, folded into redb with
    /// everything pending. Returns the new epoch, if any.
    fn commit_logged(&mut self, writes: &[Write]) -> Result<Option<Epoch>, StoreError> {
        if let Some(e) = self.folder.failure() {
            return Err(e);
        }
        let floor = self.identity.floor_epoch;
        let new_epoch = writes.iter().find_map(|w| match w {
            Write::Tokens { epoch, .. } if *epoch > floor => Some(*epoch),
            _ => None,
        });
        let payload = wal::encode(writes);
        if new_epoch.is_none() {
            if !self.logs.active().fits(payload.len()) && !self.logs.active().is_empty() {
                self.rotate()?;
            }
            if self.logs.active().fits(payload.len()) {
                self.logs.active().append(&payload)?;
                self.pending.absorb(writes);
                return Ok(None);
            }
        }
        self.pending.absorb(writes);
        self.checkpoint()?;
        Ok(new_epoch)
    }
}

impl LeaseStore for RedbStore {
    fn load(&self) -> Result<Stored, StoreError> {
        let mut stored = None;
        self.load_with(&mut |loading| stored = Some(loading.read_all()))?;
        stored.expect("load_with hands the state over")
    }

    fn load_with(&self, take: &mut dyn FnMut(crate::Loading<'_>)) -> Result<(), StoreError> {
        self.load_with_inner(take)
    }

    fn ended(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        contain_panics(&Self::path_in(&self.data_dir), || self.ended_inner())
    }

    fn history(&self, n_max: usize) -> Result<crate::History, StoreError> {
        contain_panics(&Self::path_in(&self.data_dir), || self.history_inner(n_max))
    }

    /// Keys of the frozen log not yet folded into redb: zero unless a
    /// background fold is under way. Read without the fold's lock.
    fn fold_backlog(&self) -> Option<usize> {
        Some(self.folder.backlog())
    }

    fn snapshot(&mut self) -> Option<Result<crate::SnapshotRead, StoreError>> {
        if self.poisoned {
            return Some(Err(StoreError::PreviousIo));
        }
        let path = Self::path_in(&self.data_dir);
        Some(
            contain_panics(&path, || self.snapshot_inner())
                .map(|read| Box::new(move || contain_panics(&path, read)) as crate::SnapshotRead),
        )
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::PreviousIo);
        }
        // Any failure below may leave the file state unknown to us (for
        // example a failed fsync): stop trusting the handle.
        self.poisoned = true;
        let path = Self::path_in(&self.data_dir);
        let new_epoch = contain_panics(&path, || self.commit_logged(writes))?;
        if let Some(epoch) = new_epoch {
            // After the store's commit, so the floor is never above the store.
            self.identity.floor_epoch = epoch;
            self.identity.floor_counter = 0;
            self.identity.write(&self.data_dir)?;
        }
        self.poisoned = false;
        Ok(())
    }
}

mod ended;
mod fold;
mod format;
mod history;
mod load;
pub use load::apply;
mod logs;
mod write;
use format::*;
use write::write_to_redb;

#[cfg(test)]
mod tests;
