//! The transport under the gRPC port: accepted connections and their
//! limits (`conn.rs`) and TLS on both ports (`tls.rs`).

pub(crate) mod conn;
pub(crate) mod tls;

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::ServerError;

/// Binds `addr`, naming it in the error.
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    Ok((listener, bound))
}
