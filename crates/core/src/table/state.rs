//! The table's private state: leases, wait queues, waiters, timers.

use std::collections::BTreeSet;

use crate::{AcquisitionDigest, FencingToken, Holder, ResourceName, SessionDigest, WaiterId};

use super::MonoMs;

/// A held lease: 48 bytes, with what most leases lack (a session, a
/// holder's description) behind one box, so that 10 million of them fit in
/// the memory the benchmark allows.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) acquisition_digest: AcquisitionDigest,
    pub(super) token: FencingToken,
    /// Unused (`MonoMs::MAX`) when the lease is tied to a session: the
    /// session's own expiry governs it.
    pub(super) expires_at: MonoMs,
    ties: Option<Box<Ties>>,
    /// At most [`TTL_MS_MAX`](crate::TTL_MS_MAX) (the table's limits are).
    ttl_ms: u32,
    since: Since,
}

/// Since when a lease is held, in whole seconds of the table's clock: its
/// grant, or the recovery (a restart or a takeover) that loaded it, which
/// the top bit says.
#[derive(Clone, Copy, Debug)]
struct Since(u32);

impl Since {
    const RECOVERED: u32 = 1 << 31;

    fn at(now: MonoMs, recovered: bool) -> Self {
        let s = (now.0 / 1000).min(u64::from(Self::RECOVERED - 1)) as u32;
        Self(if recovered { s | Self::RECOVERED } else { s })
    }
}

/// How long a lease has been held, for a caller it blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldFor {
    /// Whole seconds since the grant, or since the recovery that loaded
    /// the lease (a restart or a leader's takeover), on this server's clock.
    pub held_s: u64,
    /// The lease was granted before that recovery: `held_s` counts from
    /// the recovery, and it has been held longer.
    pub recovered: bool,
}

/// The session a lease is tied to and its holder's description.
#[derive(Clone, Debug)]
struct Ties {
    session: Option<SessionDigest>,
    holder: Option<Holder>,
}

impl Lease {
    /// A lease granted (or, `recovered`, loaded) at `now`. A TTL above
    /// [`TTL_MS_MAX`](crate::TTL_MS_MAX) (only a record stored under other
    /// limits) is kept as that: its renewals are the longest the table
    /// grants, and `expires_at` already holds its full first term.
    pub(super) fn new(
        (acquisition_digest, token): (AcquisitionDigest, FencingToken),
        ttl_ms: u64,
        (now, recovered): (MonoMs, bool),
        expires_at: MonoMs,
        session: Option<SessionDigest>,
        holder: Option<Holder>,
    ) -> Self {
        let ties =
            (session.is_some() || holder.is_some()).then(|| Box::new(Ties { session, holder }));
        Self {
            acquisition_digest,
            token,
            expires_at,
            ties,
            ttl_ms: ttl_ms.min(crate::TTL_MS_MAX) as u32,
            since: Since::at(now, recovered),
        }
    }

    /// Its TTL.
    pub(super) fn ttl_ms(&self) -> u64 {
        u64::from(self.ttl_ms)
    }

    /// How long it has been held at `now`.
    pub(super) fn held_for(&self, now: MonoMs) -> HeldFor {
        let since_s = u64::from(self.since.0 & !Since::RECOVERED);
        HeldFor {
            held_s: (now.0 / 1000).saturating_sub(since_s),
            recovered: self.since.0 & Since::RECOVERED != 0,
        }
    }

    /// The session the lease is tied to, if any.
    pub(super) fn session(&self) -> Option<SessionDigest> {
        self.ties.as_ref().and_then(|t| t.session)
    }

    /// The holder's description, if it gave one.
    pub(super) fn holder(&self) -> Option<&Holder> {
        self.ties.as_ref().and_then(|t| t.holder.as_ref())
    }

    /// Its token and holder, as an ended lease reports them.
    pub(super) fn into_token_and_holder(self) -> (FencingToken, Option<Holder>) {
        (self.token, self.ties.and_then(|t| t.holder))
    }
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

/// A resource in the table: held, or waited for (its waiters are in the
/// table's `queues`), or both. Boxed in the resources map, whose 16-byte
/// entries (a name and a box) make an entry put inside a chunk move little,
/// and a chunk's unused room cost little when names come in no order.
#[derive(Clone, Debug, Default)]
pub(super) struct ResourceState {
    pub(super) lease: Option<Lease>,
}

#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) claims: Vec<super::Claim>,
    pub(super) term: super::LeaseTerm,
    pub(super) deadline: MonoMs,
    /// When the request joined the line.
    pub(super) queued_at: MonoMs,
    pub(super) holder: Option<Holder>,
    /// Set when the request carries a request id (`repeats.rs`).
    pub(super) key: Option<super::repeats::RequestKey>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten million leases must fit in 2 GiB: a resource's state is boxed
    /// (one word in the map) into a 48-byte allocation, the rarely set
    /// fields of a lease sit behind one more box, and wait queues are kept
    /// apart, for the resources that have waiters.
    #[test]
    fn a_resource_costs_one_word_in_the_map_and_48_bytes_beside_it() {
        assert_eq!(std::mem::size_of::<Lease>(), 48);
        assert_eq!(std::mem::size_of::<ResourceState>(), 48);
        assert_eq!(std::mem::size_of::<Box<ResourceState>>(), 8);
        assert_eq!(std::mem::size_of::<ResourceName>(), 8);
    }
}
