//! The gRPC service: decode and validate, hand to the engine, encode.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use baton_core::WaiterId;
use baton_proto::server::leases_server::Leases;
use baton_proto::v1;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::access::auth::Permission;
use crate::access::Action;
use crate::cluster::seat::{Seat, Term};
use crate::engine::{Command, EngineHandle};
use crate::metrics::Metrics;
use crate::quota::Quotas;

mod backup;
mod convert;
mod ops;
mod session;
mod trace;
mod watch;

use convert::{
    acquire_error, acquire_outcome, not_acquired, parse_acquisition_id, parse_claims, random_id,
    release_message, renew_message, status_message, Readable,
};
pub use convert::{parse_holder, parse_resource};
use ops::AcquireAsk;

use crate::access::{Caller, Gate};

#[derive(Clone)]
pub struct LeaseService {
    seat: Arc<Seat>,
    metrics: Arc<Metrics>,
    default_ttl_ms: u64,
    next_waiter: Arc<AtomicU64>,
    /// Cancelled when the server shuts down: session streams end.
    closing: tokio_util::sync::CancellationToken,
    gate: Gate,
    /// Rates and watches are counted here; the table counts the rest.
    quotas: Arc<Quotas>,
}

impl LeaseService {
    pub fn new(seat: Arc<Seat>, metrics: Arc<Metrics>, default_ttl_ms: u64) -> Self {
        Self {
            seat,
            default_ttl_ms,
            next_waiter: Arc::new(AtomicU64::new(1)),
            closing: Default::default(),
            gate: Gate::open(metrics.clone()),
            metrics,
            quotas: Arc::default(),
        }
    }

    /// Bounds every call by the quotas in force.
    pub(crate) fn with_quotas(mut self, quotas: Arc<Quotas>) -> Self {
        self.quotas = quotas;
        self
    }

    /// Lets every call in through `gate` (the server's one gatekeeper).
    pub(crate) fn guarded_by(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// Ends every session stream when `closing` is cancelled.
    pub fn closing_on(mut self, closing: tokio_util::sync::CancellationToken) -> Self {
        self.closing = closing;
        self
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, Status> {
        let term = self.seat.term()?;
        self.call_on(&term, make).await
    }

    /// [`LeaseService::call`] for a command that holds the engine for long
    /// (a snapshot copies every lease): applied on a blocking thread, so
    /// the tokio worker that took the call keeps serving.
    async fn call_blocking<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command + Send + 'static,
    ) -> Result<T, Status> {
        let term = self.seat.term()?;
        let (tx, rx) = oneshot::channel();
        let on = term.clone();
        tokio::task::spawn_blocking(move || send(&on, make(tx)))
            .await
            .map_err(|e| Status::internal(format!("the engine call failed: {e}")))??;
        self.answer_on(&term, rx).await
    }

    /// Sends a command to `term`'s engine; the answer goes out only if the
    /// term still leads (see `Seat::confirm`).
    async fn call_on<T>(
        &self,
        term: &Term,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        send(term, make(tx))?;
        self.answer_on(term, rx).await
    }

    /// The engine's answer, if `term` still leads.
    async fn answer_on<T>(&self, term: &Term, rx: oneshot::Receiver<T>) -> Result<T, Status> {
        let answer = answer(rx).await?;
        self.seat.confirm(term)?;
        Ok(answer)
    }
}

/// The unary lease calls, inside their spans (see `trace.rs`).
impl LeaseService {
    async fn acquire_traced(
        &self,
        request: Request<v1::AcquireRequest>,
        span: &tracing::Span,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::Acquire).await?;
        let req = request.into_inner();
        let term = self.seat.term()?;
        let acquiring = self.acquire_op(
            &who,
            &term,
            AcquireAsk {
                resources: &req.resources,
                shapes: &req.shapes,
                request_id: &req.request_id,
                first_sent_ms_ago: req.first_sent_ms_ago,
                holder: req.holder.as_deref(),
                ttl_ms: req.ttl_ms,
                wait_ms: req.wait_ms,
                session: None,
            },
        )?;
        let mut guard = WaitGuard {
            engine: &term.engine,
            waiter: acquiring.waiter,
        };
        let reply = acquiring.answer().await;
        guard.waiter = None;
        let reply = reply?;
        self.seat.confirm(&term)?;
        let reply = reply.map_err(acquire_error)?;
        trace::acquired(span, &reply);
        Ok(Response::new(v1::AcquireResponse {
            outcome: Some(acquire_outcome(reply, false, &Readable::of(&who))),
        }))
    }

