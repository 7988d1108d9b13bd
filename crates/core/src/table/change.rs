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
