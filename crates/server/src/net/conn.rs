//! Accepted connections: counted against a limit, and never held by a peer
//! that does not use them.
//!
//! Connections over the limit are still accepted at the TCP level, so that
//! their requests can be answered `RESOURCE_EXHAUSTED` by [`check`] instead
//! of hanging in the kernel's backlog.
//!
//! A socket that never sends a byte would otherwise hold a slot forever, and
//! enough of them lock every client out (including a holder that reconnects
//! to renew). Three rules prevent that:
//! - a connection must send its first request within the handshake timeout;
//! - at the limit, a new connection evicts the oldest connection that has not
//!   sent a request yet (a client's connection sends its first request within
//!   milliseconds, so an attacker's idle sockets are the ones evicted);
//! - a connection with no request in flight for the idle timeout is closed
//!   (silent HTTP/2 peers are also dropped by the keepalive ping timeout).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use crate::metrics::Metrics;

/// The connection rules, from the server configuration.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    pub connections_max: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

/// What the request path knows about one connection.
#[derive(Debug)]
pub struct ConnState {
    accepted_at: Instant,
    /// Set by the first request that reaches the service.
    proven: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds after `accepted_at` of the last request start or end.
    last_activity_ms: AtomicU64,
    evict: CancellationToken,
}

impl ConnState {
    fn touch(&self) {
        let ms = self.accepted_at.elapsed().as_millis() as u64;
        self.last_activity_ms.fetch_max(ms, Relaxed);
    }
}

#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub over_limit: bool,
    pub connections_max: usize,
    pub state: Arc<ConnState>,
    /// The peer's address, for audit lines.
    pub peer: Option<std::net::SocketAddr>,
    /// What the client certificate proved (mTLS).
    pub client_cert: crate::net::tls::ClientCert,
}

/// Admits connections: counts them and evicts idle newcomers at the limit.
pub struct Registry {
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    /// Connections that have not sent a request yet, oldest first (proven or
    /// closed ones are skipped lazily).
    unproven: Mutex<VecDeque<Arc<ConnState>>>,
}

impl Registry {
    pub fn new(limits: ConnLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            limits,
            metrics,
            unproven: Mutex::new(VecDeque::new()),
        })
    }

    /// Wraps an accepted socket.
    pub fn admit(&self, io: TcpStream) -> Conn {
        let _ = io.set_nodelay(true);
        let peer = io.peer_addr().ok();
        let n_open = self.metrics.connections.inc() + 1;
        let state = Arc::new(ConnState {
            accepted_at: Instant::now(),
            proven: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(0),
            evict: CancellationToken::new(),
        });
        let mut unproven = self.unproven.lock().expect("registry lock");
        let over_limit =
            n_open as usize > self.limits.connections_max && !self.evict_one(&mut unproven);
        if over_limit {
            self.metrics.connections_refused.inc();
        }
        unproven.retain(|c| !c.proven.load(Relaxed) && !c.evict.is_cancelled());
        unproven.push_back(state.clone());
        drop(unproven);
        let deadline = state.accepted_at + self.limits.handshake_timeout;
        Conn {
            io,
            evicted: Box::pin(state.evict.clone().cancelled_owned()),
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            info: ConnInfo {
                over_limit,
                connections_max: self.limits.connections_max,
                state,
                peer,
                client_cert: crate::net::tls::ClientCert::NotAsked,
            },
            limits: self.limits,
            metrics: self.metrics.clone(),
        }
    }

    /// Evicts the oldest connection that has not sent a request; false if none.
    fn evict_one(&self, unproven: &mut VecDeque<Arc<ConnState>>) -> bool {
        while let Some(oldest) = unproven.pop_front() {
            if !oldest.proven.load(Relaxed) && !oldest.evict.is_cancelled() {
                oldest.evict.cancel();
                self.metrics.connections_evicted.inc();
                return true;
            }
        }
        false
    }
}

pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
    timer: Pin<Box<Sleep>>,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
}

