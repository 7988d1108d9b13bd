//! How a client connects to one server: a connection carries a request
//! only once the server has answered on it.
//!
//! A stopped process (SIGSTOP, a frozen VM) still completes TCP handshakes
//! (the kernel queues them on its listening socket), so a connection that
//! opens proves nothing; a request written to it waits for its whole
//! timeout and its outcome is unknown. The [`Dialer`] is the connector of
//! every channel: it resolves the name, connects, and hands the connection
//! over only once the server has sent something within the dial timeout:
//! its HTTP/2 SETTINGS frame, which a Baton server writes as soon as it
//! accepts (plain HTTP/2), or its first TLS handshake message (TLS, where
//! the client speaks first: the read is bounded by the same deadline).
//! Every failure here happens before any request was written, so a call
//! that meets one is definite ([`NotDialed`]).
//!
//! Hand-written because tonic's connector (hyper-util's `HttpConnector`)
//! returns the socket as soon as TCP connects, and no crate adds the
//! "the peer has spoken" condition to a tonic channel.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// Why a connection was not made: nothing was sent on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotDialed {
    /// The host name did not resolve.
    #[error("{host} does not resolve: {message}")]
    Unresolved {
        /// The name.
        host: String,
        /// The resolver's words.
        message: String,
    },
    /// Every address refused or could not be reached.
    #[error("{addr}: {source}")]
    Unreachable {
        /// The last address tried.
        addr: String,
        /// The socket's error.
        source: io::Error,
    },
    /// TCP connected (or did not) but the server sent nothing within the
    /// dial timeout: it is stopped, overloaded, or not a Baton server.
    #[error("{addr} did not answer within the dial timeout of {dial_timeout_ms} ms (a stopped or hung server, or not Baton's gRPC port)")]
    NoAnswer {
        /// The address.
        addr: String,
        /// The dial timeout.
        dial_timeout_ms: u64,
    },
}

/// The connector of every channel (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Dialer {
    pub(crate) dial_timeout: Duration,
}

impl tower_service::Service<Uri> for Dialer {
    type Response = Dialed;
    type Error = NotDialed;
    type Future = Pin<Box<dyn Future<Output = Result<Dialed, NotDialed>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), NotDialed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(dial(uri, self.dial_timeout))
    }
}

async fn dial(uri: Uri, dial_timeout: Duration) -> Result<Dialed, NotDialed> {
    let deadline = Instant::now() + dial_timeout;
    let host = uri.host().unwrap_or_default();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(crate::servers::PORT_DEFAULT);
    let addr = format!("{}:{port}", uri.host().unwrap_or_default());
    let no_answer = || NotDialed::NoAnswer {
        addr: addr.clone(),
        dial_timeout_ms: dial_timeout.as_millis() as u64,
    };
    let resolved =
        tokio::time::timeout_at(deadline, tokio::net::lookup_host((host.as_str(), port)))
            .await
            .map_err(|_| no_answer())?
            .map_err(|e| NotDialed::Unresolved {
                host: host.clone(),
                message: e.to_string(),
            })?;
    let mut last = None;
    for ip in resolved {
        match tokio::time::timeout_at(deadline, TcpStream::connect(ip)).await {
            Err(_) => return Err(no_answer()),
            Ok(Err(e)) => last = Some(e),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return answered(stream, uri.scheme_str() == Some("https"), deadline)
                    .await
                    .ok_or_else(no_answer);
            }
        }
    }
    Err(NotDialed::Unreachable {
        addr: addr.clone(),
        source: last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")),
    })
}

/// The connection once the server has spoken (plain HTTP/2: its SETTINGS
/// frame is waiting to be read), or with TLS a connection whose first read
/// must come by `deadline`. `None` if the server said nothing in time (or
/// closed the connection at once).
async fn answered(stream: TcpStream, tls: bool, deadline: Instant) -> Option<Dialed> {
    if tls {
        return Some(Dialed {
            io: TokioIo::new(stream),
            first_read_by: Some(Box::pin(tokio::time::sleep_until(deadline))),
        });
    }
    let mut byte = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut byte)).await {
        Ok(Ok(n)) if n > 0 => Some(Dialed {
            io: TokioIo::new(stream),
            first_read_by: None,
        }),
        _ => None,
    }
}

/// A connection whose first read, while `first_read_by` is set, fails once
/// that instant passes (the TLS handshake's answer).
pub(crate) struct Dialed {
    io: TokioIo<TcpStream>,
    first_read_by: Option<Pin<Box<Sleep>>>,
}

impl Read for Dialed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.first_read_by = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let late = this
                    .first_read_by
                    .as_mut()
                    .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
                if late {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the server sent nothing within the dial timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl Write for Dialed {
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

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
