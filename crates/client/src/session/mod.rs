//! Sessions: one stream per client, one heartbeat for many leases.
//!
//! A [`Session`] owns one `Session` stream to the leader. A task sends a
//! heartbeat every TTL/3 and keeps the session's *safe until* deadline: the
//! instant the last acknowledged heartbeat was **sent**, plus the session
//! TTL, minus a margin. The server extended the session when it received
//! that heartbeat, which was no earlier, so the deadline is never later than
//! the server could expire the session.
//!
//! When the stream breaks, requests in flight fail as indeterminate and the
//! task reconnects (to the leader, following redirects) and resumes the
//! session; its leases are untouched while the session lives. When the
//! server answers that the session ended, every later call fails with
//! [`ClientError::SessionEnded`]. Dropping the last handle closes the
//! session (its leases are released); [`Session::close`] does it and waits.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::{AcquisitionId, FencingToken, SessionId};
use baton_proto::v1::{self, session_request::Op, session_response::Body};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

mod calls;
mod driver;

pub use crate::deadline::Deadline;
use driver::Driver;

use crate::{from_status, Client, ClientError};

/// Requests buffered towards the server before a sender waits.
const OUTBOX_LEN: usize = 1_024;
/// Ids of the driver's own heartbeats; callers' ids count up from 1.
const HEARTBEAT_ID_BIT: u64 = 1 << 63;

/// How the session's stream is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// The stream is up and heartbeats are acknowledged.
    Live,
    /// The stream broke; the session is being resumed. Its leases are held
    /// until [`SessionState::safe_until`] at least.
    Reconnecting,
    /// The server answered that the session is over (expired or closed),
    /// or it was closed here: every lease tied to it has ended.
    Ended,
}

/// What a session knows about itself, published on every change.
#[derive(Clone, Debug)]
pub struct SessionState {
    /// Stream health.
    pub health: Health,
    /// The session (and every lease tied to it) is held at least until
    /// then: the last acknowledged heartbeat's send time plus the TTL,
    /// minus the margin.
    pub safe_until: Instant,
    /// The same without the margin: the earliest instant the server could
    /// expire the session.
    pub server_deadline: Instant,
    /// Acknowledged heartbeats so far.
    pub beats: u64,
    /// Leases tied to the session that an operator fenced, by token, until
    /// they are released on this handle.
    pub revoked: Arc<Vec<(String, FencingToken)>>,
}

struct Call {
    id: u64,
    op: Op,
    /// The W3C trace context of the caller's span (empty: none).
    traceparent: String,
    reply: Option<oneshot::Sender<Result<Body, ClientError>>>,
}

struct Inner {
    id: SessionId,
    ttl: Duration,
    rpc_timeout: Duration,
    calls: mpsc::UnboundedSender<Call>,
    state: watch::Receiver<SessionState>,
    next_id: AtomicU64,
    /// Leases tied to this session, by acquisition id.
    bound: Mutex<HashMap<AcquisitionId, Bound>>,
    /// Revoked leases released since: the driver drops them from
    /// [`SessionState::revoked`] (so a long-lived session's list does not
    /// grow with every fence).
    released: Released,
    abandon: CancellationToken,
    /// The description its acquires carry: its client's.
    holder: Option<String>,
}

type Released = Arc<Mutex<Vec<FencingToken>>>;

/// A lease tied to the session: its token, and the session deadline last
/// reported for it to a keeper ([`Session`] as a `Renewer`).
struct Bound {
    token: FencingToken,
    reported: Instant,
}

/// A session: one stream, one heartbeat, many leases. Cheap to clone;
/// clones share the stream. See the module docs.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

struct Conn {
    tx: mpsc::Sender<v1::SessionRequest>,
    rx: Streaming<v1::SessionResponse>,
}

/// Opens a stream to the leader with `open` as its first request; returns
/// the stream and the answer to `open`.
async fn connect(client: &Client, open: v1::OpenSession) -> Result<(Conn, Body), ClientError> {
    let timeout = client.rpc_timeout;
    let (tx, rx) = client
        .call(
            open,
            Duration::ZERO,
            crate::Kind::Effect,
            |mut channel, request| async move {
                let (tx, rx) = mpsc::channel(OUTBOX_LEN);
                let first = v1::SessionRequest {
                    id: 0,
                    op: Some(Op::Open(request.get_ref().clone())),
                    traceparent: String::new(),
                };
                tx.send(first).await.expect("the receiver is here");
                // The call's metadata (the token) goes with the stream, but no
                // deadline: the stream lives on; only its opening is timed.
                let (mut metadata, _, _) = request.into_parts();
                metadata.remove("grpc-timeout");
                let stream = tonic::Request::from_parts(
                    metadata,
                    Default::default(),
                    ReceiverStream::new(rx),
                );
                match tokio::time::timeout(timeout, channel.session(stream)).await {
                    Ok(answer) => answer.map(|r| r.map(|stream| (tx, stream))),
                    Err(_) => Err(tonic::Status::deadline_exceeded(
                        "no answer to opening the session in time",
                    )),
                }
            },
        )
        .await?;
    let mut conn = Conn { tx, rx };
    let first = match conn.rx.message().await {
        Ok(Some(v1::SessionResponse { body: Some(b), .. })) => b,
        Ok(_) => {
            return Err(ClientError::Protocol(
                "the session stream ended at once".into(),
            ))
        }
        Err(status) => return Err(from_status(status)),
    };
    Ok((conn, first))
}