    async fn renew_traced(
        &self,
        request: Request<v1::RenewRequest>,
        span: &tracing::Span,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::Renew).await?;
        let req = request.into_inner();
        let term = self.seat.term()?;
        let rx = self.renew_op(&who, &term, &req.resource, &req.acquisition_id)?;
        let message = renew_message(self.answer_on(&term, rx).await?);
        trace::renewed(span, &message);
        Ok(Response::new(message))
    }

    async fn release_traced(
        &self,
        request: Request<v1::ReleaseRequest>,
        span: &tracing::Span,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::Release).await?;
        let req = request.into_inner();
        let term = self.seat.term()?;
        let rx = self.release_op(&who, &term, &req.resource, &req.acquisition_id)?;
        let message = release_message(self.answer_on(&term, rx).await?);
        trace::released(span, &message);
        Ok(Response::new(message))
    }
}

/// Hands `command` to `term`'s engine; a definite error if it has stopped.
fn send(term: &Term, command: Command) -> Result<(), Status> {
    if term.engine.send(command) {
        Ok(())
    } else {
        Err(Status::unavailable(
            "the server is shutting down or its leadership just ended; nothing was done",
        ))
    }
}

/// The engine's answer, or the indeterminate error if it dropped the reply.
async fn answer<T>(rx: oneshot::Receiver<T>) -> Result<T, Status> {
    rx.await.map_err(|_| {
        Status::unavailable(
            "the server could not complete the operation; it may or may not have taken effect",
        )
    })
}

/// Withdraws a waiting request if its handler is dropped (the client went away).
struct WaitGuard<'a> {
    engine: &'a EngineHandle,
    waiter: Option<WaiterId>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter {
            self.engine.send(Command::CancelWait { waiter });
        }
    }
}

