//! Read-only questions to the table: status, listing, and the leases in
//! durable form. Each is O(log n) plus what it returns.

use std::{collections::VecDeque, ops::Bound};

use super::state::{Lease, ResourceState};
use super::SessionRecord;
use super::{LeaseRecord, LeaseStatus, LeaseTable, MonoMs, SlotStatus};
use crate::ResourceName;

impl LeaseTable {
    /// Holder token, remaining TTL and waiters of one resource (never the acquisition id).
    pub fn status(&mut self, now: MonoMs, resource: &ResourceName) -> LeaseStatus {
        self.tick(now);
        self.settle_and_pump(now, resource);
        self.status_of(now, resource, self.resources.get(resource).map(|s| &**s))
    }

    fn status_of(
        &self,
        now: MonoMs,
        resource: &ResourceName,
        state: Option<&ResourceState>,
    ) -> LeaseStatus {
        // An ended session's lease is gone, though its batch has not come.
        let lease = state
            .and_then(|s| s.lease.as_ref())
            .filter(|l| !self.is_gone(l));
        let slots = self
            .groups
            .get(resource)
            .into_iter()
            .flatten()
            .filter_map(|&slot| {
                let l = self.resources.get(&resource.slot(slot))?.lease.as_ref()?;
                (!self.is_gone(l)).then(|| SlotStatus {
                    slot,
                    token: l.token,
                    remaining_ms: self.expiry_of(l).left_at(now),
                    ttl_ms: l.ttl_ms(),
                    holder: l.holder().cloned(),
                })
            })
            .collect();
        LeaseStatus {
            resource: resource.clone(),
            holder_token: lease.map(|l| l.token),
            remaining_ms: lease.map_or(0, |l| self.expiry_of(l).left_at(now)),
            ttl_ms: lease.map_or(0, |l| l.ttl_ms()),
            n_waiters: self.queue(resource).map_or(0, VecDeque::len),
            holder: lease.and_then(|l| l.holder().cloned()),
            issued_through: self.issued_through(),
            kind: self.kind_in(resource, state),
            slots,
        }
    }

    /// Resources with a lease or waiters whose name starts with `prefix`, in
    /// name order, after `start_after`, at most `limit` of them. A resource
    /// whose ended session's lease is still to be dropped is listed as not
    /// held (listing changes nothing, so that a long list cannot end a big
    /// session in one step).
    pub fn list(
        &mut self,
        now: MonoMs,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Vec<LeaseStatus> {
        self.tick(now);
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.resources
            .range_from::<str>(lower)
            .take_while(|(r, _)| r.as_str().starts_with(prefix))
            // A shared holder or a permit is shown with its resource.
            .filter(|(r, _)| r.split_slot().is_none())
            .take(limit)
            .map(|(r, s)| self.status_of(now, r, Some(s)))
            .collect()
    }

    /// Every held lease in durable form (for snapshots).
    pub fn leases(&self) -> impl Iterator<Item = (&ResourceName, LeaseRecord)> {
        self.resources.iter().filter_map(|(r, s)| {
            let l = s.lease.as_ref().filter(|l| !self.is_gone(l))?;
            Some((r, self.record_of(r, l)))
        })
    }

    /// The durable form of `lease`, kept under `name`.
    pub(super) fn record_of(&self, name: &ResourceName, lease: &Lease) -> LeaseRecord {
        LeaseRecord {
            acquisition_digest: lease.acquisition_digest,
            token: lease.token,
            ttl_ms: lease.ttl_ms(),
            session: lease.session(),
            holder: lease.holder().cloned(),
            shape: self.shape_of(name),
        }
    }

    /// Every open session in durable form (for snapshots).
    pub fn sessions(&self) -> impl Iterator<Item = SessionRecord> + '_ {
        self.sessions.iter().map(|(digest, s)| SessionRecord {
            digest: *digest,
            ttl_ms: s.ttl_ms,
            opener: s.opener.clone(),
        })
    }

    /// When `lease` expires: its own deadline, or its session's.
    pub(super) fn expiry_of(&self, lease: &Lease) -> MonoMs {
        match lease.session() {
            Some(digest) => self.sessions[&digest].expires_at,
            None => lease.expires_at,
        }
    }
}