fn error_body(e: v1::RequestError) -> ClientError {
    match tonic::Code::from(e.code) {
        tonic::Code::InvalidArgument => ClientError::Invalid(e.message),
        tonic::Code::ResourceExhausted => ClientError::Exhausted(e.message),
        tonic::Code::Unauthenticated => ClientError::Unauthenticated(e.message),
        tonic::Code::PermissionDenied => ClientError::PermissionDenied(e.message),
        code => ClientError::Protocol(format!("{code:?}: {}", e.message)),
    }
}

/// The first request of a stream that resumes session `id`.
fn resume_request(id: SessionId) -> v1::OpenSession {
    v1::OpenSession {
        ttl_ms: None,
        resume: id.as_bytes().to_vec(),
        // This client writes and reads one message per request.
        batches: false,
    }
}

fn revoked_leases(revoked: Vec<v1::RevokedLease>) -> Vec<(String, FencingToken)> {
    revoked
        .into_iter()
        .filter_map(|r| Some((r.resource, FencingToken::from_u64(r.token).ok()?)))
        .collect()
}

fn unexpected(body: &Body) -> ClientError {
    ClientError::Protocol(format!("unexpected answer on the session stream: {body:?}"))
}

impl Client {
    /// Opens a session with `ttl` on the leader. Without a heartbeat for
    /// `ttl` the server ends the session and every lease tied to it.
    pub async fn open_session(&self, ttl: Duration) -> Result<Session, ClientError> {
        self.start_session(v1::OpenSession {
            ttl_ms: crate::optional_millis(ttl, "session ttl")?,
            resume: Vec::new(),
            batches: false,
        })
        .await
    }

    /// Resumes an open session by its id, from this process or another
    /// (the session's own handle resumes by itself after a broken stream).
    /// The new handle keeps the session alive and can renew, release and
    /// close; it does not know which leases the session holds. With auth
    /// on, the caller needs `lease` on every resource the session holds
    /// ([`ClientError::PermissionDenied`] otherwise, and nothing changes).
    /// [`ClientError::SessionEnded`] if the session expired or was closed.
    pub async fn resume_session(&self, id: SessionId) -> Result<Session, ClientError> {
        self.start_session(resume_request(id)).await
    }

    async fn start_session(&self, open: v1::OpenSession) -> Result<Session, ClientError> {
        let sent = Instant::now();
        let (conn, body) = connect(self, open).await?;
        let opened = match body {
            Body::Opened(o) => o,
            Body::Ended(_) => return Err(ClientError::SessionEnded),
            Body::Error(e) => return Err(error_body(e)),
            other => return Err(unexpected(&other)),
        };
        let id = SessionId::from_slice(&opened.session_id)
            .ok_or_else(|| ClientError::Protocol("session id is not 16 bytes".into()))?;
        let ttl = Duration::from_millis(opened.ttl_ms);
        let deadline = Deadline::opened(sent, ttl);
        let state = SessionState {
            health: Health::Live,
            safe_until: deadline.safe_until(),
            server_deadline: deadline.server_deadline(),
            beats: 0,
            revoked: Arc::new(revoked_leases(opened.revoked)),
        };
        let (state_tx, state_rx) = watch::channel(state);
        let (calls_tx, calls_rx) = mpsc::unbounded_channel();
        let abandon = CancellationToken::new();
        let released = Released::default();
        let driver = Driver {
            abandon: abandon.clone(),
            // Not `self`: the driver must not keep the shared sessions alive.
            // A resume attempt gives up after a sixth of the TTL (at least
            // 200 ms), so a stopped server does not eat the session's TTL.
            client: Client {
                servers: self.servers.clone(),
                authorization: self.authorization.clone(),
                rpc_timeout: self
                    .rpc_timeout
                    .min((ttl / 6).max(Duration::from_millis(200))),
                sessions: Default::default(),
                watching: Default::default(),
                holder: None,
            },
            id,
            ttl,
            deadline,
            calls: calls_rx,
            state: state_tx,
            pending: HashMap::new(),
            heartbeats: HashMap::new(),
            released: released.clone(),
            next_heartbeat: HEARTBEAT_ID_BIT,
        };
        tokio::spawn(driver.run(conn));
        Ok(Session {
            inner: Arc::new(Inner {
                id,
                ttl,
                rpc_timeout: self.rpc_timeout,
                calls: calls_tx,
                state: state_rx,
                next_id: AtomicU64::new(1),
                bound: Mutex::new(HashMap::new()),
                released,
                abandon,
                holder: self.holder.as_ref().map(|h| h.to_string()),
            }),
        })
    }

    /// The session this client shares among its clones for `ttl`, opened
    /// on first use and again after one ended. The worker runtime uses it.
    pub async fn session(&self, ttl: Duration) -> Result<Session, ClientError> {
        let key = ttl.as_millis() as u64;
        let mut sessions = self.sessions.lock().await;
        if let Some(s) = sessions.get(&key) {
            if s.state().health != Health::Ended {
                return Ok(s.clone());
            }
        }
        let s = self.open_session(ttl).await?;
        sessions.insert(key, s.clone());
        Ok(s)
    }
}
