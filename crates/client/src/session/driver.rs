//! The task that owns a session's stream: it sends the heartbeats, keeps
//! the [`Deadline`] from their acknowledgements, matches answers to calls
//! by id, and resumes the session on a new stream when one breaks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::SessionId;
use baton_proto::v1::{self, session_request::Op, session_response::Body};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    connect, error_body, resume_request, revoked_leases, Call, Conn, Deadline, Health, Released,
    SessionState,
};
use crate::servers::redirect;
use crate::worker::Backoff;
use crate::{Client, ClientError};

/// The task that owns the stream.
pub(super) struct Driver {
    pub(super) abandon: CancellationToken,
    pub(super) client: Client,
    pub(super) id: SessionId,
    pub(super) ttl: Duration,
    /// Until when the session is held, from what the server acknowledged.
    pub(super) deadline: Deadline,
    pub(super) calls: mpsc::UnboundedReceiver<Call>,
    pub(super) state: watch::Sender<SessionState>,
    pub(super) pending: HashMap<u64, oneshot::Sender<Result<Body, ClientError>>>,
    /// Heartbeats in flight, with their send instants.
    pub(super) heartbeats: HashMap<u64, Instant>,
    pub(super) released: Released,
    pub(super) next_heartbeat: u64,
}

/// Why serving one stream stopped.
enum Stop {
    /// The stream broke; resume on a new one.
    Broken(String),
    /// The session is over.
    Ended,
    /// Every handle was dropped; the session was closed.
    Dropped,
}

impl Driver {
    pub(super) async fn run(mut self, conn: Conn) {
        let abandon = self.abandon.clone();
        tokio::select! {
            biased;
            _ = abandon.cancelled() => {
                // As a crash would: no close, no more heartbeats.
                self.fail_pending(|| ClientError::Indeterminate("the session was abandoned".into()));
                self.state.send_modify(|s| s.health = Health::Ended);
            }
            _ = self.drive(conn) => {}
        }
    }

    async fn drive(&mut self, mut conn: Conn) {
        loop {
            match self.serve(&mut conn).await {
                Stop::Broken(why) => {
                    tracing::info!(%why, "session stream broke; resuming");
                    self.fail_pending(|| {
                        ClientError::Indeterminate(format!("the session's stream broke: {why}"))
                    });
                    self.state.send_modify(|s| s.health = Health::Reconnecting);
                    match self.resume().await {
                        Some(c) => conn = c,
                        None => return self.end(),
                    }
                }
                Stop::Ended => return self.end(),
                Stop::Dropped => return,
            }
        }
    }

    fn end(&mut self) {
        self.fail_pending(|| ClientError::SessionEnded);
        self.state.send_modify(|s| s.health = Health::Ended);
        self.calls.close();
        while let Ok(call) = self.calls.try_recv() {
            if let Some(reply) = call.reply {
                let _ = reply.send(Err(ClientError::SessionEnded));
            }
        }
    }

    /// How long a heartbeat may go unanswered before the stream counts as broken.
    fn silence_limit(&self) -> Duration {
        (self.ttl / 6).max(Duration::from_millis(50))
    }

