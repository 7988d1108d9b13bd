//! The table's private state: leases, wait queues, waiters, timers.

use std::collections::VecDeque;

use std::collections::BTreeSet;

use crate::{
    AcquisitionDigest, AcquisitionId, FencingToken, Holder, ResourceName, SessionDigest, WaiterId,
};

use super::MonoMs;

#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) acquisition_digest: AcquisitionDigest,
    pub(super) token: FencingToken,
    pub(super) ttl_ms: u64,
    /// Unused (`MonoMs::MAX`) when the lease is tied to a session: the
    /// session's own expiry governs it.
    pub(super) expires_at: MonoMs,
    pub(super) session: Option<SessionDigest>,
    pub(super) holder: Option<Holder>,
}

/// An open session: its expiry, and what is tied to it.
#[derive(Clone, Debug)]
pub(super) struct Session {
    pub(super) ttl_ms: u64,
    pub(super) expires_at: MonoMs,
    pub(super) leases: BTreeSet<ResourceName>,
    pub(super) waiters: BTreeSet<WaiterId>,
    /// Leases of this session fenced since its last heartbeat: the next
    /// heartbeat's answer tells the client (bounded by the session's leases).
    pub(super) revoked: Vec<(ResourceName, FencingToken)>,
    /// The principal that opened it, if it was opened authenticated.
    pub(super) opener: Option<String>,
}

/// A resource's waiters, FIFO. Most resources never have one, so the queue
/// is allocated on first use: a held resource costs 8 bytes here, not 24
/// (10M live leases are the benchmark's top row).
#[derive(Clone, Debug, Default)]
#[allow(clippy::box_collection)] // the box is the point: 8 bytes per idle resource, not 24
pub(super) struct Queue(Option<Box<VecDeque<WaiterId>>>);

impl Queue {
    pub(super) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.is_empty())
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    pub(super) fn front(&self) -> Option<&WaiterId> {
        self.0.as_ref()?.front()
    }

    pub(super) fn push_back(&mut self, waiter: WaiterId) {
        self.0
            .get_or_insert_with(Default::default)
            .push_back(waiter);
    }

    pub(super) fn pop_front(&mut self) -> Option<WaiterId> {
        let q = self.0.as_mut()?;
        let head = q.pop_front();
        if q.is_empty() {
            self.0 = None;
        }
        head
    }

    pub(super) fn retain(&mut self, keep: impl FnMut(&WaiterId) -> bool) {
        if let Some(q) = self.0.as_mut() {
            q.retain(keep);
            if q.is_empty() {
                self.0 = None;
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct ResourceState {
    pub(super) lease: Option<Lease>,
    pub(super) queue: Queue,
}

impl ResourceState {
    pub(super) fn is_idle(&self) -> bool {
        self.lease.is_none() && self.queue.is_empty()
    }
}

#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) claims: Vec<(ResourceName, AcquisitionId)>,
    pub(super) ttl_ms: u64,
    pub(super) deadline: MonoMs,
    /// When the request joined the line.
    pub(super) queued_at: MonoMs,
    pub(super) session: Option<SessionDigest>,
    pub(super) holder: Option<Holder>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    WaitDeadline(WaiterId),
    SessionExpiry(SessionDigest),
    /// The next bounded step of an ended session's leases (see `drain.rs`).
    SessionDrain(SessionDigest),
}

/// An ended session whose leases are still being dropped, a bounded number
/// per step. Its leases are already gone for every caller: each
/// per-resource call drops the one it touches first (`settle`).
#[derive(Clone, Debug)]
pub(super) struct Draining {
    pub(super) leases: BTreeSet<ResourceName>,
    /// The session ran out (its leases expired) rather than being closed.
    pub(super) expired: bool,
}
