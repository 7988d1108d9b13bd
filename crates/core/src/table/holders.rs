//! What holders and operators do to leases already granted: renew and
//! release by acquisition id, and the operator's fence, which revokes
//! every holder of a resource.

use super::*;

impl LeaseTable {
    /// Extends a lease by its TTL from `now` if `id` still holds it; "not owner" otherwise (nothing is extended or recreated).
    /// Renewing a lease tied to a session keeps the whole session alive.
    pub fn renew(
        &mut self,
        now: MonoMs,
        resource: &ResourceName,
        id: &AcquisitionId,
    ) -> RenewOutcome {
        self.tick(now);
        self.settle_and_pump(now, resource);
        let Some((name, lease)) = self.held_by(resource, id) else {
            self.effects.events.push(Event::RenewRefused {
                resource: resource.clone(),
            });
            return RenewOutcome::NotOwner;
        };
        let (old, ttl_ms, token) = (lease.expires_at, lease.ttl_ms(), lease.token);
        if let Some(digest) = lease.session() {
            let ttl_ms = self.refresh_session(now, digest);
            self.effects.events.push(Event::Renewed {
                resource: resource.clone(),
                token,
            });
            return RenewOutcome::Renewed { token, ttl_ms };
        }
        let expires_at = now.end_of(ttl_ms);
        self.expiries.remove(&(old, name.clone()));
        self.expiries.insert((expires_at, name.clone()), ());
        let lease = self
            .resources
            .get_mut(&name)
            .and_then(|s| s.lease.as_mut())
            .expect("held");
        lease.expires_at = expires_at;
        self.effects.events.push(Event::Renewed {
            resource: resource.clone(),
            token,
        });
        RenewOutcome::Renewed { token, ttl_ms }
    }

    /// Gives a lease back if `id` holds it; hands the resource to the next waiter. An old or wrong id changes nothing.
    pub fn release(
        &mut self,
        now: MonoMs,
        resource: &ResourceName,
        id: &AcquisitionId,
    ) -> ReleaseOutcome {
        self.tick(now);
        self.settle_and_pump(now, resource);
        let Some((name, lease)) = self.held_by(resource, id) else {
            return ReleaseOutcome::NotHeld;
        };
        let token = lease.token;
        let holder = self.drop_lease(&name).and_then(|(_, h)| h);
        self.effects.events.push(Event::Released {
            resource: name,
            token,
            holder,
        });
        self.pump(now, resource);
        ReleaseOutcome::Released { token }
    }

    /// Drops the lease kept under `resource` (a resource's own name, or
    /// a holder's), if held: its token and holder. A holder's entry and
    /// slot go with it (nothing else is kept under its name).
    fn drop_lease(&mut self, resource: &ResourceName) -> Option<(FencingToken, Option<Holder>)> {
        let lease = self.resources.get_mut(resource)?.lease.take()?;
        self.n_leases -= 1;
        self.count_lease(resource, false);
        if self.left(resource).is_some() {
            self.resources.remove(resource);
        }
        match lease.session() {
            Some(digest) => {
                let session = self
                    .sessions
                    .get_mut(&digest)
                    .expect("bound to an open session");
                session.leases.remove(resource);
            }
            None => {
                self.expiries.remove(&(lease.expires_at, resource.clone()));
            }
        }
        self.write_end(resource, &lease);
        Some(lease.into_token_and_holder())
    }

    /// Operator fence: revokes the lease, if any, and issues a token above
    /// every earlier grant, so the next holder's token is higher still.
    pub fn fence(&mut self, now: MonoMs, resource: &ResourceName) -> FenceOutcome {
        self.tick(now);
        // An ended lease on it is dropped, but the resource is not handed on
        // before the fence: its next waiter gets it after, above the fence.
        self.settle(resource);
        // The exclusive holder, or every shared holder or permit.
        let mut names = vec![resource.clone()];
        names.extend(self.slot_names(resource));
        let mut dropped = Vec::new();
        for name in names {
            let session = self
                .resources
                .get(&name)
                .and_then(|s| s.lease.as_ref())
                .and_then(Lease::session);
            let Some((token, holder)) = self.drop_lease(&name) else {
                continue;
            };
            if let Some(digest) = session {
                let s = self
                    .sessions
                    .get_mut(&digest)
                    .expect("bound to an open session");
                s.revoked.push((resource.clone(), token));
            }
            dropped.push((name, token, holder));
        }
        let token = self.issue_token();
        let revoked = dropped.iter().map(|(_, t, _)| *t).max();
        // One event per holder it revoked (under the name its lease was
        // kept under), or one for the resource when none was held.
        if dropped.is_empty() {
            self.effects.events.push(Event::Fenced {
                resource: resource.clone(),
                token,
                revoked: None,
                holder: None,
            });
        }
        for (name, revoked_token, holder) in dropped {
            self.effects.events.push(Event::Fenced {
                resource: name,
                token,
                revoked: Some(revoked_token),
                holder,
            });
        }
        self.pump(now, resource);
        FenceOutcome { token, revoked }
    }
}
