//! The session driver against a scripted server: a real tonic server on
//! loopback whose `Session` streams are handed to the test, which plays
//! the server's side request by request. So the test decides what the
//! real server never does on cue: hold an answer back, answer out of
//! order, break the stream with a call in flight, stay silent, end the
//! session. Every other call of the service is refused.

use std::pin::Pin;
use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, Health, Session};
use baton_proto::v1::{
    self,
    leases_server::{Leases, LeasesServer},
    session_request::Op,
    session_response::Body,
};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// How long the test waits for the driver to do something.
const WITHIN: Duration = Duration::from_secs(5);
const SESSION_ID: [u8; 16] = [7; 16];

/// One session stream, from the server's side.
struct ServerEnd {
    requests: Streaming<v1::SessionRequest>,
    answers: mpsc::Sender<Result<v1::SessionResponse, Status>>,
}

impl ServerEnd {
    /// The next request, and when it arrived.
    async fn next(&mut self) -> (Instant, v1::SessionRequest) {
        let request = timeout(WITHIN, self.requests.message())
            .await
            .expect("a request within 5 s")
            .expect("the stream is healthy")
            .expect("the stream goes on");
        (Instant::now(), request)
    }

    /// The next request that is not a heartbeat (heartbeats are answered
    /// with `ttl_ms` remaining, as a live server would).
    async fn next_call(&mut self, ttl_ms: u64) -> v1::SessionRequest {
        loop {
            let (_, request) = self.next().await;
            match request.op {
                Some(Op::Heartbeat(_)) => self.answer(request.id, heartbeat_ack(ttl_ms)).await,
                _ => return request,
            }
        }
    }

    async fn answer(&self, id: u64, body: Body) {
        let response = v1::SessionResponse {
            id,
            body: Some(body),
        };
        // The driver may have gone: that is what some tests check.
        let _ = self.answers.send(Ok(response)).await;
    }

    /// Answers `open` (a new session or a resume) with `ttl_ms`.
    async fn open(&mut self, ttl_ms: u64) -> v1::OpenSession {
        let (_, request) = self.next().await;
        let Some(Op::Open(open)) = request.op else {
            panic!("the first request is open, not {request:?}")
        };
        self.answer(
            request.id,
            Body::Opened(v1::SessionOpened {
                session_id: SESSION_ID.to_vec(),
                ttl_ms,
                resumed: !open.resume.is_empty(),
                revoked: Vec::new(),
            }),
        )
        .await;
        open
    }
}

fn heartbeat_ack(remaining_ms: u64) -> Body {
    Body::Heartbeat(v1::HeartbeatAck {
        remaining_ms,
        revoked: Vec::new(),
    })
}

/// The token of epoch 1 with counter `n`.
fn token(n: u64) -> u64 {
    (1 << 40) | n
}

fn granted(resource: &str, n: u64) -> Body {
    let token = token(n);
    Body::Acquire(v1::AcquireResponse {
        outcome: Some(v1::acquire_response::Outcome::Granted(v1::Granted {
            leases: vec![v1::Lease {
                resource: resource.into(),
                acquisition_id: vec![n as u8; 16],
                token,
                ttl_ms: 0,
                session_bound: true,
                waited_ms: 0,
            }],
            after_wait: false,
        })),
    })
}

/// The service: hands every session stream to the test.
struct Scripted {
    streams: mpsc::UnboundedSender<ServerEnd>,
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

fn refused<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented(
        "the scripted server only has sessions",
    ))
}

#[tonic::async_trait]
impl Leases for Scripted {
    type SessionStream = Stream<v1::SessionResponse>;
    type WatchStream = Stream<v1::WatchResponse>;

