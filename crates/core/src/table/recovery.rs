//! A table recovered from the store after a restart: every lease and
//! session held for a full TTL from the restart, their ends spread so that
//! a big table does not end all at once.

use super::*;

/// At most this many recovered leases (or sessions) end per millisecond.
pub const RECOVERED_ENDS_PER_MS: usize = 500;

/// How much later than its full TTL from the restart the `i`th of `n`
/// recovered leases (or sessions) ends: spread evenly so that at most
/// about [`RECOVERED_ENDS_PER_MS`] end per millisecond, and never more
/// than a tenth of the TTL later. Zero for fewer than 500 (a small table
/// ends exactly at its TTL).
pub fn recovery_delay_ms(ttl_ms: u64, i: usize, n: usize) -> u64 {
    let window_ms = (ttl_ms / 10).min((n / RECOVERED_ENDS_PER_MS) as u64);
    match window_ms.checked_mul(i as u64) {
        // The common case, in one machine word (at ten million leases this
        // runs ten million times before the first grant).
        Some(scaled) => scaled / n.max(1) as u64,
        None => (u128::from(window_ms) * i as u128 / n.max(1) as u128) as u64,
    }
}

impl LeaseTable {
    /// Rebuilds the table after a restart. Every stored session and every
    /// stored lease is held for its full TTL from `now`: the server cannot
    /// know how long it was down. A lease tied to a session lives as long
    /// as the session; one whose session is not stored (its end was written
    /// but not the lease's) is held for its own TTL.
    ///
    /// A big table's ends are spread (see [`recovery_delay_ms`]) so that
    /// leases whose holders died with the server do not all expire in one
    /// step and one commit.
    pub fn recover(
        limits: Limits,
        now: MonoMs,
        epoch: Epoch,
        counter: u64,
        leases: impl IntoIterator<Item = (ResourceName, LeaseRecord)>,
        sessions: impl IntoIterator<Item = SessionRecord>,
    ) -> Self {
        let mut table = Self::new(limits, epoch, counter);
        // A repeat of a request sent before now cannot be told from one
        // granted by the table this replaces (`repeats.rs`), unless no
        // token was ever issued: then nothing was ever granted.
        if (epoch, counter) != (Epoch::FIRST, 0) {
            table.repeats.start(now);
        }
        let sessions: Vec<_> = sessions.into_iter().collect();
        let n_sessions = sessions.len();
        for (i, record) in sessions.into_iter().enumerate() {
            let at =
                now.end_of(record.ttl_ms)
                    .plus(recovery_delay_ms(record.ttl_ms, i, n_sessions));
            table.insert_session_until(at, record.digest, record.ttl_ms, record.opener);
        }
        // Both maps are built as the leases come (`sorted::Builder`: an
        // entry in order goes straight into a full chunk, the few out of
        // order are put in at the end), not by one insert (and one search)
        // per lease. The leases are taken as the store reads them when it
        // says how many there are at most (the spread needs a count): ten
        // million stored records are then never held beside the table they
        // become.
        let leases = leases.into_iter();
        match leases.size_hint() {
            (_, Some(n_max)) => table.recover_leases(now, leases, n_max),
            (_, None) => {
                let leases: Vec<_> = leases.collect();
                let n = leases.len();
                table.recover_leases(now, leases, n);
            }
        }
        table
    }

    /// Builds the resources and expiries from `leases` (in any order, at
    /// most `n_max` of them; their ends are spread over `n_max`).
    fn recover_leases(
        &mut self,
        now: MonoMs,
        leases: impl IntoIterator<Item = (ResourceName, LeaseRecord)>,
        n_max: usize,
    ) {
        let last = self.issued_through();
        let (mut resources, mut expiries) = (Builder::default(), Builder::default());
        let mut n_leases = 0;
        for (i, (resource, record)) in leases.into_iter().enumerate() {
            assert!(
                record.token <= last,
                "stored lease token {} above last issued {last}",
                record.token
            );
            let delay_ms = recovery_delay_ms(record.ttl_ms, i.min(n_max), n_max);
            if let Some((owner, slot)) = resource.slot_of() {
                // A shared holder or a permit: its slot is held.
                if let Shape::Permits(n) = record.shape {
                    self.semaphores.insert(owner.clone(), n);
                }
                self.groups.entry(owner).or_default().insert(slot);
            }
            let state = self.recovered_lease(now, &resource, record, delay_ms, &mut expiries);
            resources.push((resource, state));
            n_leases += 1;
        }
        // Finished on the thread that built them: chunks freed by a thread
        // other than the one that made them were never given back to the
        // system (docs/performance.md, "the resources in sorted chunks").
        self.resources = resources.finish();
        self.expiries = expiries.finish();
        self.n_leases = n_leases;
        // A resource with shared holders or permits keeps an entry of its
        // own (no lease) while it has them.
        for owner in self.groups.keys() {
            self.resources
                .get_or_insert_with(owner.clone(), Box::default);
        }
    }

    /// One stored lease as the table holds it after a restart: tied to its
    /// session if that was recovered, else held for its full TTL from
    /// `now` plus `delay_ms`, its expiry pushed onto `expiries`.
    fn recovered_lease(
        &mut self,
        now: MonoMs,
        resource: &ResourceName,
        record: LeaseRecord,
        delay_ms: u64,
        expiries: &mut Builder<(MonoMs, ResourceName), ()>,
    ) -> Box<ResourceState> {
        let session = record.session.filter(|d| self.sessions.contains_key(d));
        let expires_at = match session {
            Some(digest) => {
                let s = self.sessions.get_mut(&digest).expect("checked");
                s.leases.insert(resource.clone());
                MonoMs::NEVER
            }
            None => {
                let ttl_ms = if crate::bad::on(crate::bad::Variant::RecoveryWithoutTtl) {
                    0
                } else {
                    record.ttl_ms
                };
                let at = now.end_of(ttl_ms).plus(delay_ms);
                expiries.push(((at, resource.clone()), ()));
                at
            }
        };
        let lease = Lease::new(
            (record.acquisition_digest, record.token),
            record.ttl_ms,
            (now, true),
            expires_at,
            session,
            record.holder,
        );
        Box::new(ResourceState { lease: Some(lease) })
    }
}
