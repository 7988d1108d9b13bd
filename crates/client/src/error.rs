//! What went wrong with a call, and whether it may have taken effect: the
//! client's one error type and how a gRPC status or a transport failure
//! becomes it.

use std::time::Duration;

use tonic::Code;

use crate::security;

/// What went wrong with a call, and whether it may have taken effect.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request broke a rule (name, TTL, wait, sizes). Not applied.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A server limit (waiters, sessions, connections) or a tenant's quota
    /// was reached (the message names it). Not applied; retry later.
    #[error("refused, nothing applied (retry later): {0}")]
    Exhausted(String),
    /// No connection could be made, so nothing was sent. Not applied.
    #[error("cannot connect to {url}: {message}")]
    Connect {
        /// The server address tried.
        url: String,
        /// Why the connection failed.
        message: String,
    },
    /// The request may or may not have taken effect (timeout, reset or
    /// server failure after it was sent). Retries of effects must reuse the
    /// same operation id.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// The server answered something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The session is not open (it expired or was closed): nothing was
    /// done, and every lease tied to it has ended.
    #[error("the session has ended (it expired or was closed); its leases have ended with it")]
    SessionEnded,
    /// The server's auth file has no principal for this client's token or
    /// certificate (or it sent neither). Not applied.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The principal is known but no rule lets it do this. Not applied.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A watch ended (the server restarted, stopped leading or shut
    /// down): watch again, from a new snapshot.
    #[error("the watch ended: {0}")]
    WatchEnded(String),
    /// A watch asked to resume after a number older than the changes the
    /// server keeps: watch again from a new snapshot (a client's own watch
    /// does so by itself). Nothing was streamed.
    #[error("{message}")]
    WatchTooOld {
        /// The oldest number the server resumes a watch from.
        oldest_seq: u64,
        /// The server's words.
        message: String,
    },
}

impl ClientError {
    /// True when the request certainly did not take effect.
    pub fn is_definite(&self) -> bool {
        !matches!(self, ClientError::Indeterminate(_))
    }
}

/// Whether the error chain holds an I/O error that means the connection
/// was never made (so the request was never sent).
pub(crate) fn never_connected(status: &tonic::Status) -> bool {
    use std::io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable,
    };
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        // The connection was never made (our dialer's verdicts among them):
        // no request was written.
        if e.downcast_ref::<tonic::ConnectError>().is_some()
            || e.downcast_ref::<crate::NotDialed>().is_some()
        {
            return true;
        }
        // The TLS handshake failed: the server took no request.
        if e.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
            return matches!(
                io.kind(),
                ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
            );
        }
        source = e.source();
    }
    false
}

/// A failure that says the server may be gone, not that it refused.
pub(crate) fn server_trouble(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

pub(crate) fn from_status(status: tonic::Status) -> ClientError {
    // A transport failure's status says only "transport error": the cause
    // (a refused certificate, a reset) is in its sources.
    let message = match std::error::Error::source(&status) {
        Some(source) => {
            security::explain(&format!("{}: {}", status.message(), error_chain(source)))
        }
        None => status.message().to_string(),
    };
    if let Some(oldest_seq) = oldest_seq(&status) {
        return ClientError::WatchTooOld {
            oldest_seq,
            message,
        };
    }
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => ClientError::Invalid(message),
        Code::ResourceExhausted => ClientError::Exhausted(message),
        // With a source, the code is the transport's (h2 maps a plain-text
        // peer's INADEQUATE_SECURITY to PERMISSION_DENIED), not the server's.
        Code::Unauthenticated | Code::PermissionDenied
            if std::error::Error::source(&status).is_some() =>
        {
            ClientError::Connect {
                url: String::new(),
                message,
            }
        }
        Code::Unauthenticated => ClientError::Unauthenticated(message),
        Code::PermissionDenied => ClientError::PermissionDenied(message),
        // A (re)connection that failed is reported as UNAVAILABLE before
        // anything was sent: known from the I/O error's kind, not its text.
        Code::Unavailable if never_connected(&status) => ClientError::Connect {
            url: String::new(),
            message,
        },
        _ => ClientError::Indeterminate(format!("{:?}: {message}", status.code())),
    }
}