#[tonic::async_trait]
impl Leases for LeaseService {
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let span = trace::request_span(
            "acquire",
            &request.get_ref().resources,
            trace::traceparent_of(request.metadata()),
        );
        self.acquire_traced(request, &span)
            .instrument(span.clone())
            .await
    }

    async fn renew(
        &self,
        request: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let span = trace::request_span(
            "renew",
            std::slice::from_ref(&request.get_ref().resource),
            trace::traceparent_of(request.metadata()),
        );
        self.renew_traced(request, &span)
            .instrument(span.clone())
            .await
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let span = trace::request_span(
            "release",
            std::slice::from_ref(&request.get_ref().resource),
            trace::traceparent_of(request.metadata()),
        );
        self.release_traced(request, &span)
            .instrument(span.clone())
            .await
    }

    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::Status).await?;
        let out = self.status_op(&who, &request.into_inner().resource).await?;
        Ok(Response::new(status_message(out)))
    }

    async fn list(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::ListResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::List).await?;
        let req = request.into_inner();
        let out = self
            .list_op(&who, req.prefix, req.start_after, req.limit)
            .await?;
        Ok(Response::new(v1::ListResponse {
            entries: out.into_iter().map(status_message).collect(),
        }))
    }

    async fn fence(
        &self,
        request: Request<v1::FenceRequest>,
    ) -> Result<Response<v1::FenceResponse>, Status> {
        let who = self.gate.let_in_request(&request, Action::Fence).await?;
        let resource = parse_resource("resource", &request.into_inner().resource)?;
        let out = self.fence_as(&who, resource).await?;
        Ok(Response::new(v1::FenceResponse {
            token: out.token.get(),
            revoked: out.revoked.is_some(),
            revoked_token: out.revoked.map_or(0, |t| t.get()),
        }))
    }

    async fn set_permits(
        &self,
        request: Request<v1::SetPermitsRequest>,
    ) -> Result<Response<v1::SetPermitsResponse>, Status> {
        let who = self
            .gate
            .let_in_request(&request, Action::SetPermits)
            .await?;
        let request = request.into_inner();
        let resource = parse_resource("resource", &request.resource)?;
        let previous = self.set_permits_as(&who, resource, request.permits).await?;
        Ok(Response::new(v1::SetPermitsResponse { previous }))
    }

    async fn backup(
        &self,
        request: Request<v1::BackupRequest>,
    ) -> Result<Response<v1::Snapshot>, Status> {
        let who = self.gate.let_in_request(&request, Action::Backup).await?;
        who.may_everything(Permission::Admin)?;
        let snapshot = backup::whole(self.backup_view().await?).await?;
        who.audit("", None, "ok");
        Ok(Response::new(snapshot))
    }

    type BackupPartsStream = backup::BackupPartsStream;

    async fn backup_parts(
        &self,
        request: Request<v1::BackupRequest>,
    ) -> Result<Response<Self::BackupPartsStream>, Status> {
        let who = self.gate.let_in_request(&request, Action::Backup).await?;
        who.may_everything(Permission::Admin)?;
        let parts = backup::in_parts(self.backup_view().await?)?;
        who.audit("", None, "ok");
        Ok(Response::new(parts))
    }
    type SessionStream = session::SessionStream;
    type WatchStream = watch::WatchStream;

    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.watch_stream(request).await
    }

    async fn session(
        &self,
        request: Request<tonic::Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        self.session_stream(request).await
    }

    async fn cluster_status(
        &self,
        request: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        self.gate
            .let_in_request(&request, Action::ClusterStatus)
            .await?
            .may_everything(Permission::Admin)?;
        let role = if self.seat.is_leader() {
            "leader"
        } else {
            "follower"
        };
        let mut out = v1::ClusterStatusResponse {
            node: self.seat.node.clone(),
            role: role.into(),
            ..Default::default()
        };
        if let Some(v) = self.seat.view() {
            out.clustered = true;
            out.term = v.term;
            out.cluster = v.cluster;
            out.leader = v.leader.unwrap_or_default();
            out.members = v
                .members
                .into_iter()
                .map(|(node, advertise, seen_ms_ago)| v1::ClusterMember {
                    leader: v.leader_node.as_deref() == Some(node.as_str()),
                    node,
                    advertise,
                    seen_ms_ago,
                })
                .collect();
        }
        Ok(Response::new(out))
    }
}

#[cfg(test)]
mod fuzz {
    //! The server never panics on input: random bytes through the decoder,
    //! and random decoded requests through validation and the lease table.
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use prost::Message;

    fn service(tag: &str) -> (tokio::runtime::Runtime, LeaseService, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("baton-fuzz-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = baton_store::RedbStore::open(&dir).unwrap();
        let metrics = Arc::new(Metrics::default());
        let limits = baton_core::Limits {
            ttl_ms_min: 1,
            n_waiters_per_resource_max: 4,
            ..Default::default()
        };
        let (engine, _thread) = crate::engine::Engine::start(
            Box::new(store),
            crate::engine::Bounds {
                limits,
                ..crate::engine::Bounds::with_quotas(Arc::default())
            },
            metrics.clone(),
            Arc::default(),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (
            rt,
            LeaseService::new(
                {
                    let seat = Arc::new(Seat::single());
                    seat.lead(engine, 0, u64::MAX);
                    seat
                },
                metrics,
                30_000,
            ),
            dir,
        )
    }

    /// A status code the contract allows for a request the server could judge.
    fn allowed(s: &Status) -> bool {
        matches!(
            s.code(),
            tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
        )
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-c:]{0,6}",
            ".{0,20}",
            proptest::collection::vec(any::<char>(), 0..8).prop_map(|v| v.into_iter().collect()),
            (500..700usize).prop_map(|n| "z".repeat(n)),
        ]
    }

