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

mod answers;
pub mod deadline;
mod dial;
mod election;
mod error;
pub mod flags;
pub mod observe;
pub mod rng;
mod security;
mod servers;
mod session;
pub mod watch;

use std::time::Duration;

use baton_core::{AcquisitionId, Holder};
use baton_proto::v1::{self, leases_client::LeasesClient};
use servers::{normalize, redirect, Servers, Unreachable};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request};
use tracing::Instrument;

pub mod worker;

use answers::{
    acquired_all, millis, optional_millis, optional_token, release, renewal, status, token,
};
pub use answers::{Acquired, AcquiredAll, Fenced, Lease, NotAcquired, Release, Renewal, Status};
pub use baton_core;
pub use baton_proto::v1::Snapshot;
pub use dial::NotDialed;
pub use election::{Election, Leader, LeaderChange, Leadership, Observer};
pub use error::ClientError;
use error::{error_chain, failed_at, from_status, never_connected, server_trouble};
pub use security::{ConnectOptions, DIAL_TIMEOUT_DEFAULT};
pub use session::{Health, Session, SessionState};
pub use watch::{Watch, WatchEvent, WatchHolder, WatchKind};

/// The snapshot whose parts `parts` carries: the first part's header and
/// every part's leases and sessions.
async fn gather(mut parts: tonic::Streaming<Snapshot>) -> Result<Snapshot, tonic::Status> {
    let mut whole: Option<Snapshot> = None;
    while let Some(part) = parts.message().await? {
        match &mut whole {
            None => whole = Some(part),
            Some(w) => {
                w.stored_leases.extend(part.stored_leases);
                w.sessions.extend(part.sessions);
            }
        }
    }
    whole.ok_or_else(|| tonic::Status::internal("the backup ended before its first part"))
}

/// Whether a call may be sent again after its request may have reached a
/// server: a read may, an effect never (its outcome is then unknown), and
/// an acquire carrying a request id may once marked as a repeat (the
/// function marks it, given the time since its first attempt was sent).
enum Kind<M> {
    Read,
    Effect,
    Repeatable(fn(&mut M, Duration)),
}

// By hand: derived, they would ask `M` to be `Copy` too.
impl<M> Clone for Kind<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Kind<M> {}

/// Marks an acquire as a repeat of the one first sent `since` ago: the
/// same request id, the time since its first attempt, and what is left of
/// its wait.
fn repeat_acquire(message: &mut v1::AcquireRequest, since: Duration) {
    let since_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
    message.first_sent_ms_ago = Some(since_ms.max(1));
    message.wait_ms = message.wait_ms.saturating_sub(since_ms);
}

/// A fresh request id: 16 bytes of the thread's cryptographic generator
/// (ChaCha12 seeded from the operating system, `rand::rng`), as the
/// server draws acquisition ids: a request id is as secret as they are.
pub(crate) fn request_id() -> Vec<u8> {
    use rand::Rng;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes.to_vec()
}

