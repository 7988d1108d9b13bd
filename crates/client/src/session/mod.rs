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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::{AcquisitionId, FencingToken, SessionId};
use baton_proto::v1::{self, session_request::Op, session_response::Body};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::Instrument;

mod deadline;
mod driver;

pub use deadline::Deadline;
use driver::Driver;

use crate::worker::Renewer;
use crate::{
    from_status, release, renewal, Acquired, AcquiredAll, Client, ClientError, Release, Renewal,
};

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
    /// Leases tied to this session, by acquisition id, with their tokens.
    bound: Mutex<HashMap<AcquisitionId, FencingToken>>,
    /// Revoked leases released since: the driver drops them from
    /// [`SessionState::revoked`] (so a long-lived session's list does not
    /// grow with every fence).
    released: Released,
    abandon: CancellationToken,
    /// The description its acquires carry: its client's.
    holder: Option<String>,
}

type Released = Arc<Mutex<Vec<FencingToken>>>;

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
        .call(open, Duration::ZERO, |mut channel, request| async move {
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
            let stream =
                tonic::Request::from_parts(metadata, Default::default(), ReceiverStream::new(rx));
            match tokio::time::timeout(timeout, channel.session(stream)).await {
                Ok(answer) => answer.map(|r| r.map(|stream| (tx, stream))),
                Err(_) => Err(tonic::Status::deadline_exceeded(
                    "no answer to opening the session in time",
                )),
            }
        })
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

/// Sends a cancel for a waiting acquire if its future is dropped first.
struct CancelOnDrop<'a> {
    session: &'a Session,
    acquire_id: Option<u64>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(acquire_id) = self.acquire_id {
            let id = self.session.inner.next_id.fetch_add(1, Relaxed);
            let _ = self.session.inner.calls.send(Call {
                id,
                traceparent: String::new(),
                op: Op::Cancel(v1::CancelWait { acquire_id }),
                reply: None,
            });
        }
    }
}

impl Session {
    /// The session id (a secret: it resumes the session).
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The session TTL the server granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The session's state now.
    pub fn state(&self) -> SessionState {
        self.inner.state.borrow().clone()
    }

    /// A receiver that sees every change of the session's state.
    pub fn watch(&self) -> watch::Receiver<SessionState> {
        self.inner.state.clone()
    }

