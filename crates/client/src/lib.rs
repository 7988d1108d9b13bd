//! Rust client for the Baton lease service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton_client::ClientError> {
//! use std::time::Duration;
//! use baton_client::{Client, Acquired};
//!
//! let mut client = Client::connect("http://127.0.0.1:7700").await?;
//! match client.acquire("statement:account-42:2026-09-13", Some(Duration::from_secs(30)), Duration::ZERO).await? {
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
mod call;
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
pub use baton_core::{Shape, PERMITS_MAX};
use baton_proto::v1;
use call::{repeat_acquire, request_id, Kind};
use servers::{normalize, Servers, Unreachable};
use tokio::time::Instant;

use tonic::{Code, Request};
use tracing::Instrument;

pub mod worker;

use answers::{
    acquired_all, millis, optional_millis, optional_token, release, renewal, status, token,
    ttl_millis, wire_shapes,
};
pub use answers::{
    Acquired, AcquiredAll, Blocker, BlockingHolder, Fenced, Lease, NotAcquired, Release, Renewal,
    SlotHolder, Status,
};
pub use baton_core;
pub use baton_proto::v1::Snapshot;
pub use dial::NotDialed;
pub use election::{Election, Leader, LeaderChange, Leadership, Observer};
pub use error::ClientError;
use error::{error_chain, from_status};
pub use security::{ConnectOptions, DIAL_TIMEOUT_DEFAULT};
pub use session::{Health, Session, SessionState};
pub use watch::{Watch, WatchEvent, WatchHolder, WatchKind, WatchUpdate, RESUME_FOR};

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

    /// Acquires one resource for `ttl` (`None`: the server's default TTL).
    /// `wait` of zero tries once; otherwise the request waits in line
    /// (first come, first served) up to `wait`.
    pub async fn acquire(
        &mut self,
        resource: &str,
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<Acquired, ClientError> {
        Acquired::from_all(self.acquire_all(&[resource], ttl, wait).await?)
    }

    /// Acquires every resource or none, in one request, without deadlock
    /// against other clients asking for overlapping sets in other orders.
    pub async fn acquire_all(
        &mut self,
        resources: &[&str],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let exclusive: Vec<_> = resources.iter().map(|r| (*r, Shape::Exclusive)).collect();
        self.acquire_shaped(&exclusive, ttl, wait).await
    }

    /// Acquires every resource or none, each held as its [`Shape`] asks:
    /// exclusive, shared (beside other shared holders), or as a permit of
    /// a semaphore of N. A resource is a lock or a semaphore of one N while
    /// it has holders or waiters: a request of the other kind or N is
    /// refused ([`ClientError::Invalid`], naming both). Each shared or
    /// permit lease carries its slot ([`Lease::slot`]).
    pub async fn acquire_shaped(
        &mut self,
        claims: &[(&str, Shape)],
        ttl: Option<Duration>,
        wait: Duration,
    ) -> Result<AcquiredAll, ClientError> {
        let resources: Vec<&str> = claims.iter().map(|(r, _)| *r).collect();
        let resources = resources.as_slice();
        let message = v1::AcquireRequest {
            shapes: wire_shapes(claims.iter().map(|(_, s)| *s))?,
            resources: resources.iter().map(|r| r.to_string()).collect(),
            ttl_ms: ttl_millis(ttl)?,
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

    /// Operator: changes a semaphore's number of permits while it has
    /// holders or waiters; returns the number it replaced. Lowering it
    /// revokes no permit held (no new one is granted until fewer are
    /// held); raising it grants waiters at once. Safe to repeat.
    pub async fn set_permits(&mut self, resource: &str, permits: u32) -> Result<u32, ClientError> {
        if permits == 0 || permits > PERMITS_MAX {
            return Err(ClientError::Invalid(format!(
                "permits {permits}: a semaphore has from 1 to {PERMITS_MAX} permits"
            )));
        }
        let message = v1::SetPermitsRequest {
            resource: resource.to_string(),
            permits,
        };
        let r = self
            .call(
                message,
                Duration::ZERO,
                Kind::Effect,
                |mut c, r| async move { c.set_permits(r).await },
            )
            .await?;
        Ok(r.previous)
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

/// The usage manual's Rust examples, compiled the same way.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/usage.md")]
pub struct UsageDoctests;
