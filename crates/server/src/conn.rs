//! Accepted connections, counted against a limit.
//!
//! Connections over the limit are still accepted at the TCP level, so that
//! their requests can be answered `RESOURCE_EXHAUSTED` by [`check`] instead
//! of hanging in the kernel's backlog.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub over_limit: bool,
    pub connections_max: usize,
}

pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    metrics: Arc<Metrics>,
}

impl Conn {
    pub fn new(io: TcpStream, metrics: Arc<Metrics>, connections_max: usize) -> Self {
        let _ = io.set_nodelay(true);
        let n_open = metrics.connections.fetch_add(1, Relaxed) + 1;
        let over_limit = n_open as usize > connections_max;
        if over_limit {
            metrics.connections_refused.fetch_add(1, Relaxed);
        }
        Self {
            io,
            info: ConnInfo {
                over_limit,
                connections_max,
            },
            metrics,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.metrics.connections.fetch_sub(1, Relaxed);
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
