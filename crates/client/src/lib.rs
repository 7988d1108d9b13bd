//! Rust client for the Baton lease service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton_client::ClientError> {
//! use std::time::Duration;
//! use baton_client::{Client, Acquired};
//!
//! let mut client = Client::connect("http://127.0.0.1:7700").await?;
//! match client.acquire("statement:account-42:2026-09-13", Duration::from_secs(30), Duration::ZERO).await? {
//!     Acquired::Granted(lease) => {
//!         // Carry lease.token to every protected write.
//!         client.release(&lease.resource, &lease.acquisition_id).await?;
//!     }
//!     Acquired::NotAcquired(why) => println!("held by token {:?}", why.holder_token),
//! }
//! # Ok(()) }
//! ```
//!
//! Every error says whether the request definitely did not take effect
//! ([`ClientError::is_definite`]) or may have ([`ClientError::Indeterminate`]):
//! after an indeterminate acquire a lease may be held until its TTL runs out.
#![warn(missing_docs)]

mod election;
pub mod flags;
pub mod observe;
pub mod rng;
mod security;
mod servers;
mod session;
pub mod watch;

use std::time::Duration;

use baton_core::{AcquisitionId, FencingToken, Holder};
use baton_proto::v1::{self, leases_client::LeasesClient};
use servers::{endpoint, normalize, redirect, Servers, ServersState};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request};
use tracing::Instrument;

pub mod worker;

pub use baton_core;
pub use baton_proto::v1::Snapshot;
pub use election::{Election, Leader, LeaderChange, Leadership, Observer};
pub use security::ConnectOptions;
pub use session::{Health, Session, SessionState};
pub use watch::{Watch, WatchEvent, WatchHolder, WatchKind};

/// Time allowed for a request beyond any server-side wait it asks for.
const RPC_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The largest backup the client reads: a protobuf message's own limit
/// (2 GiB), tens of millions of leases.
const SNAPSHOT_LEN_BYTES_MAX: usize = i32::MAX as usize;

/// What went wrong with a call, and whether it may have taken effect.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request broke a rule (name, TTL, wait, sizes). Not applied.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A server limit (waiters, connections) was reached. Not applied; retry later.
    #[error("server limit reached: {0}")]
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
}

impl ClientError {
    /// True when the request certainly did not take effect.
    pub fn is_definite(&self) -> bool {
        !matches!(self, ClientError::Indeterminate(_))
    }
}

/// Whether the error chain holds an I/O error that means the connection
/// was never made (so the request was never sent).
fn never_connected(status: &tonic::Status) -> bool {
    use std::io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable,
    };
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
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

fn from_status(status: tonic::Status) -> ClientError {
    // A transport failure's status says only "transport error": the cause
    // (a refused certificate, a reset) is in its sources.
    let message = match std::error::Error::source(&status) {
        Some(source) => {
            security::explain(&format!("{}: {}", status.message(), error_chain(source)))
        }
        None => status.message().to_string(),
    };
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

/// A call that failed at `url` after its request may have been sent, in
/// the user's terms: the likely cause and the address, once, rather than
/// the transport's text.
fn failed_at(status: tonic::Status, url: &str, timeout: Duration) -> ClientError {
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
fn connect_cause(e: &tonic::transport::Error) -> String {
    let chain = error_chain(e);
    let explained = security::explain(&chain);
    if explained != chain {
        return explained;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "connection refused: nothing listens there (is `baton serve` running, on this address and port?)".into()
                }
                std::io::ErrorKind::TimedOut => {
                    "no answer to the connection within 5 s (the wrong host, or a firewall?)".into()
                }
                _ => io.to_string(),
            };
        }
        source = s.source();
    }
    chain
}

/// An error and its sources on one line, each message once (tonic's
/// transport errors repeat their source's text).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        source = s.source();
    }
    message
}