impl Conn {
    /// When the connection is due to close, or `None` if it is due now.
    fn next_check(&self) -> Option<Instant> {
        let state = &self.info.state;
        let now = Instant::now();
        if !state.proven.load(Relaxed) {
            let deadline = state.accepted_at + self.limits.handshake_timeout;
            return (now < deadline).then_some(deadline);
        }
        if state.in_flight.load(Relaxed) > 0 {
            return Some(now + self.limits.idle_timeout);
        }
        let last = state.accepted_at + Duration::from_millis(state.last_activity_ms.load(Relaxed));
        let deadline = last + self.limits.idle_timeout;
        (now < deadline).then_some(deadline)
    }

    /// `Err` once the connection must close: evicted, or past its deadline.
    fn poll_rules(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "evicted: no request sent while the server was at its connection limit",
            ));
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            match self.next_check() {
                Some(at) => self.timer.as_mut().reset(at),
                None => {
                    self.metrics.connections_closed_idle.inc();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "closed: no request in time",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.metrics.connections.dec();
        // Leaves the unproven queue at the next admission.
        self.info.state.evict.cancel();
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.poll_rules(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// An accepted connection, plain or TLS, as the gRPC server sees it.
#[allow(clippy::large_enum_variant)] // one per connection; boxing would add a hop per read
pub enum Io {
    Plain(Conn),
    Tls(
        tokio_rustls::server::TlsStream<Conn>,
        crate::net::tls::ClientCert,
    ),
}

impl Connected for Io {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Io::Plain(c) => c.info.clone(),
            Io::Tls(s, cert) => ConnInfo {
                client_cert: cert.clone(),
                ..s.get_ref().0.info.clone()
            },
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Io::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Io::Tls($s, _) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(c) => c.is_write_vectored(),
            Io::Tls(s, _) => s.is_write_vectored(),
        }
    }
}

/// The connections of `listener`, admitted by `registry`; with `tls`, each
/// handshake runs in its own task (bounded by the handshake timeout) and
/// the connection is yielded once it is done.
pub fn incoming(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    tls: Option<crate::net::tls::Tls>,
) -> Pin<Box<dyn futures_util::Stream<Item = io::Result<Io>> + Send>> {
    use futures_util::StreamExt;
    let accepted = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let Some(tls) = tls else {
        return accepted
            .map(move |r| r.map(|io| Io::Plain(registry.admit(io))))
            .boxed();
    };
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut accepted = accepted;
        loop {
            let io = tokio::select! {
                next = accepted.next() => match next {
                    Some(Ok(io)) => io,
                    Some(Err(_)) => continue,
                    None => return,
                },
                _ = tx.closed() => return,
            };
            let conn = registry.admit(io);
            let timeout = registry.limits.handshake_timeout;
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let mut conn = conn;
                let handshake = async {
                    if !crate::net::tls::starts_tls(
                        &mut conn.io,
                        crate::net::tls::PlainAnswer::Http2,
                    )
                    .await?
                    {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "plain text on a TLS port",
                        ));
                    }
                    crate::net::tls::accept(&tls, conn).await
                };
                match tokio::time::timeout(timeout, handshake).await {
                    Ok(Ok((stream, cert))) => {
                        let _ = tx.send(Ok(Io::Tls(stream, cert))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// Interceptor: refuses every request on a connection over the limit.
#[allow(clippy::result_large_err)] // the signature is tonic's
pub fn check(request: Request<()>) -> Result<Request<()>, Status> {
    match request.extensions().get::<ConnInfo>() {
        Some(info) if info.over_limit => Err(Status::resource_exhausted(format!(
            "the server already has {} connections, its limit; retry later",
            info.connections_max
        ))),
        _ => Ok(request),
    }
}

/// Counts a request in flight on its connection for as long as it lives.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn start(state: Arc<ConnState>) -> Self {
        state.proven.store(true, Relaxed);
        state.in_flight.fetch_add(1, Relaxed);
        state.touch();
        Self(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// Wraps the gRPC service: marks a connection as used and counts its
/// requests in flight, for the idle rules above.
#[derive(Clone)]
pub struct Tracked<S> {
    pub inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for Tracked<S>
where
    S: tower_service::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = request
            .extensions()
            .get::<ConnInfo>()
            .map(|info| InFlight::start(info.state.clone()));
        let response = self.inner.call(request);
        Box::pin(async move {
            let out = response.await;
            drop(guard);
            out
        })
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Tracked<S> {
    const NAME: &'static str = S::NAME;
}
