//! The session stream: many requests on one stream, answered by id.
//!
//! One task per stream reads requests, hands each to the engine and keeps
//! its answer in flight; answers go out as they come, each only if the term
//! that computed it still leads (as on the unary path). When the stream
//! breaks, the session's waiting acquires are withdrawn, but the session
//! itself lives on until its TTL runs out, so a client can resume it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_core::{SessionDigest, WaiterId};
use baton_proto::v1::{self, session_request::Op, session_response::Body};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

mod requests;

use super::ops::Opened;
use super::{Caller, LeaseService};
use crate::access::auth::Principal;
use crate::access::gate::Admitted;
use crate::access::Action;
use crate::cluster::seat::Term;
use crate::engine::Command;

/// What the stream returns to tonic.
pub type SessionStream = ReceiverStream<Result<v1::SessionResponse, Status>>;

/// Answers buffered towards a client that reads slowly, before the
/// session task waits for it.
const OUTBOX_LEN: usize = 1_024;

/// The most requests one `SessionRequest.batch` may hold.
const BATCH_MAX: usize = 256;

type Answer = Result<Body, Status>;
type InFlight = Pin<Box<dyn Future<Output = (u64, Answer)> + Send>>;

fn request_error(status: &Status) -> Body {
    Body::Error(v1::RequestError {
        code: status.code() as i32,
        message: status.message().to_string(),
    })
}

impl LeaseService {
    pub(super) async fn session_stream(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<SessionStream>, Status> {
        // Authenticated once here; each request is checked again against
        // the auth table in force when it arrives.
        let caller = Caller::of(&request, self.gate.is_on());
        let admitted = self.gate.let_in(&caller, Action::SessionOpen).await?;
        let term = self.seat.term()?;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("the stream ended before its `open` request")
        })?;
        let Some(Op::Open(open)) = first.op else {
            return Err(Status::invalid_argument(
                "the first request of a session stream must be `open`",
            ));
        };
        let (out, rx) = mpsc::channel(OUTBOX_LEN);
        let batches = open.batches;
        let (digest, body) = self.open(&term, &admitted, open).await?;
        let kept_by = admitted.principal().cloned();
        let ended = matches!(body, Body::Ended(_));
        let _ = out
            .send(Ok(v1::SessionResponse {
                id: first.id,
                body: Some(body),
            }))
            .await;
        if !ended {
            let stream = SessionTask {
                service: self.clone(),
                kept_by,
                caller,
                term,
                digest,
                out,
                batches,
                waits: HashMap::new(),
                cancelled: HashSet::new(),
                in_flight: HashSet::new(),
                pending: FuturesUnordered::new(),
            };
            tokio::spawn(stream.run(inbound));
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    /// Opens a new session or resumes one; the answer to `open`.
    async fn open(
        &self,
        term: &Term,
        admitted: &Admitted<'_>,
        open: v1::OpenSession,
    ) -> Result<(SessionDigest, Body), Status> {
        let (digest, opened) = self
            .open_session_op(admitted, term, &open.resume, open.ttl_ms)
            .await?;
        let body = match opened {
            Opened::New { id, ttl_ms } => Body::Opened(v1::SessionOpened {
                session_id: id.as_bytes().to_vec(),
                ttl_ms,
                resumed: false,
                revoked: Vec::new(),
                batches: true,
            }),
            Opened::Resumed { id, kept } => Body::Opened(v1::SessionOpened {
                session_id: id.as_bytes().to_vec(),
                ttl_ms: kept.ttl_ms,
                resumed: true,
                revoked: revoked(kept.revoked),
                batches: true,
            }),
            Opened::Ended => Body::Ended(v1::SessionEnded {}),
        };
        Ok((digest, body))
    }
}

struct SessionTask {
    service: LeaseService,
    caller: Caller,
    /// The principal (of the auth table then in force) whose rules last
    /// let this session be kept alive; `None` with auth off.
    kept_by: Option<Arc<Principal>>,
    term: Term,
    digest: SessionDigest,
    out: mpsc::Sender<Result<v1::SessionResponse, Status>>,
    /// The client reads `SessionResponse.batch`: answers ready together
    /// go out in one message.
    batches: bool,
    /// Acquires of this stream that may be waiting, by request id.
    waits: HashMap<u64, WaiterId>,
    /// Waiting acquires the client cancelled.
    cancelled: HashSet<u64>,
    /// Request ids not answered yet.
    in_flight: HashSet<u64>,
    pending: FuturesUnordered<InFlight>,
}

/// Whether the stream goes on after an answer.
enum Next {
    Continue,
    Stop,
}

impl SessionTask {
    async fn run(mut self, mut inbound: Streaming<v1::SessionRequest>) {
        let closing = self.service.closing.clone();
        loop {
            let next = tokio::select! {
                _ = closing.cancelled() => {
                    let status = Status::unavailable(
                        "the server is shutting down; the session lives on: resume it on another server or after the restart",
                    );
                    let _ = self.out.send(Err(status)).await;
                    Next::Stop
                }
                message = inbound.message() => match message {
                    Ok(Some(request)) => self.start(request).await,
                    // The client finished or the connection broke.
                    Ok(None) | Err(_) => Next::Stop,
                },
                Some(first) = self.pending.next(), if !self.pending.is_empty() => {
                    self.finish_ready(first).await
                }
            };
            if let Next::Stop = next {
                break;
            }
        }
        // The session lives on; only its waiters go (dropping their pending
        // answers hands any grant that raced with this back to the engine).
        for waiter in self.waits.values() {
            self.term
                .engine
                .send(Command::CancelWait { waiter: *waiter });
        }
    }

