//! Each lease operation written once, whatever the transport. A unary
//! call, a session stream's request and the page's call all come here
//! after the gate let the caller in (the first step everywhere), and each
//! goes the same way: decode and validate, authorize each name, hand the
//! command to the engine. The transports only unpack their message into
//! these arguments and pack the answer; the metrics of an operation are
//! recorded here, so they count every transport. Sessions (open, resume,
//! keep-alive, close) and watches have one transport each today, and
//! their operations are here all the same.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use baton_core::{
    AcquireError, AcquireRequest, AcquisitionId, KeptAlive, LeaseStatus, LeaseTerm, ReleaseOutcome,
    RenewOutcome, ResourceName, Resumed, SessionDigest, SessionError, WaiterId,
};
use baton_proto::{v1, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX};
use tokio::sync::oneshot;
use tonic::Status;

use super::LeaseService;
use super::{answer, parse_acquisition_id, parse_claims, parse_holder, parse_resource, send};
use crate::access::auth::Permission;
use crate::access::gate::SessionRefusal;
use crate::access::Admitted;
use crate::cluster::seat::Term;
use crate::engine::watch::WatchStart;
use crate::engine::{AcquireReply, Command};
use crate::metrics::Metrics;
use crate::quota::{Quotas, RateRefusal, WatchGuard};

/// What an acquire asks, unpacked from either transport's message.
pub(super) struct AcquireAsk<'a> {
    pub(super) resources: &'a [String],
    /// One per resource, or none (every resource exclusive).
    pub(super) shapes: &'a [v1::LockShape],
    pub(super) request_id: &'a [u8],
    pub(super) first_sent_ms_ago: Option<u64>,
    pub(super) holder: Option<&'a str>,
    pub(super) ttl_ms: Option<u64>,
    pub(super) wait_ms: u64,
    /// The session it was asked on: a lease that asks no TTL of its own
    /// is tied to it (a unary acquire gets the server's default TTL).
    pub(super) session: Option<SessionDigest>,
}

/// An acquire handed to the engine: the answer to await.
pub(super) struct Acquiring {
    pending: Pending,
    /// The waiter to withdraw if the caller goes away (set when it may wait).
    pub(super) waiter: Option<WaiterId>,
    started: Instant,
    metrics: Arc<Metrics>,
    quotas: Arc<Quotas>,
}

/// Where an acquire's answer comes from.
enum Pending {
    /// The engine.
    Engine(oneshot::Receiver<Result<AcquireReply, AcquireError>>),
    /// A rate quota, after its wait.
    Refused(RateRefusal),
}

impl Acquiring {
    /// The engine's answer. A grant that did not wait feeds the acquire
    /// latency histogram, whichever transport asked.
    pub(super) async fn answer(self) -> Result<Result<AcquireReply, AcquireError>, Status> {
        let out = match self.pending {
            Pending::Engine(rx) => answer(rx).await?,
            Pending::Refused(refusal) => return Err(refusal.answer().await),
        };
        if let Err(AcquireError::OverQuota(over)) = &out {
            self.quotas.count_refusal(over);
        }
        if let Ok(AcquireReply::Granted {
            after_wait: false, ..
        }) = &out
        {
            self.metrics
                .observe_acquire_latency_us(self.started.elapsed().as_micros() as u64);
        }
        Ok(out)
    }
}

