//! Each lease operation written once, whatever the transport. A unary
//! call and a session stream's request both come here after the gate let
//! the caller in (the first step everywhere), and each goes the same way:
//! decode and validate, authorize each name, hand the command to the
//! engine. The transports only unpack their message into these arguments
//! and pack the answer; the metrics of an operation are recorded here, so
//! they count every transport.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use baton_core::{
    AcquireError, AcquireRequest, AcquisitionId, LeaseStatus, LeaseTerm, ReleaseOutcome,
    RenewOutcome, ResourceName, SessionDigest, WaiterId,
};
use baton_proto::{LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX};
use tokio::sync::oneshot;
use tonic::Status;

use super::LeaseService;
use super::{answer, parse_acquisition_id, parse_claims, parse_holder, parse_resource, send};
use crate::access::auth::Permission;
use crate::access::Admitted;
use crate::cluster::seat::Term;
use crate::engine::{AcquireReply, Command};
use crate::metrics::Metrics;

/// What an acquire asks, unpacked from either transport's message.
pub(super) struct AcquireAsk<'a> {
    pub(super) resources: &'a [String],
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
    rx: oneshot::Receiver<Result<AcquireReply, AcquireError>>,
    /// The waiter to withdraw if the caller goes away (set when it may wait).
    pub(super) waiter: Option<WaiterId>,
    started: Instant,
    metrics: Arc<Metrics>,
}

impl Acquiring {
    /// The engine's answer. A grant that did not wait feeds the acquire
    /// latency histogram, whichever transport asked.
    pub(super) async fn answer(self) -> Result<Result<AcquireReply, AcquireError>, Status> {
        let out = answer(self.rx).await?;
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
        let (claims, attempt) = parse_claims(ask.resources, ask.request_id, ask.first_sent_ms_ago)?;
        for (name, _) in &claims {
            who.may(Permission::Lease, name.as_str())?;
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
            rx,
            waiter: (ask.wait_ms > 0).then_some(waiter),
            started,
            metrics: self.metrics.clone(),
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
        if prefix.len() > baton_core::RESOURCE_NAME_LEN_BYTES_MAX {
            return Err(Status::invalid_argument(format!(
                "prefix is {} bytes; the limit is {} bytes",
                prefix.len(),
                baton_core::RESOURCE_NAME_LEN_BYTES_MAX
            )));
        }
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