    async fn request(&self, id: u64, op: Op, extra: Duration) -> Result<Body, ClientError> {
        if self.inner.state.borrow().health == Health::Ended {
            return Err(ClientError::SessionEnded);
        }
        let (tx, rx) = oneshot::channel();
        let call = Call {
            id,
            op,
            traceparent: baton_telemetry::traceparent().unwrap_or_default(),
            reply: Some(tx),
        };
        if self.inner.calls.send(call).is_err() {
            return Err(ClientError::SessionEnded);
        }
        let timeout = self.inner.rpc_timeout + extra;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(Body::Error(e)))) => Err(error_body(e)),
            Ok(Ok(Ok(Body::Ended(_)))) => Err(ClientError::SessionEnded),
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(ClientError::Indeterminate(
                "the session stopped before the answer came".into(),
            )),
            Err(_) => Err(ClientError::Indeterminate(format!(
                "no answer on the session within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// Acquires one resource, tied to the session (no renewals: it lives
    /// while the session does). `wait` of zero tries once.
    pub async fn acquire(&self, resource: &str, wait: Duration) -> Result<Acquired, ClientError> {
        Acquired::from_all(self.acquire_all(&[resource], wait).await?)
    }

    /// Acquires every resource or none, tied to the session.
    pub async fn acquire_all(
        &self,
        resources: &[&str],
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        self.acquire_inner(resources, None, wait).await
    }

    /// Acquires every resource or none, each lease with its own `ttl` (to
    /// be renewed), on the session's stream.
    pub async fn acquire_with_ttl(
        &self,
        resources: &[&str],
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        if ttl.is_zero() {
            return Err(ClientError::Invalid(
                "ttl must be above zero; use acquire_all for leases tied to the session".into(),
            ));
        }
        self.acquire_inner(resources, Some(ttl), wait).await
    }

    async fn acquire_inner(
        &self,
        resources: &[&str],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let span = crate::observe::span("acquire", resources);
        let started = Instant::now();
        let answer = self
            .acquire_on_stream(resources, ttl, wait)
            .instrument(span.clone())
            .await;
        crate::observe::acquired(&span, &answer, started.elapsed());
        answer
    }

    async fn acquire_on_stream(
        &self,
        resources: &[&str],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let ttl_ms = match ttl {
            Some(t) => Some(crate::millis(t, "ttl")?.max(1)),
            None => None,
        };
        let op = Op::Acquire(v1::SessionAcquire {
            resources: resources.iter().map(|r| r.to_string()).collect(),
            ttl_ms,
            wait_ms: crate::millis(wait, "wait")?,
            holder: self.inner.holder.clone(),
        });
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        let mut guard = CancelOnDrop {
            session: self,
            acquire_id: (!wait.is_zero()).then_some(id),
        };
        let sent = Instant::now();
        let body = self.request(id, op, wait).await;
        if !matches!(body, Err(ClientError::Indeterminate(_))) {
            guard.acquire_id = None;
        }
        let answer = match body? {
            Body::Acquire(a) => a,
            other => return Err(unexpected(&other)),
        };
        let mut out = crate::acquired_all(answer, resources.len(), sent)?;
        if let (AcquiredAll::Granted { leases, .. }, None) = (&mut out, ttl) {
            // A lease tied to the session ends with it. The server counts
            // the acquire as a heartbeat (held a session TTL from the send,
            // as `acquired_all` set), and heartbeats kept the session
            // moving while the acquire waited in line: the later of the two.
            let session_deadline = self.inner.state.borrow().server_deadline;
            let mut bound = self.inner.bound.lock().expect("session mutex");
            for l in leases {
                l.valid_until = l.valid_until.max(session_deadline);
                bound.insert(l.acquisition_id, l.token);
            }
        }
        Ok(out)
    }

    /// Renews a lease with its own TTL; for a lease tied to the session this
    /// is a heartbeat of the whole session.
    pub async fn renew(
        &self,
        resource: &str,
        acquisition_id: &AcquisitionId,
    ) -> Result<Renewal, ClientError> {
        let op = Op::Renew(v1::RenewRequest {
            resource: resource.to_string(),
            acquisition_id: acquisition_id.as_bytes().to_vec(),
        });
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        let sent = Instant::now();
        let span = crate::observe::span("renew", &[resource]);
        match self
            .request(id, op, Duration::ZERO)
            .instrument(span)
            .await?
        {
            Body::Renew(r) => renewal(r, sent),
            other => Err(unexpected(&other)),
        }
    }

    /// Releases a lease (tied to the session or not).
    pub async fn release(
        &self,
        resource: &str,
        acquisition_id: &AcquisitionId,
    ) -> Result<Release, ClientError> {
        let op = Op::Release(v1::ReleaseRequest {
            resource: resource.to_string(),
            acquisition_id: acquisition_id.as_bytes().to_vec(),
        });
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        let span = crate::observe::span("release", &[resource]);
        let out = match self
            .request(id, op, Duration::ZERO)
            .instrument(span)
            .await?
        {
            Body::Release(r) => release(r),
            other => Err(unexpected(&other)),
        };
        if out.is_ok() {
            let token = self
                .inner
                .bound
                .lock()
                .expect("session mutex")
                .remove(acquisition_id);
            let revoked = |t| self.inner.state.borrow().revoked.iter().any(|r| r.1 == t);
            if let Some(t) = token.filter(|t| revoked(*t)) {
                self.inner.released.lock().expect("session mutex").push(t);
            }
        }
        out
    }

    /// Ends the session: its leases are released and its waiters
    /// withdrawn. `false` if it had already ended. With auth on, the
    /// principal needs `lease` on every resource the session holds
    /// ([`ClientError::PermissionDenied`] otherwise, and nothing changes).
    pub async fn close(&self) -> Result<bool, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        match self
            .request(id, Op::Close(v1::CloseSession {}), Duration::ZERO)
            .await
        {
            Ok(Body::Closed(c)) => Ok(c.was_open),
            Ok(other) => Err(unexpected(&other)),
            Err(ClientError::SessionEnded) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Stops heartbeats and drops the stream without closing the session,
    /// as a crashed process would: the server ends the session and its
    /// leases one TTL after the last heartbeat it received. For drills and
    /// tests; [`Session::close`] is the orderly way out.
    pub fn abandon(&self) {
        self.inner.abandon.cancel();
    }

    /// For a lease tied to the session: waits for the next acknowledged
    /// heartbeat and reports the session's deadline as the lease's. The
    /// remaining time counts from this call, which is no earlier than the
    /// caller's send time, so the caller's deadline is never later than
    /// the server's.
    async fn follow_heartbeat(&self, id: &AcquisitionId) -> Result<Renewal, ClientError> {
        let called = Instant::now();
        let mut state = self.inner.state.clone();
        let beats = state.borrow().beats;
        loop {
            {
                let s = state.borrow_and_update();
                let token = self
                    .inner
                    .bound
                    .lock()
                    .expect("session mutex")
                    .get(id)
                    .copied();
                let Some(token) = token else {
                    return Ok(Renewal::NotOwner);
                };
                if s.revoked.iter().any(|(_, t)| *t == token) {
                    return Ok(Renewal::NotOwner);
                }
                match s.health {
                    Health::Ended => return Ok(Renewal::NotOwner),
                    Health::Reconnecting => {
                        return Err(ClientError::Indeterminate(
                            "the session's stream broke; it is being resumed".into(),
                        ))
                    }
                    Health::Live if s.beats > beats => {
                        return Ok(Renewal::Renewed {
                            token,
                            remaining: s.server_deadline.saturating_duration_since(called),
                            valid_until: s.server_deadline,
                        })
                    }
                    Health::Live => {}
                }
            }
            if state.changed().await.is_err() {
                return Err(ClientError::Indeterminate("the session stopped".into()));
            }
        }
    }
}

/// A keeper over a session follows the session's heartbeats for a lease
/// tied to it (no renewal of its own) and renews any other lease on the
/// stream.
impl Renewer for Session {
    async fn renew(&mut self, resource: &str, id: &AcquisitionId) -> Result<Renewal, ClientError> {
        let bound = self
            .inner
            .bound
            .lock()
            .expect("session mutex")
            .contains_key(id);
        if bound {
            self.follow_heartbeat(id).await
        } else {
            Session::renew(self, resource, id).await
        }
    }
}
