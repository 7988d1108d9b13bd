//! A session's calls: acquire (waiting on the stream, withdrawn if the
//! caller goes away), renew, release, close, each a request on the stream
//! answered by id.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use baton_core::{AcquisitionId, SessionId, Shape};
use baton_proto::v1::{self, session_request::Op, session_response::Body};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::{error_body, unexpected, Call, Health, Session, SessionState};
use crate::worker::Renewer;
use crate::{release, renewal, Acquired, AcquiredAll, ClientError, Release, Renewal};

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
        let exclusive: Vec<_> = resources.iter().map(|r| (*r, Shape::Exclusive)).collect();
        self.acquire_inner(&exclusive, None, wait).await
    }

    /// Acquires every resource or none, each held as its [`Shape`] asks
    /// (see [`crate::Client::acquire_shaped`]): tied to the session, or
    /// with a `ttl` of its own.
    pub async fn acquire_shaped(
        &self,
        claims: &[(&str, Shape)],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(ClientError::Invalid(
                "ttl must be above zero; None ties the leases to the session".into(),
            ));
        }
        self.acquire_inner(claims, ttl, wait).await
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
        let exclusive: Vec<_> = resources.iter().map(|r| (*r, Shape::Exclusive)).collect();
        self.acquire_inner(&exclusive, Some(ttl), wait).await
    }

    async fn acquire_inner(
        &self,
        claims: &[(&str, Shape)],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let resources: Vec<&str> = claims.iter().map(|(r, _)| *r).collect();
        let span = crate::observe::span("acquire", &resources);
        let started = Instant::now();
        let answer = self
            .acquire_on_stream(claims, ttl, wait)
            .instrument(span.clone())
            .await;
        crate::observe::acquired(&span, &answer, started.elapsed());
        answer
    }

    async fn acquire_on_stream(
        &self,
        claims: &[(&str, Shape)],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let shapes = crate::wire_shapes(claims.iter().map(|(_, s)| *s))?;
        let resources: Vec<&str> = claims.iter().map(|(r, _)| *r).collect();
        let ttl_ms = match ttl {
            Some(t) => Some(crate::millis(t, "ttl")?.max(1)),
            None => None,
        };
        let wait_ms = crate::millis(wait, "wait")?;
        let request_id = crate::request_id();
        // Built again for a repeat (rare), not cloned for every first send.
        let message = |first_sent_ms_ago: Option<u64>| v1::SessionAcquire {
            resources: resources.iter().map(|r| r.to_string()).collect(),
            ttl_ms,
            wait_ms: wait_ms.saturating_sub(first_sent_ms_ago.unwrap_or(0)),
            holder: self.inner.holder.clone(),
            request_id: request_id.clone(),
            first_sent_ms_ago,
            shapes: shapes.clone(),
        };
        let mut first_sent_ms_ago = None;
        let mut guard = CancelOnDrop {
            session: self,
            acquire_id: None,
        };
        // A lease answered to a repeat counts from the first send too.
        let sent = Instant::now();
        let budget = self.inner.rpc_timeout + wait;
        let body = loop {
            let id = self.inner.next_id.fetch_add(1, Relaxed);
            let acquire = message(first_sent_ms_ago);
            guard.acquire_id = (acquire.wait_ms > 0).then_some(id);
            let left = budget.saturating_sub(sent.elapsed());
            let extra = left.saturating_sub(self.inner.rpc_timeout);
            let body = self.request(id, Op::Acquire(acquire), extra).await;
            match body {
                // The stream broke with the answer in flight: the same
                // request again once the session is resumed, marked as a
                // repeat, until the call's time is up.
                Err(ClientError::Indeterminate(_)) if sent.elapsed() < budget => {
                    first_sent_ms_ago = Some(crate::millis(sent.elapsed(), "elapsed")?.max(1));
                }
                body => break body,
            }
        };
        if !matches!(body, Err(ClientError::Indeterminate(_))) {
            guard.acquire_id = None;
        }
        let answer = match body? {
            Body::Acquire(a) => a,
            other => return Err(unexpected(&other)),
        };
        let mut out = crate::acquired_all(answer, resources.len(), sent)?;
        if let (AcquiredAll::Granted { leases, .. }, None) = (&mut out, ttl) {
            self.bind(leases);
        }
        Ok(out)
    }

    /// Leases tied to the session end with it. The server counts the
    /// acquire as a heartbeat (held a session TTL from the send, as
    /// `acquired_all` set), and heartbeats kept the session moving while
    /// the acquire waited in line: the later of the two.
    fn bind(&self, leases: &mut [crate::Lease]) {
        let session_deadline = self.inner.state.borrow().server_deadline;
        let mut bound = self.inner.bound.lock().expect("session mutex");
        for l in leases {
            l.valid_until = l.valid_until.max(session_deadline);
            let reported = l.valid_until;
            bound.insert(
                l.acquisition_id,
                super::Bound {
                    token: l.token,
                    reported,
                },
            );
        }
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
                .remove(acquisition_id)
                .map(|b| b.token);
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

    /// Asks the server to end the session without waiting for its answer,
    /// for a caller that must stop at once (after a loss, when the server
    /// may be out of reach): the request goes out if the stream is up when
    /// the session's task next runs, and is never repeated. The leases end
    /// with the session either way, at the latest one TTL after its last
    /// heartbeat.
    pub fn close_without_waiting(&self) {
        let id = self.inner.next_id.fetch_add(1, Relaxed);
        let _ = self.inner.calls.send(Call {
            id,
            op: Op::Close(v1::CloseSession {}),
            traceparent: String::new(),
            reply: None,
        });
    }

    /// Stops heartbeats and drops the stream without closing the session,
    /// as a crashed process would: the server ends the session and its
    /// leases one TTL after the last heartbeat it received. For drills and
    /// tests; [`Session::close`] is the orderly way out.
    pub fn abandon(&self) {
        self.inner.abandon.cancel();
    }

    /// For a lease tied to the session: the session's deadline, once it is
    /// later than the one last reported for this lease (at once if a
    /// heartbeat or a resume was acknowledged since, else at the next).
    /// Every acknowledgement reaches the keeper, however its renewals fall
    /// between them: one that came just before a renewal, or a resume's,
    /// is not skipped for the heartbeat after it. The remaining time counts
    /// from this call, which is no earlier than the caller's send time, so
    /// the caller's deadline is never later than the server's.
    async fn follow_heartbeat(&self, id: &AcquisitionId) -> Result<Renewal, ClientError> {
        let called = Instant::now();
        let mut state = self.inner.state.clone();
        loop {
            {
                let s = state.borrow_and_update();
                let mut bound = self.inner.bound.lock().expect("session mutex");
                let Some(lease) = bound.get_mut(id) else {
                    return Ok(Renewal::NotOwner);
                };
                let token = lease.token;
                if s.health == Health::Ended || s.revoked.iter().any(|(_, t)| *t == token) {
                    return Ok(Renewal::NotOwner);
                }
                if s.server_deadline > lease.reported {
                    lease.reported = s.server_deadline;
                    return Ok(Renewal::Renewed {
                        token,
                        remaining: s.server_deadline.saturating_duration_since(called),
                        valid_until: s.server_deadline,
                    });
                }
                if s.health == Health::Reconnecting {
                    return Err(ClientError::Indeterminate(
                        "the session's stream broke; it is being resumed".into(),
                    ));
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