/// A held lease. `acquisition_id` is the secret that renews and releases it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The canonical resource name the server returned.
    pub resource: String,
    /// The secret that renews and releases this lease; keep it.
    pub acquisition_id: AcquisitionId,
    /// The fencing token: carry it into every protected write.
    pub token: FencingToken,
    /// The granted TTL.
    pub ttl: Duration,
    /// The earliest instant the server may end this lease, on this
    /// process's monotonic clock: the acquire request's **send** time plus
    /// the time the server says it waited in line (never more than this
    /// process saw pass) plus the TTL, never the reply's arrival (the
    /// server started the TTL no earlier than it received the request).
    /// For a lease tied to a session, the later of the send time plus the
    /// TTL and the session's deadline when the grant arrived. A reply that
    /// took longer than the TTL arrives already past it: see
    /// [`Lease::is_expired`].
    pub valid_until: Instant,
}

impl Lease {
    /// How long this process may still count on the lease, from now
    /// (zero once [`Lease::valid_until`] has passed). Renewals or the
    /// session's heartbeats extend it only through a [`worker::Keeper`].
    pub fn valid_for(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// True once [`Lease::valid_until`] has passed: the server may already
    /// have given the resource to someone else. A grant that is expired on
    /// arrival must not be used; release it (best effort) and try again.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until
    }
}

/// `sent + ttl`, refusing a TTL that would overflow the clock (a server
/// that answers nonsense must not panic the client).
fn deadline(sent: Instant, ttl: Duration) -> Result<Instant, ClientError> {
    sent.checked_add(ttl).ok_or_else(|| {
        ClientError::Protocol(format!("ttl of {} ms is out of range", ttl.as_millis()))
    })
}

/// Why an acquire was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAcquired {
    /// True if the wait ran out; false if a try-once request found the resource busy.
    pub timed_out: bool,
    /// The resource that blocked the request, for a try-once request.
    pub resource: Option<String>,
    /// The holder's token, if the resource was held.
    pub holder_token: Option<FencingToken>,
}

/// The answer to a single-resource acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is yours.
    Granted(Lease),
    /// Refused (held, or the wait ran out).
    NotAcquired(NotAcquired),
}

/// The answer to a multi-resource acquire: all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquiredAll {
    /// One lease per requested resource, in request order.
    Granted {
        /// One lease per claimed resource.
        leases: Vec<Lease>,
        /// Whether the request waited in line first.
        after_wait: bool,
    },
    /// Refused: nothing was granted.
    NotAcquired(NotAcquired),
}

impl AcquiredAll {
    /// Whether every resource was granted.
    pub fn is_granted(&self) -> bool {
        matches!(self, AcquiredAll::Granted { .. })
    }
}

/// The answer to a renew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Extended by its TTL from when the server received the renewal.
    Renewed {
        /// The lease's token (unchanged by renewals).
        token: FencingToken,
        /// Time left when the server answered.
        remaining: Duration,
        /// The earliest instant the server may end the lease, on this
        /// process's monotonic clock: the renewal's send time plus
        /// `remaining` (see [`Lease::valid_until`]).
        valid_until: Instant,
    },
    /// The lease expired, was released, fenced or replaced. You no longer own it.
    NotOwner,
}

/// The answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Given back.
    Released {
        /// The released lease's token.
        token: FencingToken,
    },
    /// Already released, expired, fenced or never this id's. Nothing changed.
    NotHeld,
}

/// A resource as the server reports it (never the acquisition id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The canonical name.
    pub resource: String,
    /// The holder's token, if held.
    pub holder_token: Option<FencingToken>,
    /// Time left on the lease.
    pub remaining: Duration,
    /// The lease's TTL.
    pub ttl: Duration,
    /// Requests waiting in line.
    pub n_waiters: u64,
    /// The holder's description, if it gave one.
    pub holder: Option<String>,
    /// The last token the server issued, to any resource, when it
    /// answered: every later grant gets a higher one (`None` from a server
    /// too old to say).
    pub issued_through: Option<FencingToken>,
}

/// What an operator fence did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// A token above every token issued before it; write it into the resource to cancel durably.
    pub token: FencingToken,
    /// The token of the lease it revoked, if one was held.
    pub revoked: Option<FencingToken>,
}

/// A TTL as the wire's optional milliseconds: zero is absent (the server's
/// default), anything else as [`millis`].
fn optional_millis(d: Duration, what: &str) -> Result<Option<u64>, ClientError> {
    (!d.is_zero()).then(|| millis(d, what)).transpose()
}

