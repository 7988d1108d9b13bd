//! Each request on a session stream: admitted by the gate, handed to the
//! engine, its answer the future kept in flight.

use std::sync::Arc;

use baton_core::Resumed;
use baton_proto::v1::{self, session_response::Body};
use tokio::sync::oneshot;
use tonic::Status;
use tracing::Instrument;

use super::{request_error, revoked, InFlight, SessionTask};
use crate::access::Action;
use crate::access::Admitted;
use crate::cluster::seat::Term;
use crate::engine::Command;
use crate::service::ops::{refused, AcquireAsk};
use crate::service::{
    acquire_error, acquire_outcome, answer, release_message, renew_message, trace, LeaseService,
    Readable,
};

impl SessionTask {
    /// A heartbeat. After a reload of the auth file it is judged like a
    /// resume, once per new table: a principal that lost `lease` on what
    /// the session holds cannot keep it alive, and the refusal ends the
    /// stream (see `finish`).
    pub(super) fn heartbeat(&mut self, id: u64) -> Result<InFlight, Status> {
        let who = self
            .service
            .gate
            .admit(&self.caller, Action::SessionHeartbeat)?;
        let reloaded = who
            .principal()
            .filter(|p| !self.kept_by.as_ref().is_some_and(|k| Arc::ptr_eq(k, p)))
            .cloned();
        let judge = reloaded.is_some();
        if let Some(principal) = reloaded {
            self.kept_by = Some(principal);
        }
        let (rx, refusal) = self
            .service
            .keep_alive_op(&who, &self.term, self.digest, judge)?;
        Ok(Box::pin(async move {
            let body = answer(rx).await.and_then(|kept| match kept {
                Resumed::Kept(kept) => Ok(Body::Heartbeat(v1::HeartbeatAck {
                    remaining_ms: kept.ttl_ms,
                    revoked: revoked(kept.revoked),
                })),
                Resumed::NotOpen => Ok(Body::Ended(v1::SessionEnded {})),
                Resumed::Refused => Err(refused(refusal)),
            });
            (id, body)
        }))
    }

    /// Closing releases the session's leases: only a principal that may
    /// hold all of them can (as for a resume).
    pub(super) fn close(&mut self, id: u64) -> Result<InFlight, Status> {
        let who = self
            .service
            .gate
            .admit(&self.caller, Action::SessionClose)?;
        let (rx, refusal) = self
            .service
            .close_session_op(&who, &self.term, self.digest)?;
        Ok(Box::pin(async move {
            let body = answer(rx).await.map(|closed| match closed {
                Some(was_open) => Body::Closed(v1::SessionClosed { was_open }),
                None => request_error(&refusal.status()),
            });
            (id, body)
        }))
    }

    /// A renew or a release: its span, the caller let in, the operation
    /// started (`start`), and its answer as a message (`body`).
    fn holder_call<T: Send + 'static>(
        &mut self,
        id: u64,
        (op, action): (&'static str, Action),
        (raw_resource, raw_id): (&String, &[u8]),
        traceparent: &str,
        start: impl FnOnce(
            &LeaseService,
            &Admitted<'_>,
            &Term,
            &str,
            &[u8],
        ) -> Result<oneshot::Receiver<T>, Status>,
        body: impl FnOnce(T) -> Body + Send + 'static,
    ) -> Result<InFlight, Status> {
        let span = trace::request_span(op, std::slice::from_ref(raw_resource), traceparent);
        let who = self.service.gate.admit(&self.caller, action)?;
        let rx = start(&self.service, &who, &self.term, raw_resource, raw_id)?;
        Ok(Box::pin(
            async move { (id, answer(rx).await.map(body)) }.instrument(span),
        ))
    }

    pub(super) fn renew(
        &mut self,
        id: u64,
        r: v1::RenewRequest,
        traceparent: &str,
    ) -> Result<InFlight, Status> {
        self.holder_call(
            id,
            ("renew", Action::Renew),
            (&r.resource, &r.acquisition_id),
            traceparent,
            LeaseService::renew_op,
            |o| {
                let message = renew_message(o);
                trace::renewed(&tracing::Span::current(), &message);
                Body::Renew(message)
            },
        )
    }

    pub(super) fn release(
        &mut self,
        id: u64,
        r: v1::ReleaseRequest,
        traceparent: &str,
    ) -> Result<InFlight, Status> {
        self.holder_call(
            id,
            ("release", Action::Release),
            (&r.resource, &r.acquisition_id),
            traceparent,
            LeaseService::release_op,
            |o| {
                let message = release_message(o);
                trace::released(&tracing::Span::current(), &message);
                Body::Release(message)
            },
        )
    }

    /// Withdraws a waiting acquire of this stream, if it still waits.
    pub(super) fn cancel(&mut self, id: u64, c: v1::CancelWait) -> Result<InFlight, Status> {
        self.service
            .gate
            .admit(&self.caller, Action::SessionCancel)?;
        let withdrawn = match self.waits.get(&c.acquire_id) {
            Some(waiter) => {
                self.cancelled.insert(c.acquire_id);
                self.term
                    .engine
                    .send(Command::CancelWait { waiter: *waiter });
                true
            }
            None => false,
        };
        Ok(Box::pin(async move {
            (id, Ok(Body::Cancel(v1::CancelWaitResponse { withdrawn })))
        }))
    }

    pub(super) fn acquire(
        &mut self,
        id: u64,
        a: v1::SessionAcquire,
        traceparent: &str,
    ) -> Result<InFlight, Status> {
        let span = trace::request_span("acquire", &a.resources, traceparent);
        let who = self.service.gate.admit(&self.caller, Action::Acquire)?;
        let acquiring = self.service.acquire_op(
            &who,
            &self.term,
            AcquireAsk {
                resources: &a.resources,
                shapes: &a.shapes,
                request_id: &a.request_id,
                first_sent_ms_ago: a.first_sent_ms_ago,
                holder: a.holder.as_deref(),
                ttl_ms: a.ttl_ms,
                wait_ms: a.wait_ms,
                session: Some(self.digest),
            },
        )?;
        // No TTL of its own: the lease is tied to the session.
        let bound = a.ttl_ms.is_none();
        let readable = Readable::of(&who);
        if let Some(waiter) = acquiring.waiter {
            self.waits.insert(id, waiter);
        }
        Ok(Box::pin(
            async move {
                // A cancelled wait ends here too: the engine drops its
                // reply (see `finish`).
                let body = acquiring.answer().await.map(|out| match out {
                    Ok(reply) => {
                        trace::acquired(&tracing::Span::current(), &reply);
                        Body::Acquire(v1::AcquireResponse {
                            outcome: Some(acquire_outcome(reply, bound, &readable)),
                        })
                    }
                    Err(e) => request_error(&acquire_error(e)),
                });
                (id, body)
            }
            .instrument(span),
        ))
    }
}
