//! The client against a scripted server: a real tonic server on loopback
//! whose `Session` streams are handed to the test, which plays the
//! server's side request by request. So the test decides what the real
//! server never does on cue: hold an answer back, answer out of order,
//! break the stream with a call in flight, stay silent, end the session
//! (`session_driver`), or be a server from before a call existed
//! (`backup`). Every other call of the service is refused.

mod backup;
mod session_driver;

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
                batches: false,
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
                slot: None,
            }],
            after_wait: false,
            repeat: false,
        })),
    })
}

/// The service: hands every session stream to the test; answers `Backup`
/// with `backup` if set (and never `BackupParts`, as a server from before
/// it).
struct Scripted {
    streams: mpsc::UnboundedSender<ServerEnd>,
    backup: Option<v1::Snapshot>,
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
    async fn set_permits(
        &self,
        _: Request<v1::SetPermitsRequest>,
    ) -> Result<Response<v1::SetPermitsResponse>, Status> {
        refused()
    }
    async fn backup(
        &self,
        _: Request<v1::BackupRequest>,
    ) -> Result<Response<v1::Snapshot>, Status> {
        match &self.backup {
            Some(snapshot) => Ok(Response::new(snapshot.clone())),
            None => refused(),
        }
    }
    type BackupPartsStream = Stream<v1::Snapshot>;
    async fn backup_parts(
        &self,
        _: Request<v1::BackupRequest>,
    ) -> Result<Response<Self::BackupPartsStream>, Status> {
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
    scripted_with(None).await
}

/// [`scripted`], answering `Backup` with `backup`.
async fn scripted_with(
    backup: Option<v1::Snapshot>,
) -> (Client, mpsc::UnboundedReceiver<ServerEnd>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (streams, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LeasesServer::new(Scripted { streams, backup }))
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
