//! What `baton serve` can be told ([`ServerConfig`]), its defaults and
//! their checks, and why a server did not start or stopped
//! ([`ServerError`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use baton_core::Limits;
use baton_store::StoreError;

use crate::net::tls::TlsFiles;

/// Everything `baton serve` can be told, validated by [`start`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The gRPC address.
    pub listen: SocketAddr,
    /// `/healthz`, `/readyz` and `/metrics`; `None` disables the HTTP port.
    pub http_listen: Option<SocketAddr>,
    /// Names the operator page answers to besides its listen address (and
    /// the loopback names on loopback): the `--advertise` host and
    /// `--http-allow-host`, checked with [`crate::http::check_allowed_name`].
    pub http_allowed_hosts: Vec<String>,
    /// Where [`start`] opens the embedded store (unused by [`start_with_store`]).
    pub data_dir: PathBuf,
    /// The least size of each of the embedded store's two logs (a log
    /// already bigger keeps its size).
    pub log_len_bytes: u64,
    /// Bounds on names, TTLs, waits and waiters.
    pub limits: Limits,
    /// Holder changes kept for watchers that resume (at most
    /// `baton_core::HISTORY_LEN_MAX`).
    pub watch_history_len: usize,
    /// The TTL of an acquire that names none.
    pub default_ttl_ms: u64,
    /// Open connections; a request on one beyond it is `RESOURCE_EXHAUSTED`.
    pub connections_max: usize,
    /// A connection must send its first request within this long.
    pub handshake_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout_ms: u64,
    /// Serve both ports over TLS; `None`: plain TCP.
    pub tls: Option<TlsFiles>,
    /// Principals and their rules (reloaded on SIGHUP); `None`: auth off.
    pub auth_file: Option<PathBuf>,
    /// Quotas per name prefix and principal (reloaded on SIGHUP); `None`:
    /// none (only the global limits).
    pub quota_file: Option<PathBuf>,
    /// Refuse to start without `auth_file`.
    pub require_auth: bool,
    /// Also append audit lines to this file (JSON lines).
    pub audit_log: Option<PathBuf>,
}

/// Defaults for the connection rules (see `net/conn.rs`).
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// See [`HANDSHAKE_TIMEOUT_MS_DEFAULT`].
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 15 * 60_000;

/// The one source of `baton serve`'s defaults: its flags take theirs
/// from here (see the command line's `args::command`).
impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7700".parse().expect("literal"),
            http_listen: Some("127.0.0.1:7701".parse().expect("literal")),
            http_allowed_hosts: Vec::new(),
            data_dir: PathBuf::from("baton-data"),
            log_len_bytes: baton_store::LOG_LEN_BYTES_DEFAULT,
            limits: Limits::default(),
            watch_history_len: crate::engine::watch::WATCH_HISTORY_LEN_DEFAULT,
            default_ttl_ms: 30_000,
            connections_max: 1_024,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            tls: None,
            auth_file: None,
            quota_file: None,
            require_auth: false,
            audit_log: None,
        }
    }
}

impl ServerConfig {
    /// Loopback on an ephemeral port, no HTTP port, TTLs from 100 ms: for
    /// embedding the server in demos and tests.
    pub fn ephemeral(data_dir: PathBuf) -> Self {
        Self {
            listen: "127.0.0.1:0".parse().expect("literal"),
            http_listen: None,
            data_dir,
            limits: Limits {
                ttl_ms_min: 100,
                ..Limits::default()
            },
            connections_max: 256,
            ..Self::default()
        }
    }
}

/// Why the server did not start or stopped.
#[allow(missing_docs)] // variant fields are named for what they hold; the messages explain them
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the lease store in {data_dir}: {source}{hint}")]
    StoreOpen {
        data_dir: String,
        source: Box<StoreError>,
        hint: String,
    },
    #[error("{0}")]
    Cluster(#[from] baton_store_pg::PgError),
    #[error("the lease engine stopped: {0}")]
    Engine(#[from] EngineFailure),
    #[error("transport error: {0}")]
    Transport(String),
}

/// Why the lease engine stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineFailure {
    /// A commit failed: its batch's callers heard "indeterminate", and the
    /// store is not trusted again (docs/design.md).
    #[error("a store commit failed: {0}")]
    Store(#[from] StoreError),
    /// The engine thread panicked (a violated invariant).
    #[error("the engine thread panicked")]
    Panicked,
    /// The engine stopped while the server was still serving.
    #[error("the engine stopped unexpectedly")]
    Unexpected,
}

pub(crate) fn validate(config: &ServerConfig) -> Result<(), ServerError> {
    let l = &config.limits;
    if l.ttl_ms_min == 0 || l.ttl_ms_min > l.ttl_ms_max {
        return Err(ServerError::Config(format!(
            "ttl bounds {}ms..{}ms are invalid: the minimum must be positive and not above the maximum",
            l.ttl_ms_min, l.ttl_ms_max
        )));
    }
    if l.ttl_ms_max > baton_core::TTL_MS_MAX {
        return Err(ServerError::Config(format!(
            "--ttl-max {}ms is above the longest TTL a lease can have, {}ms (2^32-1 ms, about 49.7 days)",
            l.ttl_ms_max,
            baton_core::TTL_MS_MAX
        )));
    }
    if config.default_ttl_ms < l.ttl_ms_min || config.default_ttl_ms > l.ttl_ms_max {
        return Err(ServerError::Config(format!(
            "default ttl {}ms is outside the bounds {}ms..{}ms",
            config.default_ttl_ms, l.ttl_ms_min, l.ttl_ms_max
        )));
    }
    if config.handshake_timeout_ms == 0 || config.idle_timeout_ms == 0 {
        return Err(ServerError::Config(
            "the handshake and idle timeouts must be positive".into(),
        ));
    }
    if config.connections_max == 0 || l.n_waiters_max == 0 || l.n_waiters_per_resource_max == 0 {
        return Err(ServerError::Config(
            "connection and waiter limits must be positive".into(),
        ));
    }
    if config.require_auth && config.auth_file.is_none() {
        return Err(ServerError::Config(
            "--require-auth is set but no --auth-file was given: refusing to serve without authentication".into(),
        ));
    }
    Ok(())
}