    /// Answers `id` with `body` (if the term still leads).
    async fn send(&mut self, id: u64, body: Body) -> Next {
        self.send_all(vec![v1::SessionResponse {
            id,
            body: Some(body),
        }])
        .await
    }

    /// Sends `answers` (if the term still leads): in one message to a
    /// client that reads batches, else one message each. An answer that
    /// ends the stream is the last.
    async fn send_all(&mut self, mut answers: Vec<v1::SessionResponse>) -> Next {
        if let Err(status) = self.service.seat.confirm(&self.term) {
            let _ = self.out.send(Err(status)).await;
            return Next::Stop;
        }
        let ends =
            |a: &v1::SessionResponse| matches!(a.body, Some(Body::Ended(_) | Body::Closed(_)));
        let stop = match answers.iter().position(ends) {
            Some(last) => {
                answers.truncate(last + 1);
                true
            }
            None => false,
        };
        let sent = if self.batches && answers.len() > 1 {
            let batch = Body::Batch(v1::SessionAnswers { answers });
            self.out
                .send(Ok(v1::SessionResponse {
                    id: 0,
                    body: Some(batch),
                }))
                .await
                .is_ok()
        } else {
            let mut sent = true;
            for answer in answers {
                sent = sent && self.out.send(Ok(answer)).await.is_ok();
            }
            sent
        };
        if stop || !sent {
            Next::Stop
        } else {
            Next::Continue
        }
    }

    /// Starts a request, or each request of a batch in order (see
    /// `SessionRequest.batch` in the `.proto`).
    async fn start(&mut self, mut request: v1::SessionRequest) -> Next {
        let Some(Op::Batch(batch)) = &mut request.op else {
            return self.start_one(request).await;
        };
        let requests = std::mem::take(&mut batch.requests);
        let refusal = if requests.is_empty() || requests.len() > BATCH_MAX {
            Some(format!(
                "a batch holds 1 to {BATCH_MAX} requests; this one holds {}",
                requests.len()
            ))
        } else if requests
            .iter()
            .any(|r| matches!(r.op, Some(Op::Open(_) | Op::Batch(_))))
        {
            Some("a batch may not hold `open` or another batch".to_string())
        } else {
            None
        };
        if let Some(rule) = refusal {
            let body = request_error(&Status::invalid_argument(rule));
            return self.send(request.id, body).await;
        }
        for one in requests {
            if let Next::Stop = self.start_one(one).await {
                return Next::Stop;
            }
        }
        Next::Continue
    }

