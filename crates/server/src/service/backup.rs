//! Backups: a view of the store taken in step order and read off the
//! engine's lock and threads, sent whole (`Backup`) or in parts
//! (`BackupParts`, encoded one part at a time, so that no tokio worker
//! spends tens of milliseconds on one 50 MB message).

use baton_proto::v1;
use baton_store::SnapshotRead;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert::snapshot_parts;
use super::LeaseService;
use crate::engine::Command;

/// Parts in flight to the client before the reader waits.
const PARTS_AHEAD: usize = 4;

/// The stream of a `BackupParts` answer.
pub(crate) type BackupPartsStream = ReceiverStream<Result<v1::Snapshot, Status>>;

fn failed(e: impl std::fmt::Display) -> Status {
    Status::internal(format!("backup: {e}"))
}

impl LeaseService {
    /// A view of the store for a backup, taken after every change so far
    /// is durable; a store without one has its table copied instead.
    pub(super) async fn backup_view(&self) -> Result<SnapshotRead, Status> {
        match self
            .call_blocking(|reply| Command::Snapshot { reply })
            .await?
        {
            Some(view) => view.map_err(failed),
            None => {
                let stored = self
                    .call_blocking(|reply| Command::CopyTable { reply })
                    .await?;
                Ok(Box::new(move || Ok(stored)))
            }
        }
    }
}

/// Runs `read` on a thread of its own at the lowest CPU priority (nice
/// 19, Linux's per-thread nice): on a busy machine the lease calls' threads
/// go first, and the backup takes longer instead.
fn on_reader_thread(read: impl FnOnce() + Send + 'static) -> Result<(), Status> {
    std::thread::Builder::new()
        .name("baton-backup".into())
        .spawn(move || {
            // On Linux a thread id names this thread alone. A failure
            // leaves the default priority.
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
            read()
        })
        .map(drop)
        .map_err(failed)
}

/// Reads `view` and converts it whole, on a reader thread.
pub(super) async fn whole(view: SnapshotRead) -> Result<v1::Snapshot, Status> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    on_reader_thread(move || {
        let whole = view().map_err(failed).map(|stored| {
            let mut parts = snapshot_parts(stored, usize::MAX);
            parts.next().expect("the first part is always there")
        });
        let _ = tx.send(whole);
    })?;
    rx.await.map_err(failed)?
}

/// Reads `view` on a reader thread and sends it in parts; the reader
/// stops when the client goes.
pub(super) fn in_parts(view: SnapshotRead) -> Result<BackupPartsStream, Status> {
    let (tx, rx) = mpsc::channel(PARTS_AHEAD);
    on_reader_thread(move || {
        let stored = match view() {
            Ok(stored) => stored,
            Err(e) => {
                let _ = tx.blocking_send(Err(failed(e)));
                return;
            }
        };
        for part in snapshot_parts(stored, baton_proto::BACKUP_PART_LEASES) {
            if tx.blocking_send(Ok(part)).is_err() {
                return;
            }
        }
    })?;
    Ok(ReceiverStream::new(rx))
}
