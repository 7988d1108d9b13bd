//! The lease table: a state machine over monotonic time.
//!
//! Every public operation first runs due timers (expiries and wait
//! deadlines) at the given `now`, so a grant always re-checks the state at
//! grant time. Effects accumulate until the shell calls
//! [`LeaseTable::take_effects`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;

use crate::{
    AcquisitionDigest, AcquisitionId, Epoch, FencingToken, ResourceName, WaiterId, COUNTER_MAX,
};

/// Milliseconds on the server's monotonic clock, from an origin the shell picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonoMs(pub u64);

impl MonoMs {
    fn plus(self, ms: u64) -> MonoMs {
        MonoMs(self.0.saturating_add(ms))
    }
}

/// Bounds on everything a request can ask for or make the table hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    pub wait_ms_max: u64,
    pub n_resources_per_request_max: usize,
    pub n_waiters_per_resource_max: usize,
    pub n_waiters_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ttl_ms_min: 1_000,
            ttl_ms_max: 600_000,
            wait_ms_max: 600_000,
            n_resources_per_request_max: 64,
            n_waiters_per_resource_max: 1_024,
            n_waiters_max: 100_000,
        }
    }
}

/// One acquire request: one or more resources, all or nothing.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// Each resource with the acquisition id its lease will carry.
    pub claims: Vec<(ResourceName, AcquisitionId)>,
    pub ttl_ms: u64,
    /// 0 means try once. Otherwise the request queues, FIFO, for at most this long.
    pub wait_ms: u64,
    /// Identifies the request if it has to wait; the shell picks a unique one.
    pub waiter: WaiterId,
}

impl AcquireRequest {
    pub fn single(resource: ResourceName, acquisition_id: AcquisitionId, ttl_ms: u64) -> Self {
        Self {
            claims: vec![(resource, acquisition_id)],
            ttl_ms,
            wait_ms: 0,
            waiter: WaiterId(0),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub resource: ResourceName,
    pub acquisition_id: AcquisitionId,
    pub token: FencingToken,
    pub ttl_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Every requested lease is held now, one grant per resource, in request order.
    Granted(Vec<Grant>),
    /// The request waits; its result arrives later as [`WaitResult`] in [`Effects::woken`].
    Queued {
        waiter: WaiterId,
    },
    NotAcquired(NotAcquired),
}

/// Why a try-once acquire was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAcquired {
    /// The first requested resource that is held or has waiters.
    pub resource: ResourceName,
    /// The current holder's token, if the resource is held (it may only have waiters).
    pub holder_token: Option<FencingToken>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitResult {
    Granted(Vec<Grant>),
    TimedOut,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    #[error(
        "ttl {ttl_ms}ms is out of range: it must be between {ttl_ms_min}ms and {ttl_ms_max}ms"
    )]
    TtlOutOfRange {
        ttl_ms: u64,
        ttl_ms_min: u64,
        ttl_ms_max: u64,
    },
    #[error("wait {wait_ms}ms is above the maximum {wait_ms_max}ms")]
    WaitTooLong { wait_ms: u64, wait_ms_max: u64 },
    #[error("an acquire request must name at least one resource")]
    NoResources,
    #[error("an acquire request names {n_resources} resources; the limit is {n_resources_max}")]
    TooManyResources {
        n_resources: usize,
        n_resources_max: usize,
    },
    #[error("resource {resource} appears more than once in one acquire request")]
    DuplicateResource { resource: ResourceName },
    #[error("resource {resource} already has {n_waiters} waiters, the limit per resource")]
    TooManyWaitersOnResource {
        resource: ResourceName,
        n_waiters: usize,
    },
    #[error("the server already has {n_waiters} waiting requests, its limit")]
    TooManyWaiters { n_waiters: usize },
    #[error("waiter id {0:?} is already in use")]
    DuplicateWaiter(WaiterId),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Extended by its TTL from `now`; `ttl_ms` is the remaining time.
    Renewed { token: FencingToken, ttl_ms: u64 },
    /// Expired, released, fenced or replaced: nothing was extended or created.
    NotOwner,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released {
        token: FencingToken,
    },
    /// Already released, expired, fenced, or never this id's: nothing changed.
    NotHeld,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceOutcome {
    /// Issued to the fence itself: above every earlier grant, below every later one.
    pub token: FencingToken,
    /// The token of the lease the fence revoked, if one was held.
    pub revoked: Option<FencingToken>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    pub resource: ResourceName,
    pub holder_token: Option<FencingToken>,
    pub remaining_ms: u64,
    pub ttl_ms: u64,
    pub n_waiters: usize,
}

/// The durable form of a lease. Expiry is not stored: after a restart every
/// stored lease gets its full TTL again from the restart. The acquisition id
/// itself is never stored, only its digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    pub acquisition_digest: AcquisitionDigest,
    pub token: FencingToken,
    pub ttl_ms: u64,
}

