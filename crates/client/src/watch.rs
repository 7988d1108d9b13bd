//! Watching holder changes under a prefix: a snapshot of the holders at a
//! sequence number, then every later change, in commit order, with no gap.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton_client::ClientError> {
//! let client = baton_client::Client::connect("http://127.0.0.1:7700").await?;
//! let mut watch = client.watch("statement:").await?;
//! for h in &watch.holders {
//!     println!("{} held by token {}", h.resource, h.token);
//! }
//! while let Some(event) = watch.next().await? {
//!     println!("{} {:?} {} token {}", event.seq, event.kind, event.resource, event.token);
//! }
//! # Ok(()) }
//! ```
//!
//! A client's watches share connections of their own, apart from its lease
//! calls. The stream ends with [`ClientError::WatchEnded`] when the server
//! restarts, stops leading or shuts down, and with
//! [`ClientError::Exhausted`] when this watcher fell too far behind: in
//! both cases, watch again (from a new snapshot).

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

/// An open watch: the snapshot, then [`Watch::next`] for each change.
pub struct Watch {
    /// The snapshot's sequence number.
    pub seq: u64,
    /// The holders at `seq`, in name order.
    pub holders: Vec<WatchHolder>,
    stream: Streaming<v1::WatchResponse>,
    /// Events received but not returned yet.
    pending: std::collections::VecDeque<WatchEvent>,
    /// The watch's own connection, kept open while it is read.
    _connection: Client,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("seq", &self.seq)
            .field("holders", &self.holders.len())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// The next change; `Ok(None)` only if the server ended the stream
    /// without a status (it always gives one).
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        if let Some(e) = self.pending.pop_front() {
            return Ok(Some(e));
        }
        match self.stream.message().await {
            Ok(Some(v1::WatchResponse {
                body: Some(Body::Events(batch)),
            })) => {
                for e in batch.events {
                    self.pending.push_back(event(e)?);
                }
                Ok(self.pending.pop_front())
            }
            Ok(Some(other)) => Err(ClientError::Protocol(format!(
                "unexpected message on a watch after its snapshot: {other:?}"
            ))),
            Ok(None) => Ok(None),
            Err(status) => Err(ended(status)),
        }
    }
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
        let message = v1::WatchRequest {
            prefix: prefix.to_string(),
        };
        let timeout = self.rpc_timeout;
        // A connection of its own: a watcher that reads slowly must not
        // hold up, or bring down, the lease calls of this client.
        let connection = self.with_own_connection();
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
                return Ok(Watch {
                    seq: snapshot.seq,
                    holders,
                    stream,
                    pending: Default::default(),
                    _connection: connection,
                });
            }
        }
    }
}