/// A duration as the wire's milliseconds: whole, and refused rather than
/// wrapped when it does not fit (a TTL of 2^61 s must not become 30 s).
fn millis(d: Duration, what: &str) -> Result<u64, ClientError> {
    if d > flags::DURATION_MAX {
        return Err(ClientError::Invalid(format!(
            "{what} of {} ms is longer than the longest accepted, {} ms",
            d.as_millis(),
            flags::DURATION_MAX.as_millis()
        )));
    }
    Ok(d.as_millis() as u64)
}

fn token(value: u64) -> Result<FencingToken, ClientError> {
    FencingToken::from_u64(value).map_err(|e| ClientError::Protocol(e.to_string()))
}

fn optional_token(value: u64) -> Result<Option<FencingToken>, ClientError> {
    if value == 0 {
        Ok(None)
    } else {
        token(value).map(Some)
    }
}

/// A granted lease from the acquire request sent at `sent`: valid from the
/// send time plus how long it waited in line on the server (a lease tied
/// to a session: the acquire refreshed the session on arrival, so from the
/// send time; the session's heartbeats extend it, see `Session`).
fn lease(l: v1::Lease, sent: Instant) -> Result<Lease, ClientError> {
    let ttl = Duration::from_millis(l.ttl_ms);
    // Never more than this process saw pass since the send.
    let waited = if l.session_bound {
        Duration::ZERO
    } else {
        Duration::from_millis(l.waited_ms).min(sent.elapsed())
    };
    Ok(Lease {
        acquisition_id: AcquisitionId::from_slice(&l.acquisition_id)
            .ok_or_else(|| ClientError::Protocol("acquisition id is not 16 bytes".into()))?,
        token: token(l.token)?,
        ttl,
        valid_until: deadline(sent, waited.saturating_add(ttl))?,
        resource: l.resource,
    })
}

/// An acquire's answer for `n_resources` resources, to the request sent at `sent`.
fn acquired_all(
    response: v1::AcquireResponse,
    n_resources: usize,
    sent: Instant,
) -> Result<AcquiredAll, ClientError> {
    use v1::not_acquired::Reason;
    match response.outcome {
        Some(v1::acquire_response::Outcome::Granted(g)) => {
            if g.leases.len() != n_resources {
                return Err(ClientError::Protocol(format!(
                    "{} leases for {n_resources} resources",
                    g.leases.len(),
                )));
            }
            let leases = g
                .leases
                .into_iter()
                .map(|l| lease(l, sent))
                .collect::<Result<_, _>>()?;
            Ok(AcquiredAll::Granted {
                leases,
                after_wait: g.after_wait,
            })
        }
        Some(v1::acquire_response::Outcome::NotAcquired(n))
            if n.reason() == Reason::SessionEnded =>
        {
            Err(ClientError::SessionEnded)
        }
        Some(v1::acquire_response::Outcome::NotAcquired(n)) => {
            Ok(AcquiredAll::NotAcquired(NotAcquired {
                timed_out: n.reason() == Reason::TimedOut,
                resource: (!n.resource.is_empty()).then_some(n.resource),
                holder_token: optional_token(n.holder_token)?,
            }))
        }
        None => Err(ClientError::Protocol(
            "acquire response without an outcome".into(),
        )),
    }
}

/// A renewal's answer to the request sent at `sent`.
fn renewal(r: v1::RenewResponse, sent: Instant) -> Result<Renewal, ClientError> {
    Ok(if r.renewed {
        let remaining = Duration::from_millis(r.remaining_ms);
        Renewal::Renewed {
            token: token(r.token)?,
            remaining,
            valid_until: deadline(sent, remaining)?,
        }
    } else {
        Renewal::NotOwner
    })
}

fn release(r: v1::ReleaseResponse) -> Result<Release, ClientError> {
    Ok(if r.released {
        Release::Released {
            token: token(r.token)?,
        }
    } else {
        Release::NotHeld
    })
}