/// A change to durable state, applied by the shell in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    PutLease {
        resource: ResourceName,
        record: LeaseRecord,
    },
    DeleteLease {
        resource: ResourceName,
    },
    /// The last issued token position.
    Tokens {
        epoch: Epoch,
        counter: u64,
    },
}

/// What happened, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Granted {
        resource: ResourceName,
        token: FencingToken,
        acquisition_id: AcquisitionId,
        after_wait: bool,
    },
    Renewed {
        resource: ResourceName,
        token: FencingToken,
    },
    RenewRefused {
        resource: ResourceName,
    },
    Released {
        resource: ResourceName,
        token: FencingToken,
    },
    Expired {
        resource: ResourceName,
        token: FencingToken,
    },
    Fenced {
        resource: ResourceName,
        token: FencingToken,
        revoked: Option<FencingToken>,
    },
    WaitTimedOut {
        waiter: WaiterId,
    },
}

/// Everything the shell must do after a batch of operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Changes to persist, in order.
    pub writes: Vec<Write>,
    /// True when a token was issued: the writes must be durable before any
    /// reply of this batch (or wake-up below) is released.
    pub sync: bool,
    /// Waiting requests that finished, to be answered.
    pub woken: Vec<(WaiterId, WaitResult)>,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug)]
struct Lease {
    acquisition_digest: AcquisitionDigest,
    token: FencingToken,
    ttl_ms: u64,
    expires_at: MonoMs,
}

/// A resource's waiters, FIFO. Most resources never have one, so the queue
/// is allocated on first use: a held resource costs 8 bytes here, not 24
/// (10M live leases are the benchmark's top row).
#[derive(Clone, Debug, Default)]
#[allow(clippy::box_collection)] // the box is the point: 8 bytes per idle resource, not 24
struct Queue(Option<Box<VecDeque<WaiterId>>>);