/// The oldest number a watch resumes from, on a watch's OUT_OF_RANGE.
fn oldest_seq(status: &tonic::Status) -> Option<u64> {
    if status.code() != Code::OutOfRange {
        return None;
    }
    status
        .metadata()
        .get("baton-oldest-seq")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A call that failed at `url` after its request may have been sent, in
/// the user's terms: the likely cause and the address, once, rather than
/// the transport's text.
pub(crate) fn failed_at(status: tonic::Status, url: &str, timeout: Duration) -> ClientError {
    let message = status.message();
    // tonic's words for an answer that was plain HTTP, not gRPC.
    if status.code() == Code::Unimplemented && message.contains("grpc-status header missing") {
        let http = message
            .rsplit("HTTP status code ")
            .next()
            .filter(|code| code.len() == 3)
            .map_or(String::new(), |code| format!(" (HTTP {code})"));
        return ClientError::Connect {
            url: url.to_string(),
            message: format!(
                "it answered plain HTTP{http}, not gRPC: is this Baton's HTTP port (--http-listen, 7701 by default)? Clients use the gRPC port (--listen, 7700 by default); nothing was applied"
            ),
        };
    }
    let timed_out = status.code() == Code::DeadlineExceeded
        || (status.code() == Code::Cancelled && message.contains("Timeout expired"));
    if timed_out {
        return ClientError::Indeterminate(format!(
            "no answer from {url} within {} ms: the server may be stopped, overloaded or cut off from this client, or not a Baton server; the request may have taken effect",
            timeout.as_millis()
        ));
    }
    // A transport failure with no answer: the connection broke. A TLS
    // mismatch keeps its own explanation (`security::explain`).
    if let Some(source) = std::error::Error::source(&status) {
        let chain = error_chain(source);
        if security::explain(&chain) == chain {
            return ClientError::Indeterminate(format!(
                "the connection to {url} broke before an answer came: the server may have stopped or been cut off, or this is not Baton's gRPC port (clients use --listen, 7700 by default; the HTTP port, --http-listen, speaks HTTP/1 only); the request may have taken effect"
            ));
        }
    }
    from_status(status)
}

/// Why a connection could not be made, in the user's terms: a refused or
/// unanswered connection says what that likely means; a TLS failure keeps
/// its explanation (`security::explain`).
pub(crate) fn connect_cause(e: &tonic::transport::Error) -> String {
    let chain = error_chain(e);
    let explained = security::explain(&chain);
    if explained != chain {
        return explained;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(not_dialed) = s.downcast_ref::<crate::NotDialed>() {
            // The caller names the address.
            return match not_dialed {
                crate::NotDialed::Unreachable { source, .. }
                    if source.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    "connection refused: nothing listens there (is `baton serve` running, on this address and port?)".into()
                }
                crate::NotDialed::Unreachable { source, .. } => source.to_string(),
                crate::NotDialed::NoAnswer { dial_timeout_ms, .. } => format!(
                    "no answer within the dial timeout of {dial_timeout_ms} ms: the server is stopped or hung, or this is not Baton's gRPC port (clients use --listen, 7700 by default; Baton's HTTP port, --http-listen, and a TLS port, which needs https:// and --tls-ca, wait for the client to speak first)"
                ),
                other => other.to_string(),
            };
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "connection refused: nothing listens there (is `baton serve` running, on this address and port?)".into()
                }
                std::io::ErrorKind::TimedOut => {
                    "the server sent nothing within the dial timeout (a stopped or hung server, or not Baton's gRPC port)".into()
                }
                _ => io.to_string(),
            };
        }
        source = s.source();
    }
    chain
}

/// An error and its sources on one line, each message once.
pub(crate) use baton_telemetry::error_chain;