impl Acquired {
    /// The single lease of a one-resource answer.
    fn from_all(all: AcquiredAll) -> Result<Self, ClientError> {
        Ok(match all {
            AcquiredAll::Granted { mut leases, .. } => {
                let one = leases
                    .pop()
                    .ok_or_else(|| ClientError::Protocol("granted without a lease".into()))?;
                Acquired::Granted(one)
            }
            AcquiredAll::NotAcquired(n) => Acquired::NotAcquired(n),
        })
    }
}

fn status(s: v1::StatusResponse) -> Result<Status, ClientError> {
    Ok(Status {
        holder_token: if s.held {
            Some(token(s.holder_token)?)
        } else {
            None
        },
        remaining: Duration::from_millis(s.remaining_ms),
        ttl: Duration::from_millis(s.ttl_ms),
        n_waiters: s.n_waiters,
        resource: s.resource,
        holder: (!s.holder.is_empty()).then_some(s.holder),
        issued_through: match s.issued_through {
            0 => None,
            t => Some(token(t)?),
        },
    })
}

/// A connection to a Baton server, or to the leader of a cluster. Cheap to
/// clone; clones share the connections.
#[derive(Clone, Debug)]
pub struct Client {
    servers: std::sync::Arc<Servers>,
    /// `Bearer TOKEN`, sent with every request (never logged).
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    rpc_timeout: Duration,
    /// Sessions shared by clones, by TTL in milliseconds (see [`Client::session`]).
    sessions: std::sync::Arc<tokio::sync::Mutex<std::collections::HashMap<u64, Session>>>,
    /// The connections its watches share (made on the first watch).
    watching: std::sync::Arc<std::sync::OnceLock<Client>>,
    /// Sent with every acquire (see [`Client::with_holder`]).
    holder: Option<Holder>,
}

impl Client {
    /// Connects to `url` (for example `http://127.0.0.1:7700`), or to the
    /// first reachable of several separated by commas (the servers of one
    /// cluster). Calls go to the leader: a follower's answer names it and
    /// the call is sent there, which is safe because a follower does
    /// nothing. A server that refuses connections is skipped. A call that
    /// may have taken effect is never repeated: it is reported as
    /// [`ClientError::Indeterminate`].
    pub async fn connect(url: &str) -> Result<Self, ClientError> {
        Self::connect_with(url, ConnectOptions::default()).await
    }

    /// [`Client::connect`] over TLS and/or with a bearer token (see
    /// [`ConnectOptions`]). With TLS, a bare `host:port` means `https://`,
    /// and an `http://` URL is refused.
    pub async fn connect_with(url: &str, options: ConnectOptions) -> Result<Self, ClientError> {
        let tls = options.tls.is_some();
        let urls: Vec<String> = url
            .split(',')
            .filter(|u| !u.trim().is_empty())
            .map(|u| normalize(u, tls))
            .collect();
        for u in &urls {
            options.check_scheme(u)?;
        }
        if urls.is_empty() {
            return Err(ClientError::Invalid(format!(
                "server url {url:?}: no address given"
            )));
        }
        let mut channels = std::collections::HashMap::new();
        let mut errors = Vec::new();
        for u in &urls {
            match endpoint(u, options.tls.as_ref())?.connect().await {
                Ok(channel) => {
                    channels.insert(u.clone(), LeasesClient::new(channel));
                    break;
                }
                Err(e) if urls.len() > 1 => errors.push(format!("{u}: {}", connect_cause(&e))),
                Err(e) => errors.push(connect_cause(&e)),
            }
        }
        let Some(current) = urls.iter().find(|u| channels.contains_key(*u)).cloned() else {
            return Err(ClientError::Connect {
                url: urls.join(","),
                message: errors.join("; "),
            });
        };
        Ok(Self {
            servers: std::sync::Arc::new(Servers {
                urls,
                tls: options.tls,
                state: std::sync::Mutex::new(ServersState { current, channels }),
            }),
            authorization: options.authorization,
            rpc_timeout: RPC_TIMEOUT_DEFAULT,
            sessions: Default::default(),
            watching: Default::default(),
            holder: None,
        })
    }

    /// The client its watches use: the same servers and credentials on
    /// connections of their own (made on first use, shared by this
    /// client's watches), so a watcher that reads slowly never holds up,
    /// or brings down, the lease calls.
    fn with_own_connection(&self) -> Client {
        self.watching
            .get_or_init(|| self.fresh_connections())
            .clone()
    }