/// Time allowed for a request beyond any server-side wait it asks for.
const RPC_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The largest backup the client reads: a protobuf message's own limit
/// (2 GiB), tens of millions of leases.
const SNAPSHOT_LEN_BYTES_MAX: usize = i32::MAX as usize;

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
    /// Connects to `url` (for example `127.0.0.1:7700`), or to the first
    /// to answer of several separated by commas (the servers of one
    /// cluster), all dialed at once. An address is `HOST` (port 7700),
    /// `HOST:PORT`, `[IPv6]:PORT`, a bare `PORT` (on 127.0.0.1) or a URL.
    /// Calls go to the leader: a follower's answer names it and the call
    /// is sent there, which is safe because a follower does nothing. A
    /// server that refuses connections, does not resolve, or does not
    /// answer a new connection within the dial timeout is passed over for
    /// a while (nothing was sent to it). A call that may have taken effect
    /// is never repeated: it is reported as [`ClientError::Indeterminate`];
    /// reads (status, list, watch) are repeated on another server instead.
    pub async fn connect(url: &str) -> Result<Self, ClientError> {
        Self::connect_with(url, ConnectOptions::default()).await
    }

    /// [`Client::connect`] over TLS and/or with a bearer token (see
    /// [`ConnectOptions`]). With TLS, a bare `host:port` means `https://`,
    /// and an `http://` URL is refused.
    pub async fn connect_with(url: &str, options: ConnectOptions) -> Result<Self, ClientError> {
        let tls = options.tls.is_some();
        let urls = url
            .split(',')
            .filter(|u| !u.trim().is_empty())
            .map(|u| normalize(u, tls))
            .collect::<Result<Vec<String>, ClientError>>()?;
        for u in &urls {
            options.check_scheme(u)?;
        }
        if urls.is_empty() {
            return Err(ClientError::Invalid(format!(
                "server url {url:?}: no address given"
            )));
        }
        let servers = Servers::new(urls, options.tls, options.dial_timeout);
        servers.find(&mut Unreachable::new()).await?;
        Ok(Self {
            servers: std::sync::Arc::new(servers),
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
        let servers = Servers::new(
            self.servers.urls.clone(),
            self.servers.tls.clone(),
            self.servers.dial_timeout,
        );
        servers.switch_to(&self.current_server());
        Client {
            servers: std::sync::Arc::new(servers),
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

    /// Sends `message` to the leader. Followers' answers and failed dials
    /// are definite, so the call moves on (to the named leader, or to the
    /// first other member that answers, pausing briefly while no member
    /// knows a leader) until `rpc_timeout`; once every member failed to
    /// dial, it ends at once. A `Read` whose connection broke or timed out
    /// is sent again to another member; any other failure is returned as
    /// it is.
    async fn call<M, R, F, Fut>(
        &self,
        mut message: M,
        extra: Duration,
        kind: Kind<M>,
        f: F,
    ) -> Result<R, ClientError>
    where
        M: Clone,
        F: Fn(LeasesClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut misses = 0usize;
        let mut unreachable = Unreachable::new();
        loop {
            let (url, channel) = self.servers.current(&mut unreachable).await?;
            let status = match f(channel, self.request(message.clone(), extra)).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => status,
            };
            let hint = redirect(&status);
            let last = if let Some(leader) = hint.as_ref().filter(|l| !l.is_empty() && **l != url) {
                self.servers.switch_to(leader);
                ClientError::Connect {
                    url,
                    message: format!("not the leader; the leader is {leader}"),
                }
            } else if hint.is_some() {
                misses += 1;
                self.no_leader_at(&url, &status)?
            } else if never_connected(&status) {
                // Definite: nothing was sent. The next turn dials the others.
                let why = from_status(status).to_string();
                self.servers.pass_over(&url);
                unreachable.push((url, why));
                continue;
            } else if !matches!(kind, Kind::Effect) && server_trouble(&status) {
                // A read, or an acquire whose answer was lost: sent again
                // (the acquire marked as a repeat) until its time is up.
                self.servers.pass_over(&url);
                let budget = self.rpc_timeout + extra;
                match kind {
                    Kind::Repeatable(mark) if started.elapsed() < budget => {
                        mark(&mut message, started.elapsed());
                        continue;
                    }
                    _ => failed_at(status, &url, budget),
                }
            } else {
                return Err(self.possibly_applied(status, &url, self.rpc_timeout + extra));
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

    /// A follower that knows no leader answered: definite. The error to
    /// report if the call ends here; `Err` (at once) with a single server.
    fn no_leader_at(&self, url: &str, status: &tonic::Status) -> Result<ClientError, ClientError> {
        let e = ClientError::Connect {
            url: url.to_string(),
            message: status.message().to_string(),
        };
        if self.servers.urls.len() == 1 {
            return Err(e);
        }
        self.servers.rotate(url);
        Ok(e)
    }

    /// A call that may have been applied failed: never repeated. The next
    /// call dials the others first if this one may be gone.
    fn possibly_applied(&self, status: tonic::Status, url: &str, budget: Duration) -> ClientError {
        if self.servers.urls.len() > 1 && server_trouble(&status) {
            self.servers.pass_over(url);
        }
        failed_at(status, url, budget)
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
            request_id: request_id(),
            first_sent_ms_ago: None,
        };
        let span = observe::span("acquire", resources);
        // A lease answered to a repeat counts from here, the first
        // attempt's send time, too.
        let sent = Instant::now();
        let kind = Kind::Repeatable(repeat_acquire);
        let answer = self
            .call(
                message,
                wait,
                kind,
                |mut c, r| async move { c.acquire(r).await },
            )
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
            .call(
                message,
                Duration::ZERO,
                Kind::Effect,
                |mut c, r| async move { c.renew(r).await },
            )
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
            .call(
                message,
                Duration::ZERO,
                Kind::Effect,
                |mut c, r| async move { c.release(r).await },
            )
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
            self.call(message, Duration::ZERO, Kind::Read, |mut c, r| async move {
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
            .call(message, Duration::ZERO, Kind::Read, |mut c, r| async move {
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
            .call(
                message,
                Duration::ZERO,
                Kind::Effect,
                |mut c, r| async move { c.fence(r).await },
            )
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

    /// A consistent snapshot of the server's durable state: received in
    /// parts (`BackupParts`), or whole from a server that predates them.
    pub async fn backup(&mut self) -> Result<Snapshot, ClientError> {
        self.call(
            v1::BackupRequest {},
            Duration::from_secs(60),
            Kind::Read,
            |c, r| async move {
                // A whole snapshot is about 52 bytes per lease: far past
                // tonic's default 4 MiB limit at 100k leases.
                let mut c = c.max_decoding_message_size(SNAPSHOT_LEN_BYTES_MAX);
                let (metadata, _, message) = r.into_parts();
                let again = || Request::from_parts(metadata.clone(), Default::default(), message);
                match c.backup_parts(again()).await {
                    Ok(parts) => gather(parts.into_inner()).await.map(tonic::Response::new),
                    // A server from before `BackupParts`.
                    Err(s) if s.code() == Code::Unimplemented => c.backup(again()).await,
                    Err(s) => Err(s),
                }
            },
        )
        .await
    }

    /// The cluster as the server this client talks to sees it (any server
    /// answers, leader or follower; nothing is redirected).
    pub async fn cluster_status(&mut self) -> Result<v1::ClusterStatusResponse, ClientError> {
        let (_, mut c) = self.servers.current(&mut Unreachable::new()).await?;
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
