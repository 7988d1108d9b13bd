//! Watching holder changes under a prefix: a snapshot of the holders at a
//! sequence number, then every later change, in commit order, with no gap.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton_client::ClientError> {
//! use baton_client::WatchUpdate;
//! let client = baton_client::Client::connect("http://127.0.0.1:7700").await?;
//! let mut watch = client.watch("statement:").await?;
//! for h in &watch.holders {
//!     println!("{} held by token {}", h.resource, h.token);
//! }
//! loop {
//!     match watch.next().await? {
//!         WatchUpdate::Changed(e) => {
//!             println!("{} {:?} {} token {}", e.seq, e.kind, e.resource, e.token)
//!         }
//!         WatchUpdate::Resnapshot { seq, holders } => {
//!             println!("away too long: {} holders at {seq}", holders.len())
//!         }
//!         _ => {}
//!     }
//! }
//! # }
//! ```
//!
//! A client's watches share connections of their own, apart from its lease
//! calls. A watch resumes by itself after the last number it returned when
//! its stream ends (a restart, a new leader, a broken connection, falling
//! too far behind), following the leader, for up to [`RESUME_FOR`]
//! without an answer; when the server no longer keeps the changes since
//! then, it takes a new snapshot and says so
//! ([`WatchUpdate::Resnapshot`]). [`Watch::once`] turns that off: the
//! stream's end is then [`ClientError::WatchEnded`] (or
//! [`ClientError::Exhausted`] when this watcher fell too far behind).

use std::collections::VecDeque;
use std::time::Duration;

use baton_core::FencingToken;
use baton_proto::v1::{self, watch_response::Body};
use tonic::{Code, Streaming};

use crate::{from_status, token, Client, ClientError};

/// A holder in a watch's snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchHolder {
    /// The canonical name.
    pub resource: String,
    /// The holder's token.
    pub token: FencingToken,
    /// Time left on the lease when the snapshot was taken.
    pub remaining: Duration,
    /// Requests waiting in line then.
    pub n_waiters: u64,
    /// The holder's description, if it gave one.
    pub holder: Option<String>,
}

/// What changed: the lease table's own kinds of holder change.
pub use baton_core::HolderChange as WatchKind;

/// One change of holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// Above the snapshot's and every earlier event's (events of other
    /// prefixes take the numbers in between).
    pub seq: u64,
    /// What changed.
    pub kind: WatchKind,
    /// The canonical name.
    pub resource: String,
    /// The lease's token; for a fence, the fence's.
    pub token: FencingToken,
    /// For a fence: the revoked lease's token, if one was held.
    pub revoked: Option<FencingToken>,
    /// The description of the holder the change concerns (the new holder
    /// of a grant, the one that lost the lease otherwise), if it gave one.
    pub holder: Option<String>,
}

/// What [`Watch::next`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchUpdate {
    /// One change, numbered above every one before it.
    Changed(WatchEvent),
    /// The watch resumed after the server had dropped the changes since
    /// the last one returned (it was away longer than the server keeps
    /// them): these are the holders now, at `seq`, and what changed in
    /// between is not told.
    Resnapshot {
        /// The new snapshot's number.
        seq: u64,
        /// The holders at `seq`, in name order.
        holders: Vec<WatchHolder>,
    },
}

impl WatchUpdate {
    /// The change, if this is one (`None` for a new snapshot).
    pub fn changed(self) -> Option<WatchEvent> {
        match self {
            WatchUpdate::Changed(e) => Some(e),
            WatchUpdate::Resnapshot { .. } => None,
        }
    }
}

/// How long a watch tries to resume without an answer before it gives up
/// and returns the last failure.
pub const RESUME_FOR: Duration = Duration::from_secs(60);

/// An open watch: the snapshot, then [`Watch::next`] for each change.
pub struct Watch {
    /// The snapshot's sequence number (a resumed watch's: the number it
    /// resumed after).
    pub seq: u64,
    /// The holders at `seq`, in name order (none for a resumed watch).
    pub holders: Vec<WatchHolder>,
    prefix: String,
    /// The last number returned (or the snapshot's).
    last_seq: u64,
    /// `None` between a stream's end and its resumption.
    stream: Option<Streaming<v1::WatchResponse>>,
    /// Events received but not returned yet.
    pending: VecDeque<WatchEvent>,
    /// Resume when the stream ends ([`Watch::once`] turns it off).
    resume: bool,
    /// The watch's own connection, kept open while it is read.
    connection: Client,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("seq", &self.seq)
            .field("last_seq", &self.last_seq)
            .field("holders", &self.holders.len())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// The last number returned, or the snapshot's: a watch started again
    /// with [`Client::watch_after`] from it misses nothing.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Never resume: the stream's end is an error, as it was before
    /// watches resumed (`baton watch --once`).
    pub fn once(mut self) -> Self {
        self.resume = false;
        self
    }