    fn fail_pending(&mut self, error: impl Fn() -> ClientError) {
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(error()));
        }
        self.heartbeats.clear();
    }

    /// Reconnects and resumes until the server answers, backing off
    /// between tries. `None` once the server says the session ended (or
    /// every handle was dropped meanwhile).
    async fn resume(&mut self) -> Option<Conn> {
        let interval = self.ttl / 3;
        let mut backoff = Backoff::new(
            Duration::from_millis(20),
            interval.max(Duration::from_millis(100)),
        );
        loop {
            if self.calls.is_closed() {
                return None;
            }
            let sent = Instant::now();
            match connect(&self.client, resume_request(self.id)).await {
                Ok((conn, Body::Opened(o))) => {
                    self.acknowledge(sent, o.ttl_ms, o.revoked);
                    return Some(conn);
                }
                Ok((_, Body::Ended(_))) => return None,
                Ok((_, other)) => tracing::warn!(?other, "unexpected answer to a resume"),
                // Refused (e.g. the principal's rules changed): retried
                // until the session expires, but said louder.
                Err(e @ (ClientError::PermissionDenied(_) | ClientError::Unauthenticated(_))) => {
                    tracing::warn!(error = %e, "resuming the session was refused; retrying")
                }
                Err(e) => tracing::debug!(error = %e, "resuming the session failed; retrying"),
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    fn acknowledge(&mut self, sent: Instant, ttl_ms: u64, revoked: Vec<v1::RevokedLease>) {
        let moved = self
            .deadline
            .acknowledged(sent, Instant::now(), Duration::from_millis(ttl_ms));
        let deadline = self.deadline;
        let released = std::mem::take(&mut *self.released.lock().expect("session mutex"));
        self.state.send_modify(|s| {
            if moved {
                s.server_deadline = deadline.server_deadline();
                s.safe_until = deadline.safe_until();
            }
            s.beats += 1;
            s.health = Health::Live;
            if !revoked.is_empty() || !released.is_empty() {
                let mut all = (*s.revoked).clone();
                all.retain(|(_, t)| !released.contains(t));
                all.extend(revoked_leases(revoked));
                s.revoked = Arc::new(all);
            }
        });
    }

    async fn serve(&mut self, conn: &mut Conn) -> Stop {
        let interval = self.ttl / 3;
        let mut next_beat = Instant::now() + interval;
        loop {
            let silent_at = self
                .heartbeats
                .values()
                .min()
                .map(|sent| *sent + self.silence_limit());
            tokio::select! {
                message = conn.rx.message() => match message {
                    Ok(Some(response)) => {
                        if let Some(stop) = self.on_response(response) {
                            return stop;
                        }
                    }
                    Ok(None) => return Stop::Broken("the server ended the stream".into()),
                    Err(status) => {
                        if let Some(leader) = redirect(&status).filter(|l| !l.is_empty()) {
                            self.client.servers.switch_to(&leader);
                        }
                        return Stop::Broken(status.message().to_string());
                    }
                },
                call = self.calls.recv() => match call {
                    // The caller gave up before its turn (timed out while the
                    // stream was down): never send what nobody waits for.
                    Some(call) if call.reply.as_ref().is_some_and(|r| r.is_closed()) => {}
                    Some(call) => {
                        let request = v1::SessionRequest { id: call.id, op: Some(call.op), traceparent: call.traceparent };
                        if let Some(reply) = call.reply {
                            self.pending.insert(call.id, reply);
                        }
                        if conn.tx.send(request).await.is_err() {
                            return Stop::Broken("the stream closed".into());
                        }
                    }
                    None if self.abandon.is_cancelled() => return Stop::Dropped,
                    None => {
                        // Every handle is gone: close the session, best effort.
                        let close = v1::SessionRequest { id: 0, op: Some(Op::Close(v1::CloseSession {})), traceparent: String::new() };
                        let _ = conn.tx.send(close).await;
                        let _ = tokio::time::timeout(self.client.rpc_timeout, conn.rx.message()).await;
                        return Stop::Dropped;
                    }
                },
                // A heartbeat unanswered for a sixth of the TTL (answers take
                // milliseconds): the server is stopped or cut off though the
                // connection stands. Resume, starting with another server.
                _ = tokio::time::sleep_until(silent_at.unwrap_or(next_beat)), if silent_at.is_some() => {
                    let url = self.client.current_server();
                    self.client.servers.rotate(&url);
                    return Stop::Broken(format!(
                        "no answer to a heartbeat within {} ms from {url}",
                        self.silence_limit().as_millis()
                    ));
                }
                _ = tokio::time::sleep_until(next_beat) => {
                    next_beat += interval;
                    let id = self.next_heartbeat;
                    self.next_heartbeat += 1;
                    self.heartbeats.insert(id, Instant::now());
                    let beat = v1::SessionRequest { id, op: Some(Op::Heartbeat(v1::Heartbeat {})), traceparent: String::new() };
                    if conn.tx.send(beat).await.is_err() {
                        return Stop::Broken("the stream closed".into());
                    }
                }
            }
        }
    }

    fn on_response(&mut self, response: v1::SessionResponse) -> Option<Stop> {
        let body = response.body?;
        if let Some(sent) = self.heartbeats.remove(&response.id) {
            return match body {
                Body::Heartbeat(ack) => {
                    self.acknowledge(sent, ack.remaining_ms, ack.revoked);
                    None
                }
                Body::Ended(_) => Some(Stop::Ended),
                Body::Error(e) => {
                    let error = error_body(e);
                    tracing::warn!(%error, "a heartbeat was refused; it did not keep the session alive");
                    crate::observe::renewal_failed("heartbeat_refused");
                    None
                }
                other => {
                    tracing::warn!(?other, "unexpected answer to a heartbeat");
                    None
                }
            };
        }
        let ended = matches!(body, Body::Ended(_) | Body::Closed(_));
        if let Some(reply) = self.pending.remove(&response.id) {
            let _ = reply.send(Ok(body));
        }
        ended.then_some(Stop::Ended)
    }
}