impl LeaseService {
    /// Acquire, for a caller the gate let in.
    pub(super) fn acquire_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        ask: AcquireAsk<'_>,
    ) -> Result<Acquiring, Status> {
        let started = Instant::now();
        self.metrics.acquire_requests.inc();
        let (claims, attempt) = parse_claims(
            ask.resources,
            ask.shapes,
            ask.request_id,
            ask.first_sent_ms_ago,
        )?;
        for claim in &claims {
            who.may(Permission::Lease, claim.resource.as_str())?;
        }
        if let Err(refusal) = self.take_rate(who, claims.iter().map(|c| c.resource.as_str())) {
            return Ok(Acquiring {
                pending: Pending::Refused(refusal),
                waiter: None,
                started,
                metrics: self.metrics.clone(),
                quotas: self.quotas.clone(),
            });
        }
        let holder = parse_holder("holder", ask.holder)?;
        let lease_term = match (ask.ttl_ms, ask.session) {
            (None, Some(session)) => LeaseTerm::Session(session),
            (ttl_ms, _) => LeaseTerm::Own {
                ttl_ms: ttl_ms.unwrap_or(self.default_ttl_ms),
            },
        };
        let waiter = WaiterId(self.next_waiter.fetch_add(1, Relaxed));
        let request = AcquireRequest {
            claims,
            term: lease_term,
            wait_ms: ask.wait_ms,
            waiter,
            holder,
            attempt,
        };
        let (reply, rx) = oneshot::channel();
        send(term, Command::Acquire { request, reply })?;
        Ok(Acquiring {
            pending: Pending::Engine(rx),
            waiter: (ask.wait_ms > 0).then_some(waiter),
            started,
            metrics: self.metrics.clone(),
            quotas: self.quotas.clone(),
        })
    }

    /// Renew, for a caller the gate let in: the engine's answer to await.
    pub(super) fn renew_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        resource: &str,
        acquisition_id: &[u8],
    ) -> Result<oneshot::Receiver<RenewOutcome>, Status> {
        holder_op(
            who,
            term,
            (resource, acquisition_id),
            |resource, id, reply| Command::Renew {
                resource,
                id,
                reply,
            },
        )
    }

    /// Release, for a caller the gate let in: the engine's answer to await.
    pub(super) fn release_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        resource: &str,
        acquisition_id: &[u8],
    ) -> Result<oneshot::Receiver<ReleaseOutcome>, Status> {
        holder_op(
            who,
            term,
            (resource, acquisition_id),
            |resource, id, reply| Command::Release {
                resource,
                id,
                reply,
            },
        )
    }
}

impl LeaseService {
    /// Status, for a caller the gate let in: `read` on the resource.
    pub(super) async fn status_op(
        &self,
        who: &Admitted<'_>,
        resource: &str,
    ) -> Result<LeaseStatus, Status> {
        let resource = parse_resource("resource", resource)?;
        who.may(Permission::Read, resource.as_str())?;
        self.rate_or_wait(who, resource.as_str()).await?;
        self.call(|reply| Command::Status { resource, reply }).await
    }

    /// List, for a caller the gate let in: the request's bounds checked,
    /// then `read` on the prefix.
    pub(super) async fn list_op(
        &self,
        who: &Admitted<'_>,
        prefix: String,
        start_after: String,
        limit: u32,
    ) -> Result<Vec<LeaseStatus>, Status> {
        check_prefix(&prefix)?;
        if limit > LIST_LIMIT_MAX {
            return Err(Status::invalid_argument(format!(
                "limit {limit} is above the maximum {LIST_LIMIT_MAX}"
            )));
        }
        let limit = if limit == 0 {
            LIST_LIMIT_DEFAULT
        } else {
            limit
        } as usize;
        who.may(Permission::Read, &prefix)?;
        self.rate_or_wait(who, &prefix).await?;
        let start_after = (!start_after.is_empty()).then_some(start_after);
        self.list_entries(prefix, start_after, limit).await
    }

    /// Up to `limit` resources under `prefix` after `start_after`, in
    /// name order: the caller has checked `read` on `prefix`.
    pub(crate) async fn list_entries(
        &self,
        prefix: String,
        start_after: Option<String>,
        limit: usize,
    ) -> Result<Vec<LeaseStatus>, Status> {
        self.call(|reply| Command::List {
            prefix,
            start_after,
            limit,
            reply,
        })
        .await
    }

