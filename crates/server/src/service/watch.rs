//! The `Watch` stream: let in by the gate (`read` on the prefix), the
//! engine's snapshot and registration (see `crate::watch`), then one task
//! that forwards the watcher's events and ends the stream with a status
//! that says what to do next.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_proto::v1::{self, watch_response::Body};
use baton_proto::wire::{encode_event, EncodedWatchResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::LeaseService;
use crate::access::Action;
use crate::cluster::seat::Seat;
use crate::engine::watch::{Begin, Published, Refused, WatchEvent, WatchStart, WATCH_QUEUE_LEN};

/// Answers are encoded before they are queued: a live event's bytes are
/// shared by every watcher of it (`baton_proto::wire`).
pub type WatchStream = ReceiverStream<Result<EncodedWatchResponse, Status>>;

/// Holders per snapshot message.
const SNAPSHOT_CHUNK_LEN: usize = 1_000;
/// Messages buffered towards the client before the forwarder waits (the
/// watcher's own queue in the engine takes the rest, then it is cut off).
const OUTBOX_LEN: usize = 16;
/// Most events in one message: whatever queued up while the client read
/// the last one goes out together (fewer, larger frames).
const EVENTS_PER_MESSAGE_MAX: usize = 512;

impl LeaseService {
    pub(super) async fn watch_stream(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let who = self.gate.let_in_request(&request, Action::Watch).await?;
        let request = request.into_inner();
        let (start, quota) = self
            .watch_op(&who, (request.prefix, request.after_seq))
            .await?;
        let (tx, rx) = mpsc::channel(OUTBOX_LEN);
        let forwarder = Forwarder {
            _quota: quota,
            tx,
            seat: self.seat.clone(),
            closing: self.closing.clone(),
        };
        tokio::spawn(forwarder.run(start));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Forwarder {
    /// Counts the watch against its watches quotas while it runs.
    _quota: crate::quota::WatchGuard,
    tx: mpsc::Sender<Result<EncodedWatchResponse, Status>>,
    seat: Arc<Seat>,
    closing: tokio_util::sync::CancellationToken,
}

impl Forwarder {
    async fn run(self, start: WatchStart) {
        let WatchStart {
            seq,
            begin,
            mut events,
            cut_off,
        } = start;
        let begun = match begin {
            Begin::Snapshot(holders) => self.snapshot(seq, &holders).await,
            Begin::Replay(changes) => self.replay(changes).await,
        };
        if !begun {
            return;
        }
        loop {
            tokio::select! {
                _ = self.closing.cancelled() => {
                    let status = Status::unavailable(
                        "the server is shutting down: resume with after_seq (the last number read) on another server or after the restart",
                    );
                    let _ = self.tx.send(Err(status)).await;
                    return;
                }
                _ = self.tx.closed() => return,
                event = events.recv() => match event {
                    Some(e) => {
                        let mut batch = vec![e];
                        while batch.len() < EVENTS_PER_MESSAGE_MAX {
                            match events.try_recv() {
                                Ok(e) => batch.push(e),
                                Err(_) => break,
                            }
                        }
                        if !self.send(shared_events(&batch)).await {
                            return;
                        }
                    }
                    None => {
                        let _ = self.tx.send(Err(self.ended(cut_off.load(Ordering::Acquire)))).await;
                        return;
                    }
                },
            }
        }
    }

    /// The holders at `seq`, in messages of [`SNAPSHOT_CHUNK_LEN`].
    async fn snapshot(&self, seq: u64, holders: &[baton_core::LeaseStatus]) -> bool {
        let n_chunks = holders.len().div_ceil(SNAPSHOT_CHUNK_LEN).max(1);
        let mut chunks = holders.chunks(SNAPSHOT_CHUNK_LEN);
        for i in 0..n_chunks {
            let chunk = chunks.next().unwrap_or_default();
            let snapshot = v1::WatchSnapshot {
                seq,
                holders: chunk.iter().flat_map(holders_of).collect(),
                complete: i + 1 == n_chunks,
            };
            if !self.send(Body::Snapshot(snapshot).into()).await {
                return false;
            }
        }
        true
    }

    /// A resumed watch's kept changes, in messages of
    /// [`EVENTS_PER_MESSAGE_MAX`].
    async fn replay(&self, changes: Vec<WatchEvent>) -> bool {
        let mut changes = changes.into_iter().peekable();
        while changes.peek().is_some() {
            let events = changes
                .by_ref()
                .take(EVENTS_PER_MESSAGE_MAX)
                .map(|e| event_message(&e))
                .collect();
            if !self
                .send(Body::Events(v1::WatchEvents { events }).into())
                .await
            {
                return false;
            }
        }
        true
    }

    async fn send(&self, message: EncodedWatchResponse) -> bool {
        self.tx.send(Ok(message)).await.is_ok()
    }

    /// Why the watcher's queue closed, and what to do.
    fn ended(&self, cut_off: bool) -> Status {
        if cut_off {
            return Status::resource_exhausted(format!(
                "this watcher fell behind by more than {WATCH_QUEUE_LEN} events and was cut off: resume with after_seq (the last number it read), or watch again from a new snapshot"
            ));
        }
        match self.seat.term() {
            // A follower's answer names the leader (metadata `baton-leader`).
            Err(not_leader) => {
                let message = "this server stopped leading: resume on the leader with after_seq (the last number read)";
                Status::with_metadata(
                    tonic::Code::Unavailable,
                    message,
                    not_leader.metadata().clone(),
                )
            }
            Ok(_) => Status::unavailable(
                "the lease state this watch followed was reloaded (a restart or a new term): resume with after_seq (the last number read)",
            ),
        }
    }
}

/// The status of a watch that cannot resume from its number.
pub(super) fn refused_resume(refused: Refused) -> Status {
    match refused {
        Refused::TooOld { after, oldest } => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert(
                OLDEST_SEQ_METADATA,
                oldest.to_string().parse().expect("digits are ASCII"),
            );
            Status::with_metadata(
                tonic::Code::OutOfRange,
                format!(
                    "after_seq {after} is older than the changes this server keeps (the oldest number a watch resumes from is {oldest}): watch again without after_seq, from a new snapshot"
                ),
                metadata,
            )
        }
        Refused::Future { after, last } => Status::invalid_argument(format!(
            "after_seq {after} is above the last change ({last}): a watch resumes from a number this cluster sent (an event's or a snapshot's seq)"
        )),
    }
}

/// The metadata of an OUT_OF_RANGE watch: the oldest number a watch
/// resumes from.
pub const OLDEST_SEQ_METADATA: &str = "baton-oldest-seq";

/// A resource's holders in a snapshot: its exclusive holder (or the
/// resource alone, when only waiters are there), or each shared holder or
/// permit with its slot.
fn holders_of(s: &baton_core::LeaseStatus) -> Vec<v1::WatchHolder> {
    if s.slots.is_empty() {
        return vec![v1::WatchHolder {
            resource: s.resource.to_string(),
            token: s.holder_token.map_or(0, |t| t.get()),
            remaining_ms: s.remaining_ms,
            n_waiters: s.n_waiters as u64,
            holder: s.holder.as_ref().map(|h| h.to_string()).unwrap_or_default(),
            slot: None,
        }];
    }
    s.slots
        .iter()
        .map(|x| v1::WatchHolder {
            resource: s.resource.to_string(),
            token: x.token.get(),
            remaining_ms: x.remaining_ms,
            n_waiters: s.n_waiters as u64,
            holder: x.holder.as_ref().map(|h| h.to_string()).unwrap_or_default(),
            slot: Some(x.slot),
        })
        .collect()
}

/// Live events in one answer, each encoded once for all its watchers.
fn shared_events(batch: &[Arc<Published>]) -> EncodedWatchResponse {
    let encoded = |e: &WatchEvent| encode_event(&event_message(e));
    EncodedWatchResponse::events(batch.iter().map(|p| &p.encoded(encoded)[..]))
}

fn event_message(numbered: &WatchEvent) -> v1::WatchEvent {
    use baton_core::HolderChange;
    use v1::watch_event::Kind;
    let (seq, e) = (numbered.seq, &numbered.change);
    let kind = match e.kind {
        HolderChange::Granted => Kind::Granted,
        HolderChange::HandedOff => Kind::HandedOff,
        HolderChange::Released => Kind::Released,
        HolderChange::Expired => Kind::Expired,
        HolderChange::Fenced => Kind::Fenced,
    };
    v1::WatchEvent {
        seq,
        kind: kind.into(),
        resource: e.resource.clone(),
        token: e.token.get(),
        revoked_token: e.revoked.map_or(0, |t| t.get()),
        holder: e.holder.as_ref().map(|h| h.to_string()).unwrap_or_default(),
        slot: e.slot,
    }
}