    fn fresh_connections(&self) -> Client {
        Client {
            servers: std::sync::Arc::new(Servers {
                urls: self.servers.urls.clone(),
                tls: self.servers.tls.clone(),
                state: std::sync::Mutex::new(ServersState {
                    current: self.current_server(),
                    channels: Default::default(),
                }),
            }),
            authorization: self.authorization.clone(),
            rpc_timeout: self.rpc_timeout,
            sessions: Default::default(),
            watching: Default::default(),
            holder: self.holder.clone(),
        }
    }

    /// The server this client sends its next call to.
    pub fn current_server(&self) -> String {
        self.servers
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .current
            .clone()
    }

    /// Sets the time allowed for each request beyond its server-side wait;
    /// also how long a call looks for the leader during a failover.
    pub fn with_rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = timeout;
        self
    }

    /// Describes who holds the leases this client acquires (for example
    /// `"report-worker-7 pid 4242"`; build it with [`Holder::parse`]): the
    /// server stores it with each lease and shows it in status, list,
    /// watch and its logs. It never decides anything. Its sessions are its
    /// own (not shared with the clones made before), and their acquires
    /// carry it too.
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self.sessions = Default::default();
        self
    }

    /// The holder description this client sends, if any.
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    fn request<T>(&self, message: T, extra: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.rpc_timeout + extra);
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        // The caller's span, when traces are exported: the server's span
        // for this call joins its trace.
        if let Some(parent) = baton_telemetry::traceparent()
            .and_then(|t| tonic::metadata::MetadataValue::try_from(t).ok())
        {
            request
                .metadata_mut()
                .insert(baton_telemetry::TRACEPARENT, parent);
        }
        request
    }

    /// Sends `message` to the leader. Followers' answers and refused
    /// connections are definite, so the call moves on (to the named leader,
    /// or the next server, pausing briefly once every server was tried)
    /// until `rpc_timeout`; any other failure is returned as it is.
    async fn call<M, R, F, Fut>(&self, message: M, extra: Duration, f: F) -> Result<R, ClientError>
    where
        M: Clone,
        F: Fn(LeasesClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut misses = 0usize;
        loop {
            let (url, channel) = self.servers.current()?;
            let status = match f(channel, self.request(message.clone(), extra)).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => status,
            };
            let several = self.servers.urls.len() > 1;
            misses += 1;
            let hint = redirect(&status);
            let last = if let Some(leader) = hint.as_ref().filter(|l| !l.is_empty() && **l != url) {
                self.servers.switch_to(leader);
                ClientError::Connect {
                    url,
                    message: format!("not the leader; the leader is {leader}"),
                }
            } else if hint.is_some() || never_connected(&status) {
                // Definite: a follower that knows no leader, or no connection.
                let e = ClientError::Connect {
                    url: url.clone(),
                    message: status.message().to_string(),
                };
                if !several {
                    // One server and it cannot serve: nothing else to try.
                    return Err(e);
                }
                self.servers.rotate(&url);
                e
            } else {
                // Possibly applied: never repeated. The next call tries
                // another server first if this one may be gone.
                let server_trouble = matches!(
                    status.code(),
                    Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
                );
                if several && server_trouble {
                    self.servers.rotate(&url);
                }
                return Err(failed_at(status, &url, self.rpc_timeout + extra));
            };
            if started.elapsed() >= self.rpc_timeout {
                return Err(last);
            }
            if misses >= self.servers.urls.len().max(2) {
                misses = 0;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }

    /// Acquires one resource. `wait` of zero tries once; otherwise the
    /// request waits in line (first come, first served) up to `wait`.
    pub async fn acquire(
        &mut self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Acquired, ClientError> {
        Acquired::from_all(self.acquire_all(&[resource], ttl, wait).await?)
    }

    /// Acquires every resource or none, in one request, without deadlock
    /// against other clients asking for overlapping sets in other orders.
    pub async fn acquire_all(
        &mut self,
        resources: &[&str],
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let message = v1::AcquireRequest {
            resources: resources.iter().map(|r| r.to_string()).collect(),
            ttl_ms: optional_millis(ttl, "ttl")?,
            wait_ms: millis(wait, "wait")?,
            holder: self.holder.as_ref().map(|h| h.to_string()),
        };
        let span = observe::span("acquire", resources);
        let sent = Instant::now();
        let answer = self
            .call(message, wait, |mut c, r| async move { c.acquire(r).await })
            .instrument(span.clone())
            .await
            .and_then(|response| acquired_all(response, resources.len(), sent));
        observe::acquired(&span, &answer, sent.elapsed());
        answer
    }

    /// Extends the lease by its TTL if `id` still holds it; "not owner" otherwise (nothing is extended).
    pub async fn renew(
        &mut self,
        resource: &str,
        id: &AcquisitionId,
    ) -> Result<Renewal, ClientError> {
        let message = v1::RenewRequest {
            resource: resource.to_string(),
            acquisition_id: id.as_bytes().to_vec(),
        };
        let sent = Instant::now();
        let r = self
            .call(message, Duration::ZERO, |mut c, r| async move {
                c.renew(r).await
            })
            .instrument(observe::span("renew", &[resource]))
            .await?;
        renewal(r, sent)
    }

    /// Gives the lease back if `id` holds it; an old or wrong id changes nothing.
    pub async fn release(
        &mut self,
        resource: &str,
        id: &AcquisitionId,
    ) -> Result<Release, ClientError> {
        let message = v1::ReleaseRequest {
            resource: resource.to_string(),
            acquisition_id: id.as_bytes().to_vec(),
        };
        let r = self
            .call(message, Duration::ZERO, |mut c, r| async move {
                c.release(r).await
            })
            .instrument(observe::span("release", &[resource]))
            .await?;
        release(r)
    }

    /// Holder token, remaining TTL and waiters of a resource.
    pub async fn status(&mut self, resource: &str) -> Result<Status, ClientError> {
        let message = v1::StatusRequest {
            resource: resource.to_string(),
        };
        status(
            self.call(message, Duration::ZERO, |mut c, r| async move {
                c.status(r).await
            })
            .await?,
        )
    }

    /// One page of resources with a lease or waiters, in name order.
    pub async fn list(
        &mut self,
        prefix: &str,
        start_after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Status>, ClientError> {
        let message = v1::ListRequest {
            prefix: prefix.to_string(),
            start_after: start_after.unwrap_or_default().to_string(),
            limit,
        };
        let r = self
            .call(message, Duration::ZERO, |mut c, r| async move {
                c.list(r).await
            })
            .await?;
        r.entries.into_iter().map(status).collect()
    }

    /// Operator fence: revokes the lease and returns a token above every earlier one.
    pub async fn fence(&mut self, resource: &str) -> Result<Fenced, ClientError> {
        let message = v1::FenceRequest {
            resource: resource.to_string(),
        };
        let r = self
            .call(message, Duration::ZERO, |mut c, r| async move {
                c.fence(r).await
            })
            .await?;
        Ok(Fenced {
            token: token(r.token)?,
            revoked: if r.revoked {
                Some(token(r.revoked_token)?)
            } else {
                None
            },
        })
    }

    /// A consistent snapshot of the server's durable state.
    pub async fn backup(&mut self) -> Result<Snapshot, ClientError> {
        self.call(
            v1::BackupRequest {},
            Duration::from_secs(60),
            // A snapshot is about 52 bytes per lease: far past tonic's
            // default 4 MiB limit at 100k leases.
            |c, r| async move {
                c.max_decoding_message_size(SNAPSHOT_LEN_BYTES_MAX)
                    .backup(r)
                    .await
            },
        )
        .await
    }

    /// The cluster as the server this client talks to sees it (any server
    /// answers, leader or follower; nothing is redirected).
    pub async fn cluster_status(&mut self) -> Result<v1::ClusterStatusResponse, ClientError> {
        let (_, mut c) = self.servers.current()?;
        Ok(
            c.cluster_status(self.request(v1::ClusterStatusRequest {}, Duration::ZERO))
                .await
                .map_err(from_status)?
                .into_inner(),
        )
    }
}

/// The README's Rust examples, compiled as doc tests so they stay complete
/// (imports, `#[tokio::main]`) and current.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
