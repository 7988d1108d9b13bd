//! Fair waiting: acquires that wait in line per resource, in arrival
//! order, granted as resources free (all of a request's resources at
//! once), withdrawn when cancelled or when their wait runs out.

use super::repeats::RequestKey;
use super::*;

impl LeaseTable {
    pub(super) fn enqueue(
        &mut self,
        now: MonoMs,
        request: AcquireRequest,
        key: Option<RequestKey>,
    ) -> Result<AcquireOutcome, AcquireError> {
        if self.waiters.len() >= self.limits.n_waiters_max {
            return Err(AcquireError::TooManyWaiters {
                n_waiters: self.waiters.len(),
            });
        }
        if self.waiters.contains_key(&request.waiter) {
            return Err(AcquireError::DuplicateWaiter(request.waiter));
        }
        for claim in &request.claims {
            let resource = &claim.resource;
            let n_waiters = self.queue(resource).map_or(0, VecDeque::len);
            if n_waiters >= self.limits.n_waiters_per_resource_max {
                return Err(AcquireError::TooManyWaitersOnResource {
                    resource: resource.clone(),
                    n_waiters,
                });
            }
        }
        self.check_waiters(request.claims.iter().map(|c| &c.resource))
            .map_err(AcquireError::OverQuota)?;
        self.count_waiter(request.claims.iter().map(|c| &c.resource), true);
        // Joining every queue at once, in arrival order, keeps all queues
        // consistently ordered, so waiters for overlapping sets cannot deadlock.
        for claim in &request.claims {
            let resource = &claim.resource;
            if let Shape::Permits(n) = claim.shape {
                self.semaphores.entry(resource.clone()).or_insert(n);
            }
            self.resources
                .get_or_insert_with(resource.clone(), Box::default);
            self.queues
                .entry(resource.clone())
                .or_default()
                .push_back(request.waiter);
        }
        let deadline = now.plus(request.wait_ms);
        self.timers
            .insert((deadline, Timer::WaitDeadline(request.waiter)));
        if let Some(digest) = request.term.session() {
            let session = self.sessions.get_mut(&digest).expect("checked by acquire");
            session.waiters.insert(request.waiter);
        }
        let waiter = Waiter {
            claims: request.claims,
            term: request.term,
            deadline,
            queued_at: now,
            holder: request.holder,
            key,
        };
        if let Some(key) = key {
            self.repeats.waiting.insert(key, request.waiter);
        }
        self.waiters.insert(request.waiter, waiter);
        Ok(AcquireOutcome::Queued {
            waiter: request.waiter,
        })
    }

    /// Withdraws a waiting request (its client went away). Unknown ids are ignored.
    pub fn cancel_wait(&mut self, now: MonoMs, waiter: WaiterId) {
        self.tick(now);
        if let Some(w) = self.waiters.get(&waiter) {
            self.timers
                .remove(&(w.deadline, Timer::WaitDeadline(waiter)));
            self.remove_waiter(now, waiter);
        }
    }

    pub(super) fn remove_waiter(&mut self, now: MonoMs, waiter: WaiterId) {
        let w = self
            .waiters
            .remove(&waiter)
            .expect("removing an unknown waiter");
        if let Some(key) = w.key {
            self.repeats.waiting.remove(&key);
            self.repeats.not_granted(now, key);
        }
        self.unbind_waiter(waiter, w.term.session());
        self.count_waiter(w.claims.iter().map(|c| &c.resource), false);
        for claim in &w.claims {
            self.change_queue(&claim.resource, |queue| queue.retain(|q| *q != waiter));
        }
        for claim in &w.claims {
            self.pump(now, &claim.resource);
        }
    }

    /// Grants the head waiters of `resource` while they now can be (one
    /// exclusive request, or shared requests and permits up to what the
    /// resource admits), and forgets idle resources.
    pub(super) fn pump(&mut self, now: MonoMs, resource: &ResourceName) {
        while self.pump_one(now, resource) {}
    }

    /// Grants the head waiter of `resource` if it now can be; `true` if it
    /// did (the next may be granted too).
    fn pump_one(&mut self, now: MonoMs, resource: &ResourceName) -> bool {
        let Some(state) = self.resources.get(resource) else {
            return false;
        };
        if state.lease.as_ref().is_some_and(|l| !self.is_gone(l)) {
            return false;
        }
        let Some(&head) = self.queue(resource).and_then(VecDeque::front) else {
            // Nothing waits: free, held by shared holders or permits, or
            // held only by an ended lease (`gone.rs`).
            self.settle(resource);
            if !self.groups.contains_key(resource) {
                self.resources.remove(resource);
                self.forget_kind_if_idle(resource);
            }
            return false;
        };
        let waiter = &self.waiters[&head];
        // A session whose end is due is ended within this tick, its waiters
        // first: never grant to it in the meantime.
        if let Some(session) = waiter.term.session().map(|d| &self.sessions[&d]) {
            if session.expires_at <= now {
                return false;
            }
        }
        // An ended lease is free for the hand-off (`drain.rs`).
        let ready = waiter.claims.iter().all(|c| {
            self.admits(c) && self.queue(&c.resource).and_then(VecDeque::front) == Some(&head)
        });
        if !ready {
            return false;
        }
        if self.quotas.on() && self.refused_over_quota(now, head) {
            return true;
        }
        self.grant_waiter(now, resource, head);
        true
    }

    /// Grants every claim of waiter `head`, at the head of each of its
    /// queues and admitted, and answers it.
    fn grant_waiter(&mut self, now: MonoMs, resource: &ResourceName, head: WaiterId) {
        let waiter = self.waiters.remove(&head).expect("head waiter exists");
        for c in &waiter.claims {
            self.settle(&c.resource);
        }
        self.timers
            .remove(&(waiter.deadline, Timer::WaitDeadline(head)));
        self.unbind_waiter(head, waiter.term.session());
        self.count_waiter(waiter.claims.iter().map(|c| &c.resource), false);
        let others: Vec<ResourceName> = waiter
            .claims
            .iter()
            .filter(|c| c.resource != *resource)
            .map(|c| c.resource.clone())
            .collect();
        let grants = waiter
            .claims
            .into_iter()
            .map(|c| {
                self.change_queue(&c.resource, |queue| {
                    assert_eq!(queue.pop_front(), Some(head))
                });
                self.grant(
                    now,
                    c,
                    waiter.term,
                    Some(waiter.queued_at),
                    waiter.holder.clone(),
                )
            })
            .collect();
        if let Some(key) = waiter.key {
            self.repeats.granted(now, key);
        }
        self.effects.woken.push((head, WaitResult::Granted(grants)));
        // A shared holder or a permit may leave room for the next waiter
        // on its other resources too.
        for other in &others {
            self.pump(now, other);
        }
    }

    /// `resource`'s waiters, if it has any (never an empty queue). With no
    /// waiters anywhere, the map answers without hashing the name.
    pub(super) fn queue(&self, resource: &ResourceName) -> Option<&VecDeque<WaiterId>> {
        self.queues.get(resource)
    }

    /// Applies `change` to `resource`'s waiters, and forgets the queue once
    /// it is empty.
    fn change_queue(
        &mut self,
        resource: &ResourceName,
        change: impl FnOnce(&mut VecDeque<WaiterId>),
    ) {
        let queue = self
            .queues
            .get_mut(resource)
            .expect("a queued waiter's resource has a queue");
        change(queue);
        if queue.is_empty() {
            self.queues.remove(resource);
        }
    }
}
