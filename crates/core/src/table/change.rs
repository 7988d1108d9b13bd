//! Holder changes as watchers and the operator page's history see them:
//! the events that grant, release, expire or fence a lease.

use super::Event;
use crate::{FencingToken, Holder, ResourceName};

/// A change of a resource's holder, as watchers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderChange {
    /// A lease was granted at once.
    Granted,
    /// A lease was granted to a request that waited in line (a hand-off).
    HandedOff,
    /// The holder released it (or closed its session).
    Released,
    /// Its TTL (or its session's) ran out.
    Expired,
    /// An operator fenced the resource.
    Fenced,
}

impl HolderChange {
    /// Its name on the command line and in JSON: `granted`, `handed_off`,
    /// `released`, `expired`, `fenced`.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderChange::Granted => "granted",
            HolderChange::HandedOff => "handed_off",
            HolderChange::Released => "released",
            HolderChange::Expired => "expired",
            HolderChange::Fenced => "fenced",
        }
    }

    /// The holder change an event is, if it is one.
    pub fn of(event: &Event) -> Option<ChangeOf<'_>> {
        let (kind, resource, token, revoked, holder) = match event {
            Event::Granted {
                resource,
                token,
                after_wait,
                holder,
                ..
            } => {
                let kind = if *after_wait {
                    HolderChange::HandedOff
                } else {
                    HolderChange::Granted
                };
                (kind, resource, *token, None, holder)
            }
            Event::Released {
                resource,
                token,
                holder,
            } => (HolderChange::Released, resource, *token, None, holder),
            Event::Expired {
                resource,
                token,
                holder,
            } => (HolderChange::Expired, resource, *token, None, holder),
            Event::Fenced {
                resource,
                token,
                revoked,
                holder,
            } => (HolderChange::Fenced, resource, *token, *revoked, holder),
            _ => return None,
        };
        Some(ChangeOf {
            kind,
            resource,
            token,
            revoked,
            holder: holder.as_ref(),
        })
    }
}

/// One holder change, borrowed from its [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeOf<'a> {
    /// What happened.
    pub kind: HolderChange,
    /// To which resource.
    pub resource: &'a ResourceName,
    /// The lease's token (for a fence, the fence's own).
    pub token: FencingToken,
    /// For a fence, the token of the lease it revoked, if one was held.
    pub revoked: Option<FencingToken>,
    /// The description of the holder the change concerns: the new one for
    /// a grant, the one that lost the lease otherwise.
    pub holder: Option<&'a Holder>,
}

/// A holder change, owned, as a watcher and the store's history keep it:
/// a shared holder's or a permit's slot apart from its resource's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// What happened.
    pub kind: HolderChange,
    /// The resource's own name (a shared holder's or a permit's too).
    pub resource: String,
    /// A shared holder's or a permit's slot.
    pub slot: Option<u32>,
    /// The lease's token (for a fence, the fence's own).
    pub token: FencingToken,
    /// For a fence, the token of the lease it revoked, if one was held.
    pub revoked: Option<FencingToken>,
    /// The description of the holder the change concerns.
    pub holder: Option<Holder>,
}

impl Change {
    /// The holder changes among `events`, in order.
    pub fn all_of(events: &[Event]) -> Vec<Change> {
        events
            .iter()
            .filter_map(HolderChange::of)
            .map(|c| {
                let (resource, slot) = match c.resource.split_slot() {
                    Some((resource, slot)) => (resource.to_owned(), Some(slot)),
                    None => (c.resource.to_string(), None),
                };
                Change {
                    kind: c.kind,
                    resource,
                    slot,
                    token: c.token,
                    revoked: c.revoked,
                    holder: c.holder.cloned(),
                }
            })
            .collect()
    }
}

/// A change with its sequence number: one order per cluster, the order
/// the store made the changes durable in (see `pipeline`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumberedChange {
    /// Rises by one per change, across restarts and leaders; a restore
    /// starts at its epoch's first number ([`first_seq`]).
    pub seq: u64,
    /// What changed.
    pub change: Change,
}

/// The sequence number before an epoch's first change: `epoch << 40`, as
/// its first token is. A restore starts a higher epoch, so its changes are
/// numbered above every change before it (as long as no epoch numbered
/// 2^40 changes).
pub fn first_seq(epoch: crate::Epoch) -> u64 {
    u64::from(epoch.get()) << crate::COUNTER_BITS
}

/// The most holder changes a server keeps for watchers to resume from
/// (`baton serve --watch-history`, at most this), and so the most a store
/// keeps.
pub const HISTORY_LEN_MAX: usize = 1_000_000;