    /// The next change, or a new snapshot after a resumption the server
    /// no longer had the changes for. Returns an error only for a failure
    /// a resumption does not mend (a refusal, a protocol break, no answer
    /// for [`RESUME_FOR`]), or any end of the stream after [`Watch::once`].
    pub async fn next(&mut self) -> Result<WatchUpdate, ClientError> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                self.last_seq = e.seq;
                return Ok(WatchUpdate::Changed(e));
            }
            let failure = match self.stream.as_mut() {
                Some(stream) => match stream.message().await {
                    Ok(Some(v1::WatchResponse {
                        body: Some(Body::Events(batch)),
                    })) => {
                        for e in batch.events {
                            let e = event(e)?;
                            // A resumption never repeats one, but a server
                            // must not be able to make this one do so.
                            if e.seq > self.last_seq {
                                self.pending.push_back(e);
                            }
                        }
                        continue;
                    }
                    Ok(Some(other)) => {
                        return Err(ClientError::Protocol(format!(
                            "unexpected message on a watch after its snapshot: {other:?}"
                        )))
                    }
                    Ok(None) => ClientError::WatchEnded(
                        "the server ended the stream without a status".into(),
                    ),
                    Err(status) => ended(status),
                },
                None => ClientError::WatchEnded("not resumed".into()),
            };
            self.stream = None;
            if !self.resume || !mended_by_resuming(&failure) {
                return Err(failure);
            }
            if let Some(update) = self.reopen().await? {
                return Ok(update);
            }
        }
    }

    /// Opens the stream again after the last number returned, on whichever
    /// member leads, retrying for up to [`RESUME_FOR`]; a new snapshot if
    /// the server no longer keeps the changes since then.
    async fn reopen(&mut self) -> Result<Option<WatchUpdate>, ClientError> {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let failure = match open(&self.connection, &self.prefix, Some(self.last_seq)).await {
                Ok((stream, _)) => {
                    self.stream = Some(stream);
                    return Ok(None);
                }
                Err(ClientError::WatchTooOld { .. }) => {
                    match open(&self.connection, &self.prefix, None).await {
                        Ok((stream, (seq, holders))) => {
                            self.stream = Some(stream);
                            self.last_seq = seq;
                            return Ok(Some(WatchUpdate::Resnapshot { seq, holders }));
                        }
                        Err(e) if mended_by_resuming(&e) => e,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if mended_by_resuming(&e) => e,
                Err(e) => return Err(e),
            };
            if started.elapsed() >= RESUME_FOR {
                return Err(failure);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// Whether a watch that ended so may resume: its stream ended or its
/// connection broke, or it fell behind; never a refusal.
fn mended_by_resuming(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::WatchEnded(_)
            | ClientError::Exhausted(_)
            | ClientError::Indeterminate(_)
            | ClientError::Connect { .. }
    )
}

fn ended(status: tonic::Status) -> ClientError {
    // The watch has a connection of its own: when this process read too
    // slowly, its HTTP/2 layer ends that connection (h2's guard against
    // floods of small frames), which is this watcher falling behind.
    let chain = std::error::Error::source(&status).map(crate::error_chain);
    if chain.is_some_and(|c| c.contains("too_many_data_frames")) {
        return ClientError::Exhausted(
            "this watcher fell behind (it read too slowly and its connection's buffer of unread events filled): watch again, from a new snapshot".into(),
        );
    }
    match status.code() {
        Code::Unavailable | Code::Cancelled | Code::Unknown => {
            ClientError::WatchEnded(status.message().to_string())
        }
        _ => from_status(status),
    }
}

fn event(e: v1::WatchEvent) -> Result<WatchEvent, ClientError> {
    use v1::watch_event::Kind;
    let kind = match e.kind() {
        Kind::Granted => WatchKind::Granted,
        Kind::HandedOff => WatchKind::HandedOff,
        Kind::Released => WatchKind::Released,
        Kind::Expired => WatchKind::Expired,
        Kind::Fenced => WatchKind::Fenced,
        Kind::Unspecified => {
            return Err(ClientError::Protocol(format!(
                "watch event {} without a kind",
                e.seq
            )))
        }
    };
    Ok(WatchEvent {
        seq: e.seq,
        kind,
        token: token(e.token)?,
        revoked: crate::optional_token(e.revoked_token)?,
        resource: e.resource,
        holder: (!e.holder.is_empty()).then_some(e.holder),
    })
}

impl Client {
    /// Watches every change of holder under `prefix` ("" for all): the
    /// snapshot is read before this returns. Needs `read` on the prefix.
    pub async fn watch(&self, prefix: &str) -> Result<Watch, ClientError> {
        // A connection of its own: a watcher that reads slowly must not
        // hold up, or bring down, the lease calls of this client.
        let connection = self.with_own_connection();
        let (stream, (seq, holders)) = open(&connection, prefix, None).await?;
        Ok(Watch::new(connection, prefix, stream, seq, holders))
    }

    /// Watches every change under `prefix` after the one numbered
    /// `after_seq` (a number this cluster sent, kept from an earlier
    /// watch): no snapshot, no gap, no duplicate. A number older than the
    /// changes the server keeps is [`ClientError::WatchTooOld`] (watch
    /// again from a snapshot); one above the last change is
    /// [`ClientError::Invalid`].
    pub async fn watch_after(&self, prefix: &str, after_seq: u64) -> Result<Watch, ClientError> {
        let connection = self.with_own_connection();
        let (stream, _) = open(&connection, prefix, Some(after_seq)).await?;
        Ok(Watch::new(
            connection,
            prefix,
            stream,
            after_seq,
            Vec::new(),
        ))
    }
}

impl Watch {
    fn new(
        connection: Client,
        prefix: &str,
        stream: Streaming<v1::WatchResponse>,
        seq: u64,
        holders: Vec<WatchHolder>,
    ) -> Self {
        Watch {
            seq,
            holders,
            prefix: prefix.to_string(),
            last_seq: seq,
            stream: Some(stream),
            pending: VecDeque::new(),
            resume: true,
            connection,
        }
    }
}

/// A snapshot's number and holders.
type Snapshot = (u64, Vec<WatchHolder>);

/// Starts a watch of `prefix` on `connection` (following the leader):
/// after `after` (its stream, nothing read yet), or from a snapshot, read
/// before this returns.
async fn open(
    connection: &Client,
    prefix: &str,
    after: Option<u64>,
) -> Result<(Streaming<v1::WatchResponse>, Snapshot), ClientError> {
    let message = v1::WatchRequest {
        prefix: prefix.to_string(),
        after_seq: after,
    };
    let timeout = connection.rpc_timeout;
    let mut stream = connection
        .call(
            message,
            Duration::ZERO,
            crate::Kind::Read,
            |mut c, request| async move {
                // The stream lives on: no deadline on it, only on its start.
                let (mut metadata, extensions, message) = request.into_parts();
                metadata.remove("grpc-timeout");
                let request = tonic::Request::from_parts(metadata, extensions, message);
                match tokio::time::timeout(timeout, c.watch(request)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(tonic::Status::deadline_exceeded(
                        "no answer to the watch in time",
                    )),
                }
            },
        )
        .await?;
    if let Some(after) = after {
        return Ok((stream, (after, Vec::new())));
    }
    let mut holders = Vec::new();
    loop {
        let snapshot = match tokio::time::timeout(timeout, stream.message()).await {
            Ok(Ok(Some(v1::WatchResponse {
                body: Some(Body::Snapshot(s)),
            }))) => s,
            Ok(Ok(other)) => {
                return Err(ClientError::Protocol(format!(
                    "a watch must start with its snapshot, not {other:?}"
                )))
            }
            Ok(Err(status)) => return Err(ended(status)),
            Err(_) => {
                return Err(ClientError::Indeterminate(format!(
                    "the watch's snapshot did not come within {} ms",
                    timeout.as_millis()
                )))
            }
        };
        for h in snapshot.holders {
            holders.push(WatchHolder {
                token: token(h.token)?,
                remaining: Duration::from_millis(h.remaining_ms),
                n_waiters: h.n_waiters,
                resource: h.resource,
                holder: (!h.holder.is_empty()).then_some(h.holder),
            });
        }
        if snapshot.complete {
            return Ok((stream, (snapshot.seq, holders)));
        }
    }
}