    async fn session(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (answers, rx) = mpsc::channel(64);
        let end = ServerEnd {
            requests: request.into_inner(),
            answers,
        };
        self.streams
            .send(end)
            .map_err(|_| Status::unavailable("the test is over"))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn acquire(
        &self,
        _: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        refused()
    }
    async fn renew(
        &self,
        _: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        refused()
    }
    async fn release(
        &self,
        _: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        refused()
    }
    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        refused()
    }
    async fn list(
        &self,
        _: Request<v1::ListRequest>,
    ) -> Result<Response<v1::ListResponse>, Status> {
        refused()
    }
    async fn fence(
        &self,
        _: Request<v1::FenceRequest>,
    ) -> Result<Response<v1::FenceResponse>, Status> {
        refused()
    }
    async fn backup(
        &self,
        _: Request<v1::BackupRequest>,
    ) -> Result<Response<v1::Snapshot>, Status> {
        refused()
    }
    async fn cluster_status(
        &self,
        _: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        refused()
    }
    async fn watch(
        &self,
        _: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        refused()
    }
}

/// A scripted server on loopback and a client connected to it; the
/// streams the client opens arrive on the receiver.
async fn scripted() -> (Client, mpsc::UnboundedReceiver<ServerEnd>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (streams, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LeasesServer::new(Scripted { streams }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (Client::connect(&url).await.unwrap(), rx)
}

async fn next_stream(streams: &mut mpsc::UnboundedReceiver<ServerEnd>) -> ServerEnd {
    timeout(WITHIN, streams.recv())
        .await
        .expect("a stream within 5 s")
        .expect("the server runs")
}

/// Opens a session of `ttl_ms` on the scripted server.
async fn open(ttl_ms: u64) -> (Session, ServerEnd, mpsc::UnboundedReceiver<ServerEnd>) {
    let (client, mut streams) = scripted().await;
    let opening = tokio::spawn(async move {
        client
            .open_session(Duration::from_millis(ttl_ms))
            .await
            .unwrap()
    });
    let mut end = next_stream(&mut streams).await;
    let request = end.open(ttl_ms).await;
    assert_eq!(request.ttl_ms, Some(ttl_ms));
    assert!(request.resume.is_empty());
    (opening.await.unwrap(), end, streams)
}

async fn health_becomes(session: &Session, health: Health) {
    let mut state = session.watch();
    timeout(WITHIN, state.wait_for(|s| s.health == health))
        .await
        .unwrap_or_else(|_| panic!("health {health:?} within 5 s"))
        .expect("the driver publishes its state");
}

/// An acknowledgement held back for 80 ms moves the deadline from the
/// heartbeat's send time, not from when the acknowledgement arrived: the
/// server deadline is no later than the heartbeat's arrival at the server
/// plus the TTL.
#[tokio::test]
async fn a_late_acknowledgement_counts_from_the_heartbeats_send_time() {
    // Heartbeats every 400 ms; silence counts after 200 ms.
    let ttl = Duration::from_millis(1_200);
    let (session, mut end, _streams) = open(1_200).await;
    let mut state = session.watch();
    let (arrived, beat) = end.next().await;
    assert!(matches!(beat.op, Some(Op::Heartbeat(_))), "{beat:?}");
    tokio::time::sleep(Duration::from_millis(80)).await;
    end.answer(beat.id, heartbeat_ack(1_200)).await;
    let acknowledged = timeout(WITHIN, state.wait_for(|s| s.beats == 1))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert!(
        acknowledged.server_deadline <= arrived + ttl,
        "the deadline counts from the send: {:?} after the arrival plus the TTL",
        acknowledged.server_deadline - (arrived + ttl)
    );
    assert!(acknowledged.safe_until < acknowledged.server_deadline);
    assert_eq!(acknowledged.health, Health::Live);
}

/// Two calls in flight answered in the opposite order: each caller gets
/// its own answer, matched by id.
#[tokio::test]
async fn answers_out_of_order_reach_their_own_callers() {
    let (session, mut end, _streams) = open(3_000).await;
    let (a, b) = (session.clone(), session.clone());
    let first = tokio::spawn(async move { a.acquire("r:a", Duration::ZERO).await });
    let first_request = end.next_call(3_000).await;
    let second = tokio::spawn(async move { b.acquire("r:b", Duration::ZERO).await });
    let second_request = end.next_call(3_000).await;
    assert_ne!(first_request.id, second_request.id);
    end.answer(second_request.id, granted("r:b", 20)).await;
    end.answer(first_request.id, granted("r:a", 10)).await;
    for (call, resource, n) in [(first, "r:a", 10), (second, "r:b", 20)] {
        match call.await.unwrap().unwrap() {
            Acquired::Granted(lease) => {
                assert_eq!(
                    (lease.resource.as_str(), lease.token.get()),
                    (resource, token(n))
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The stream breaks with a call in flight: the call is indeterminate
/// (it may have taken effect), and the driver resumes the same session on
/// a new stream, where the next call is answered.
#[tokio::test]
async fn a_broken_stream_makes_the_call_indeterminate_and_resumes() {
    let (session, mut end, mut streams) = open(3_000).await;
    let s = session.clone();
    let call = tokio::spawn(async move { s.acquire("r:x", Duration::ZERO).await });
    end.next_call(3_000).await;
    end.answers
        .send(Err(Status::unavailable("the server went away")))
        .await
        .unwrap();
    match call.await.unwrap() {
        Err(ClientError::Indeterminate(why)) => assert!(why.contains("broke"), "{why}"),
        other => panic!("the call in flight is indeterminate, not {other:?}"),
    }
    let mut resumed = next_stream(&mut streams).await;
    let open = resumed.open(3_000).await;
    assert_eq!(
        open.resume,
        SESSION_ID.to_vec(),
        "the same session is resumed"
    );
    health_becomes(&session, Health::Live).await;
    let s = session.clone();
    let call = tokio::spawn(async move { s.acquire("r:y", Duration::ZERO).await });
    let request = resumed.next_call(3_000).await;
    resumed.answer(request.id, granted("r:y", 30)).await;
    assert!(matches!(call.await.unwrap(), Ok(Acquired::Granted(_))));
}

/// A heartbeat left unanswered for a sixth of the TTL: the connection
/// stands but the server is silent, so the driver gives the stream up
/// and resumes on a new one.
#[tokio::test]
async fn a_silent_server_is_left_for_a_new_stream() {
    let (session, mut end, mut streams) = open(3_000).await;
    let (_, beat) = end.next().await;
    assert!(matches!(beat.op, Some(Op::Heartbeat(_))));
    // No answer. The driver's silence limit is 500 ms for this TTL.
    health_becomes(&session, Health::Reconnecting).await;
    let mut resumed = next_stream(&mut streams).await;
    assert_eq!(resumed.open(3_000).await.resume, SESSION_ID.to_vec());
    health_becomes(&session, Health::Live).await;
    drop(end);
}

/// The server answers a heartbeat with `ended`: the session is over and
/// every later call fails with `SessionEnded`, without touching the wire.
#[tokio::test]
async fn an_ended_answer_ends_the_session_for_every_later_call() {
    let (session, mut end, _streams) = open(600).await;
    let (_, beat) = end.next().await;
    end.answer(beat.id, Body::Ended(v1::SessionEnded {})).await;
    health_becomes(&session, Health::Ended).await;
    assert!(matches!(
        session.acquire("r:late", Duration::ZERO).await,
        Err(ClientError::SessionEnded)
    ));
}

/// Dropping the last handle closes the session on the stream.
#[tokio::test]
async fn dropping_the_last_handle_sends_close() {
    let (session, mut end, _streams) = open(3_000).await;
    drop(session);
    let request = end.next_call(3_000).await;
    assert!(matches!(request.op, Some(Op::Close(_))), "{request:?}");
    end.answer(
        request.id,
        Body::Closed(v1::SessionClosed { was_open: true }),
    )
    .await;
}