    #[test]
    fn random_requests_get_answers_never_panics() {
        let (rt, svc, dir) = service("requests");
        let mut runner = TestRunner::new(Config {
            cases: 512,
            ..Config::default()
        });
        let strategy = (
            proptest::collection::vec(name(), 0..4),
            prop_oneof![Just(0u64), any::<u64>(), 0..2_000u64],
            prop_oneof![Just(0u64), any::<u64>(), 1..30u64],
            proptest::collection::vec(any::<u8>(), 0..20),
            any::<u32>(),
        );
        runner
            .run(&strategy, |(resources, ttl_ms, wait_ms, id, limit)| {
                rt.block_on(async {
                    let first = resources.first().cloned().unwrap_or_default();
                    let acquire = svc
                        .acquire(Request::new(v1::AcquireRequest {
                            resources,
                            // Absent now and then (the default), else any
                            // value, a present 0 included.
                            ttl_ms: (ttl_ms % 7 != 3).then_some(ttl_ms),
                            wait_ms,
                            // Arbitrary text as a holder, now and then.
                            holder: (limit % 3 == 0)
                                .then(|| String::from_utf8_lossy(&id).repeat(limit as usize % 40)),
                            request_id: Vec::new(),
                            first_sent_ms_ago: None,
                            // Any shapes, of any count: shared, permits
                            // from 0 past the maximum, both at once.
                            shapes: id
                                .iter()
                                .take(limit as usize % 5)
                                .map(|b| v1::LockShape {
                                    shared: b & 1 == 1,
                                    permits: u32::from(*b >> 1) * (limit % 70),
                                })
                                .collect(),
                        }))
                        .await;
                    prop_assert!(acquire.as_ref().err().is_none_or(allowed), "{acquire:?}");
                    let renew = svc
                        .renew(Request::new(v1::RenewRequest {
                            resource: first.clone(),
                            acquisition_id: id.clone(),
                        }))
                        .await;
                    prop_assert!(renew.as_ref().err().is_none_or(allowed), "{renew:?}");
                    let release = svc
                        .release(Request::new(v1::ReleaseRequest {
                            resource: first.clone(),
                            acquisition_id: id,
                        }))
                        .await;
                    prop_assert!(release.as_ref().err().is_none_or(allowed), "{release:?}");
                    let list = svc
                        .list(Request::new(v1::ListRequest {
                            prefix: first.clone(),
                            start_after: first.clone(),
                            limit,
                        }))
                        .await;
                    prop_assert!(list.as_ref().err().is_none_or(allowed), "{list:?}");
                    let fence = svc
                        .fence(Request::new(v1::FenceRequest { resource: first }))
                        .await;
                    prop_assert!(fence.as_ref().err().is_none_or(allowed), "{fence:?}");
                    Ok(())
                })
            })
            .unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn random_bytes_through_the_decoder_never_panic() {
        let (rt, svc, dir) = service("bytes");
        let mut runner = TestRunner::new(Config {
            cases: 1_024,
            ..Config::default()
        });
        runner
            .run(&proptest::collection::vec(any::<u8>(), 0..256), |bytes| {
                rt.block_on(async {
                    if let Ok(r) = v1::AcquireRequest::decode(bytes.as_slice()) {
                        let r = v1::AcquireRequest {
                            wait_ms: r.wait_ms.min(5),
                            ..r
                        };
                        let out = svc.acquire(Request::new(r)).await;
                        prop_assert!(out.as_ref().err().is_none_or(allowed), "{out:?}");
                    }
                    if let Ok(r) = v1::RenewRequest::decode(bytes.as_slice()) {
                        let out = svc.renew(Request::new(r)).await;
                        prop_assert!(out.as_ref().err().is_none_or(allowed), "{out:?}");
                    }
                    if let Ok(r) = v1::ListRequest::decode(bytes.as_slice()) {
                        let out = svc.list(Request::new(r)).await;
                        prop_assert!(out.as_ref().err().is_none_or(allowed), "{out:?}");
                    }
                    Ok(())
                })
            })
            .unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