    /// Sends one request to the engine and keeps its answer in flight.
    async fn start_one(&mut self, request: v1::SessionRequest) -> Next {
        let id = request.id;
        let Some(op) = request.op else {
            return self
                .send(
                    id,
                    request_error(&Status::invalid_argument("the request has no operation")),
                )
                .await;
        };
        if !self.in_flight.insert(id) {
            return self
                .send(
                    id,
                    request_error(&Status::invalid_argument(format!(
                        "request id {id} is already in use by a request waiting for its answer"
                    ))),
                )
                .await;
        }
        if let Op::Open(_) = op {
            let status = Status::invalid_argument(
                "a second `open` on a session stream: open a new stream for another session",
            );
            let _ = self.out.send(Err(status)).await;
            return Next::Stop;
        }
        match self.dispatch(id, op, &request.traceparent) {
            Ok(future) => {
                self.pending.push(future);
                Next::Continue
            }
            Err(status) => {
                self.in_flight.remove(&id);
                self.send(id, request_error(&status)).await
            }
        }
    }

    /// Starts one request; its answer is the future in flight. Acquire,
    /// renew and release run in a span joined to the client's trace
    /// (`traceparent`, see `trace.rs`).
    fn dispatch(&mut self, id: u64, op: Op, traceparent: &str) -> Result<InFlight, Status> {
        match op {
            Op::Open(_) => unreachable!("refused by `start_one`"),
            Op::Batch(_) => unreachable!("taken apart (or refused) by `start`"),
            Op::Heartbeat(_) => self.heartbeat(id),
            Op::Close(_) => self.close(id),
            Op::Renew(r) => self.renew(id, r, traceparent),
            Op::Release(r) => self.release(id, r, traceparent),
            Op::Cancel(c) => self.cancel(id, c),
            Op::Acquire(a) => self.acquire(id, a, traceparent),
        }
    }

    /// Answers `first` and every other request whose answer is ready
    /// now (together, to a client that reads batches).
    async fn finish_ready(&mut self, first: (u64, Answer)) -> Next {
        let mut answers = Vec::new();
        let mut next = Some(first);
        while let Some((id, answer)) = next {
            match self.answer(id, answer) {
                Ok(body) => answers.push(v1::SessionResponse {
                    id,
                    body: Some(body),
                }),
                Err(status) => {
                    // What was ready before still goes out, then the end.
                    if !answers.is_empty() {
                        let _ = self.send_all(answers).await;
                    }
                    let _ = self.out.send(Err(status)).await;
                    return Next::Stop;
                }
            }
            next = if self.batches && answers.len() < BATCH_MAX {
                self.pending.next().now_or_never().flatten()
            } else {
                None
            };
        }
        self.send_all(answers).await
    }

    /// The answer to request `id`, or the status that ends the stream.
    fn answer(&mut self, id: u64, answer: Answer) -> Result<Body, Status> {
        self.in_flight.remove(&id);
        self.waits.remove(&id);
        let was_cancelled = self.cancelled.remove(&id);
        match answer {
            Ok(body) => Ok(body),
            // The engine dropped the reply of a wait this stream withdrew.
            Err(_) if was_cancelled => Ok(Body::Acquire(v1::AcquireResponse {
                outcome: Some(super::not_acquired(v1::not_acquired::Reason::Cancelled)),
            })),
            Err(status) => Err(status),
        }
    }
}

fn revoked(
    list: Vec<(baton_core::ResourceName, baton_core::FencingToken)>,
) -> Vec<v1::RevokedLease> {
    list.into_iter()
        .map(|(resource, token)| v1::RevokedLease {
            resource: resource.to_string(),
            token: token.get(),
        })
        .collect()
}