impl Queue {
    fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.is_empty())
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    fn front(&self) -> Option<&WaiterId> {
        self.0.as_ref()?.front()
    }

    fn push_back(&mut self, waiter: WaiterId) {
        self.0
            .get_or_insert_with(Default::default)
            .push_back(waiter);
    }

    fn pop_front(&mut self) -> Option<WaiterId> {
        let q = self.0.as_mut()?;
        let head = q.pop_front();
        if q.is_empty() {
            self.0 = None;
        }
        head
    }

    fn retain(&mut self, keep: impl FnMut(&WaiterId) -> bool) {
        if let Some(q) = self.0.as_mut() {
            q.retain(keep);
            if q.is_empty() {
                self.0 = None;
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
struct ResourceState {
    lease: Option<Lease>,
    queue: Queue,
}

impl ResourceState {
    fn is_idle(&self) -> bool {
        self.lease.is_none() && self.queue.is_empty()
    }
}

#[derive(Clone, Debug)]
struct Waiter {
    claims: Vec<(ResourceName, AcquisitionId)>,
    ttl_ms: u64,
    deadline: MonoMs,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Expiry(ResourceName),
    WaitDeadline(WaiterId),
}

/// The lease table. See the crate docs.
#[derive(Debug)]
pub struct LeaseTable {
    limits: Limits,
    epoch: Epoch,
    /// The counter of the last issued token.
    counter: u64,
    tokens_dirty: bool,
    n_leases: usize,
    resources: BTreeMap<ResourceName, ResourceState>,
    waiters: HashMap<WaiterId, Waiter>,
    timers: BTreeSet<(MonoMs, Timer)>,
    effects: Effects,
}

impl LeaseTable {
    /// An empty table whose next token is `epoch << 40 | (counter + 1)`.
    pub fn new(limits: Limits, epoch: Epoch, counter: u64) -> Self {
        assert!(counter <= COUNTER_MAX, "counter {counter} out of range");
        Self {
            limits,
            epoch,
            counter,
            tokens_dirty: false,
            n_leases: 0,
            resources: BTreeMap::new(),
            waiters: HashMap::new(),
            timers: BTreeSet::new(),
            effects: Effects::default(),
        }
    }

    /// Rebuilds the table after a restart. Every stored lease is held for its
    /// full TTL from `now`: the server cannot know how long it was down.
    pub fn recover(
        limits: Limits,
        now: MonoMs,
        epoch: Epoch,
        counter: u64,
        leases: impl IntoIterator<Item = (ResourceName, LeaseRecord)>,
    ) -> Self {
        let mut table = Self::new(limits, epoch, counter);
        for (resource, record) in leases {
            let last = FencingToken::new(epoch, counter).expect("stored counter in range");
            assert!(
                record.token <= last,
                "stored lease token {} above last issued {last}",
                record.token
            );
            let expires_at = now.plus(record.ttl_ms);
            table
                .timers
                .insert((expires_at, Timer::Expiry(resource.clone())));
            let lease = Lease {
                acquisition_digest: record.acquisition_digest,
                token: record.token,
                ttl_ms: record.ttl_ms,
                expires_at,
            };
            table.resources.insert(
                resource,
                ResourceState {
                    lease: Some(lease),
                    queue: Queue::default(),
                },
            );
            table.n_leases += 1;
        }
        table
    }

    /// The last token issued (or the position a new table starts from).
    pub fn last_token(&self) -> (Epoch, u64) {
        (self.epoch, self.counter)
    }

    /// Live leases, kept as a count (O(1): called after every batch).
    pub fn n_leases(&self) -> usize {
        self.n_leases
    }

    pub fn n_waiters(&self) -> usize {
        self.waiters.len()
    }

    /// The earliest instant at which [`LeaseTable::tick`] has work to do.
    pub fn next_deadline(&self) -> Option<MonoMs> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Returns the effects accumulated since the last call.
    pub fn take_effects(&mut self) -> Effects {
        if std::mem::take(&mut self.tokens_dirty) {
            self.effects.writes.push(Write::Tokens {
                epoch: self.epoch,
                counter: self.counter,
            });
        }
        std::mem::take(&mut self.effects)
    }

    /// Runs every timer due at `now`: expiries, then the hand-offs they allow.
    pub fn tick(&mut self, now: MonoMs) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let (_, timer) = self.timers.pop_first().expect("checked non-empty");
            match timer {
                Timer::Expiry(resource) => self.expire(now, resource),
                Timer::WaitDeadline(waiter) => {
                    self.remove_waiter(now, waiter);
                    self.effects.woken.push((waiter, WaitResult::TimedOut));
                    self.effects.events.push(Event::WaitTimedOut { waiter });
                }
            }
        }
    }

    fn expire(&mut self, now: MonoMs, resource: ResourceName) {
        let state = self
            .resources
            .get_mut(&resource)
            .expect("expiry timer for unknown resource");
        let lease = state.lease.take().expect("expiry timer without a lease");
        assert!(lease.expires_at <= now, "expired early");
        self.n_leases -= 1;
        self.effects.writes.push(Write::DeleteLease {
            resource: resource.clone(),
        });
        self.effects.events.push(Event::Expired {
            resource: resource.clone(),
            token: lease.token,
        });
        self.pump(now, &resource);
    }

    pub fn acquire(
        &mut self,
        now: MonoMs,
        request: AcquireRequest,
    ) -> Result<AcquireOutcome, AcquireError> {
        self.tick(now);
        self.validate(&request)?;
        let blocker = request.claims.iter().find_map(|(resource, _)| {
            let state = self.resources.get(resource)?;
            (!state.is_idle()).then(|| NotAcquired {
                resource: resource.clone(),
                holder_token: state.lease.as_ref().map(|l| l.token),
            })
        });
        let Some(blocker) = blocker else {
            let grants = request
                .claims
                .into_iter()
                .map(|(resource, id)| self.grant(now, resource, id, request.ttl_ms, false))
                .collect();
            return Ok(AcquireOutcome::Granted(grants));
        };
        if request.wait_ms == 0 {
            return Ok(AcquireOutcome::NotAcquired(blocker));
        }
        self.enqueue(now, request)
    }

    fn validate(&self, request: &AcquireRequest) -> Result<(), AcquireError> {
        let l = &self.limits;
        if request.ttl_ms < l.ttl_ms_min || request.ttl_ms > l.ttl_ms_max {
            return Err(AcquireError::TtlOutOfRange {
                ttl_ms: request.ttl_ms,
                ttl_ms_min: l.ttl_ms_min,
                ttl_ms_max: l.ttl_ms_max,
            });
        }
        if request.wait_ms > l.wait_ms_max {
            return Err(AcquireError::WaitTooLong {
                wait_ms: request.wait_ms,
                wait_ms_max: l.wait_ms_max,
            });
        }
        let n_resources = request.claims.len();
        if n_resources == 0 {
            return Err(AcquireError::NoResources);
        }
        if n_resources > l.n_resources_per_request_max {
            return Err(AcquireError::TooManyResources {
                n_resources,
                n_resources_max: l.n_resources_per_request_max,
            });
        }
        let mut seen = BTreeSet::new();
        for (resource, _) in &request.claims {
            if !seen.insert(resource) {
                return Err(AcquireError::DuplicateResource {
                    resource: resource.clone(),
                });
            }
        }
        Ok(())
    }

    fn enqueue(
        &mut self,
        now: MonoMs,
        request: AcquireRequest,
    ) -> Result<AcquireOutcome, AcquireError> {
        if self.waiters.len() >= self.limits.n_waiters_max {
            return Err(AcquireError::TooManyWaiters {
                n_waiters: self.waiters.len(),
            });
        }
        if self.waiters.contains_key(&request.waiter) {
            return Err(AcquireError::DuplicateWaiter(request.waiter));
        }
        for (resource, _) in &request.claims {
            let n_waiters = self.resources.get(resource).map_or(0, |s| s.queue.len());
            if n_waiters >= self.limits.n_waiters_per_resource_max {
                return Err(AcquireError::TooManyWaitersOnResource {
                    resource: resource.clone(),
                    n_waiters,
                });
            }
        }
        // Joining every queue at once, in arrival order, keeps all queues
        // consistently ordered, so waiters for overlapping sets cannot deadlock.
        for (resource, _) in &request.claims {
            self.resources
                .entry(resource.clone())
                .or_default()
                .queue
                .push_back(request.waiter);
        }
        let deadline = now.plus(request.wait_ms);
        self.timers
            .insert((deadline, Timer::WaitDeadline(request.waiter)));
        let waiter = Waiter {
            claims: request.claims,
            ttl_ms: request.ttl_ms,
            deadline,
        };
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

    fn remove_waiter(&mut self, now: MonoMs, waiter: WaiterId) {
        let w = self
            .waiters
            .remove(&waiter)
            .expect("removing an unknown waiter");
        for (resource, _) in &w.claims {
            let state = self
                .resources
                .get_mut(resource)
                .expect("waiter on unknown resource");
            state.queue.retain(|q| *q != waiter);
        }
        for (resource, _) in &w.claims {
            self.pump(now, resource);
        }
    }

    /// Grants the head waiter of `resource` if it now can be, and forgets idle resources.
    fn pump(&mut self, now: MonoMs, resource: &ResourceName) {
        let Some(state) = self.resources.get(resource) else {
            return;
        };
        if state.is_idle() {
            self.resources.remove(resource);
            return;
        }
        if state.lease.is_some() {
            return;
        }
        let head = *state
            .queue
            .front()
            .expect("not idle and not held means queued");
        let waiter = &self.waiters[&head];
        let ready = waiter.claims.iter().all(|(r, _)| {
            let s = &self.resources[r];
            s.lease.is_none() && s.queue.front() == Some(&head)
        });
        if !ready {
            return;
        }
        let waiter = self.waiters.remove(&head).expect("head waiter exists");
        self.timers
            .remove(&(waiter.deadline, Timer::WaitDeadline(head)));
        let grants = waiter
            .claims
            .into_iter()
            .map(|(r, id)| {
                let popped = self
                    .resources
                    .get_mut(&r)
                    .expect("claimed")
                    .queue
                    .pop_front();
                assert_eq!(popped, Some(head));
                self.grant(now, r, id, waiter.ttl_ms, true)
            })
            .collect();
        self.effects.woken.push((head, WaitResult::Granted(grants)));
    }

    fn issue_token(&mut self) -> FencingToken {
        if self.counter == COUNTER_MAX {
            self.epoch = self.epoch.next().expect("token space exhausted");
            self.counter = 0;
        }
        self.counter += 1;
        self.tokens_dirty = true;
        self.effects.sync = true;
        FencingToken::new(self.epoch, self.counter).expect("counter in range")
    }

    fn grant(
        &mut self,
        now: MonoMs,
        resource: ResourceName,
        id: AcquisitionId,
        ttl_ms: u64,
        after_wait: bool,
    ) -> Grant {
        let token = self.issue_token();
        let expires_at = now.plus(ttl_ms);
        let state = self.resources.entry(resource.clone()).or_default();
        assert!(
            state.lease.is_none(),
            "granting {resource} while it is held"
        );
        self.n_leases += 1;
        let acquisition_digest = id.digest();
        state.lease = Some(Lease {
            acquisition_digest,
            token,
            ttl_ms,
            expires_at,
        });
        self.timers
            .insert((expires_at, Timer::Expiry(resource.clone())));
        let record = LeaseRecord {
            acquisition_digest,
            token,
            ttl_ms,
        };
        self.effects.writes.push(Write::PutLease {
            resource: resource.clone(),
            record,
        });
        self.effects.events.push(Event::Granted {
            resource: resource.clone(),
            token,
            acquisition_id: id,
            after_wait,
        });
        Grant {
            resource,
            acquisition_id: id,
            token,
            ttl_ms,
        }
    }

    fn held_by(&self, resource: &ResourceName, id: &AcquisitionId) -> Option<&Lease> {
        self.resources
            .get(resource)?
            .lease
            .as_ref()
            .filter(|l| l.acquisition_digest.matches(id))
    }

    pub fn renew(
        &mut self,
        now: MonoMs,
        resource: &ResourceName,
        id: &AcquisitionId,
    ) -> RenewOutcome {
        self.tick(now);
        let Some(lease) = self.held_by(resource, id) else {
            self.effects.events.push(Event::RenewRefused {
                resource: resource.clone(),
            });
            return RenewOutcome::NotOwner;
        };
        let (old, ttl_ms, token) = (lease.expires_at, lease.ttl_ms, lease.token);
        let expires_at = now.plus(ttl_ms);
        self.timers.remove(&(old, Timer::Expiry(resource.clone())));
        self.timers
            .insert((expires_at, Timer::Expiry(resource.clone())));
        let lease = self
            .resources
            .get_mut(resource)
            .and_then(|s| s.lease.as_mut())
            .expect("held");
        lease.expires_at = expires_at;
        self.effects.events.push(Event::Renewed {
            resource: resource.clone(),
            token,
        });
        RenewOutcome::Renewed { token, ttl_ms }
    }

    pub fn release(
        &mut self,
        now: MonoMs,
        resource: &ResourceName,
        id: &AcquisitionId,
    ) -> ReleaseOutcome {
        self.tick(now);
        let Some(lease) = self.held_by(resource, id) else {
            return ReleaseOutcome::NotHeld;
        };
        let token = lease.token;
        self.drop_lease(resource);
        self.effects.events.push(Event::Released {
            resource: resource.clone(),
            token,
        });
        self.pump(now, resource);
        ReleaseOutcome::Released { token }
    }

    fn drop_lease(&mut self, resource: &ResourceName) -> Option<FencingToken> {
        let lease = self.resources.get_mut(resource)?.lease.take()?;
        self.n_leases -= 1;
        self.timers
            .remove(&(lease.expires_at, Timer::Expiry(resource.clone())));
        self.effects.writes.push(Write::DeleteLease {
            resource: resource.clone(),
        });
        Some(lease.token)
    }

    /// Operator fence: revokes the lease, if any, and issues a token above
    /// every earlier grant, so the next holder's token is higher still.
    pub fn fence(&mut self, now: MonoMs, resource: &ResourceName) -> FenceOutcome {
        self.tick(now);
        let revoked = self.drop_lease(resource);
        let token = self.issue_token();
        self.effects.events.push(Event::Fenced {
            resource: resource.clone(),
            token,
            revoked,
        });
        self.pump(now, resource);
        FenceOutcome { token, revoked }
    }

    pub fn status(&mut self, now: MonoMs, resource: &ResourceName) -> LeaseStatus {
        self.tick(now);
        self.status_of(now, resource, self.resources.get(resource))
    }

    fn status_of(
        &self,
        now: MonoMs,
        resource: &ResourceName,
        state: Option<&ResourceState>,
    ) -> LeaseStatus {
        let lease = state.and_then(|s| s.lease.as_ref());
        LeaseStatus {
            resource: resource.clone(),
            holder_token: lease.map(|l| l.token),
            remaining_ms: lease.map_or(0, |l| l.expires_at.0.saturating_sub(now.0)),
            ttl_ms: lease.map_or(0, |l| l.ttl_ms),
            n_waiters: state.map_or(0, |s| s.queue.len()),
        }
    }

    /// Resources with a lease or waiters whose name starts with `prefix`, in
    /// name order, after `start_after`, at most `limit` of them.
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
            .range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(r, _)| r.as_str().starts_with(prefix))
            .take(limit)
            .map(|(r, s)| self.status_of(now, r, Some(s)))
            .collect()
    }

    /// Every held lease in durable form (for snapshots).
    pub fn leases(&self) -> impl Iterator<Item = (&ResourceName, LeaseRecord)> {
        self.resources.iter().filter_map(|(r, s)| {
            let l = s.lease.as_ref()?;
            Some((
                r,
                LeaseRecord {
                    acquisition_digest: l.acquisition_digest,
                    token: l.token,
                    ttl_ms: l.ttl_ms,
                },
            ))
        })
    }
}

#[cfg(test)]
mod tests;