    /// An operator fence by `who`, wherever it was asked for (`baton
    /// fence`, the operator page): checked for `fence` on the resource and
    /// audited, whatever the outcome.
    pub(crate) async fn fence_as(
        &self,
        who: &Admitted<'_>,
        resource: ResourceName,
    ) -> Result<baton_core::FenceOutcome, Status> {
        who.may(Permission::Fence, resource.as_str())?;
        let name = resource.to_string();
        let out = self.call(|reply| Command::Fence { resource, reply }).await;
        match &out {
            Ok(o) => who.audit(&name, Some(o.token.get()), "ok"),
            Err(_) => who.audit(&name, None, "indeterminate"),
        }
        out
    }
}

impl LeaseService {
    /// An operator's change of a semaphore's number of permits: checked
    /// for `fence` on the resource (it decides who may hold it) and
    /// audited.
    pub(super) async fn set_permits_as(
        &self,
        who: &Admitted<'_>,
        resource: ResourceName,
        n_permits: u32,
    ) -> Result<u32, Status> {
        who.may(Permission::Fence, resource.as_str())?;
        let name = resource.to_string();
        let out = self
            .call(|reply| Command::SetPermits {
                resource,
                n_permits,
                reply,
            })
            .await;
        match &out {
            Ok(Ok(_)) => who.audit(&name, None, "ok"),
            Ok(Err(_)) => who.audit(&name, None, "refused"),
            Err(_) => who.audit(&name, None, "indeterminate"),
        }
        out?.map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

/// A holder's call on one lease (renew, release): the resource parsed and
/// authorized for `lease`, the acquisition id parsed, the command sent.
fn holder_op<T>(
    who: &Admitted<'_>,
    term: &Term,
    (raw_resource, raw_id): (&str, &[u8]),
    command: impl FnOnce(ResourceName, AcquisitionId, oneshot::Sender<T>) -> Command,
) -> Result<oneshot::Receiver<T>, Status> {
    let resource = parse_resource("resource", raw_resource)?;
    who.may(Permission::Lease, resource.as_str())?;
    let id = parse_acquisition_id(raw_id)?;
    let (reply, rx) = oneshot::channel();
    send(term, command(resource, id, reply))?;
    Ok(rx)
}

/// A session as `open` left it.
pub(super) enum Opened {
    /// A new session: its id (the client's secret) and TTL.
    New { id: AcquisitionId, ttl_ms: u64 },
    /// A session resumed (kept alive): its TTL and what was fenced since.
    Resumed { id: AcquisitionId, kept: KeptAlive },
    /// The session to resume is not open: it ended.
    Ended,
}

impl LeaseService {
    /// Opens a session (`resume` empty) or resumes one, for a caller the
    /// gate let in. Another principal that learned a session's id cannot
    /// resume it, nor take over (or close) its leases.
    pub(super) async fn open_session_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        resume: &[u8],
        ttl_ms: Option<u64>,
    ) -> Result<(SessionDigest, Opened), Status> {
        if !resume.is_empty() {
            let id = AcquisitionId::from_slice(resume).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "resume is {} bytes; a session id is exactly {} bytes",
                    resume.len(),
                    AcquisitionId::LEN_BYTES
                ))
            })?;
            let digest = id.digest();
            let (rx, refusal) = self.keep_alive_op(who, term, digest, true)?;
            let opened = match self.answer_on(term, rx).await? {
                Resumed::Kept(kept) => Opened::Resumed { id, kept },
                Resumed::NotOpen => Opened::Ended,
                Resumed::Refused => return Err(refused(refusal)),
            };
            return Ok((digest, opened));
        }
        let ttl_ms = ttl_ms.unwrap_or(self.default_ttl_ms);
        let id = super::random_id();
        let digest = id.digest();
        let opener = who.opener();
        self.call_on(term, |reply| Command::OpenSession {
            digest,
            ttl_ms,
            opener,
            reply,
        })
        .await?
        .map_err(|e| {
            if let SessionError::OverQuota(over) = &e {
                self.quotas.count_refusal(over);
            }
            session_error(e)
        })?;
        Ok((digest, Opened::New { id, ttl_ms }))
    }

    /// Keeps the session `digest` alive for a caller the gate let in;
    /// with `judge`, judged as a resume is (the caller must be its opener
    /// or hold `admin` on every name, and hold `lease` on what it holds):
    /// the engine's answer to await, and the refusal to give for
    /// [`Resumed::Refused`].
    pub(super) fn keep_alive_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        digest: SessionDigest,
        judge: bool,
    ) -> Result<(oneshot::Receiver<Resumed>, Option<SessionRefusal>), Status> {
        let (check, refusal) = judge
            .then(|| (who.session_check(), who.session_refusal()))
            .unzip();
        let (reply, rx) = oneshot::channel();
        send(
            term,
            Command::KeepAlive {
                digest,
                check,
                reply,
            },
        )?;
        Ok((rx, refusal))
    }

    /// Closes the session `digest` (its leases released) for a caller the
    /// gate let in, judged as a resume is: the engine's answer to await
    /// (`None`: refused, give the refusal), and the refusal.
    pub(super) fn close_session_op(
        &self,
        who: &Admitted<'_>,
        term: &Term,
        digest: SessionDigest,
    ) -> Result<(oneshot::Receiver<Option<bool>>, SessionRefusal), Status> {
        let (reply, rx) = oneshot::channel();
        send(
            term,
            Command::CloseSession {
                digest,
                check: who.session_check(),
                reply,
            },
        )?;
        Ok((rx, who.session_refusal()))
    }

    /// Watch, for a caller the gate let in: the prefix checked, `read` on
    /// it, its rate and watches quotas, then the engine's snapshot (or,
    /// resuming after a number, its kept changes) and registration. The
    /// guard counts the watch open until dropped.
    pub(super) async fn watch_op(
        &self,
        who: &Admitted<'_>,
        (prefix, after): (String, Option<u64>),
    ) -> Result<(WatchStart, WatchGuard), Status> {
        check_prefix(&prefix)?;
        who.may(Permission::Read, &prefix)?;
        self.rate_or_wait(who, &prefix).await?;
        let guard = self.quotas.open_watch(&prefix)?;
        let start = self
            .call(|reply| Command::Watch {
                prefix,
                after,
                reply,
            })
            .await?
            .map_err(super::watch::refused_resume)?;
        Ok((start, guard))
    }

    /// One request's token from the rate quotas over `names`, for `who`.
    /// Renewals, releases and heartbeats take none: they only keep or give
    /// back what the leases quota already counts.
    fn take_rate<'a>(
        &self,
        who: &Admitted<'_>,
        names: impl Iterator<Item = &'a str>,
    ) -> Result<(), RateRefusal> {
        let principal = who.principal().map(|p| p.name.as_str());
        self.quotas.take_rate(names, principal)
    }

    /// [`LeaseService::take_rate`] for one name or prefix; a refusal is
    /// answered after its wait.
    async fn rate_or_wait(&self, who: &Admitted<'_>, name: &str) -> Result<(), Status> {
        match self.take_rate(who, [name].into_iter()) {
            Ok(()) => Ok(()),
            Err(refusal) => Err(refusal.answer().await),
        }
    }
}

/// The status of a refused keep-alive or close.
pub(super) fn refused(refusal: Option<SessionRefusal>) -> Status {
    refusal.map_or_else(
        || Status::internal("a session call was refused without a check"),
        SessionRefusal::status,
    )
}

fn session_error(e: SessionError) -> Status {
    match e {
        SessionError::TooManySessions { .. } | SessionError::OverQuota(_) => {
            Status::resource_exhausted(e.to_string())
        }
        other => Status::invalid_argument(other.to_string()),
    }
}

/// A list's or a watch's prefix is at most a name's length and holds no
/// control character (no name does, so such a prefix could never match).
fn check_prefix(prefix: &str) -> Result<(), Status> {
    if prefix.len() > baton_core::RESOURCE_NAME_LEN_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "prefix is {} bytes; the limit is {} bytes",
            prefix.len(),
            baton_core::RESOURCE_NAME_LEN_BYTES_MAX
        )));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        return Err(Status::invalid_argument(format!(
            "prefix {prefix:?} holds the control character {c:?}; names never do"
        )));
    }
    Ok(())
}
