//! The lease table: a state machine over monotonic time.
//!
//! Every public operation first runs due timers (expiries and wait
//! deadlines) at the given `now`, so a grant always re-checks the state at
//! grant time. Effects accumulate until the shell calls
//! [`LeaseTable::take_effects`].

mod change;
mod drain;
mod expiry;
mod gone;
mod holders;
mod limits;
mod query;
mod quotas;
mod recovery;
mod refusal;
mod repeats;
mod sessions;
mod shape;
mod sorted;
mod state;
mod term;
mod types;
mod waiters;

pub use drain::ENDS_PER_STEP;
pub use recovery::{recovery_delay_ms, RECOVERED_ENDS_PER_MS};
pub use repeats::{Attempt, REPEATS_REMEMBERED_MAX, REPEAT_MEMORY_MS};
use repeats::{Repeats, Seen};

pub use limits::{Limits, TTL_MS_MAX};
pub use quotas::QuotaUse;
pub use refusal::{Blocker, Held, HeldFor, NotAcquired, BLOCKING_HOLDERS_MAX};
pub use sessions::{Resumed, SessionCheck};
pub use shape::{Claim, Kind, SetPermitsError, Shape, PERMITS_MAX};
use sorted::{Builder, Due, SortedChunks};
use state::{Draining, Lease, ResourceState, Session, Timer, Waiter};

pub use change::{first_seq, Change, ChangeOf, HolderChange, NumberedChange, HISTORY_LEN_MAX};
pub use term::LeaseTerm;
pub use types::{
    AcquireError, AcquireOutcome, AcquireRequest, Effects, Event, FenceOutcome, Grant, KeptAlive,
    LeaseRecord, LeaseStatus, MonoMs, ReleaseOutcome, RenewOutcome, SessionError, SessionRecord,
    SlotStatus, WaitResult, Write,
};

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::{
    AcquisitionId, Epoch, FencingToken, Holder, ResourceName, SessionDigest, WaiterId, COUNTER_MAX,
};

/// The lease table. See the crate docs.
#[derive(Debug)]
pub struct LeaseTable {
    limits: Limits,
    epoch: Epoch,
    /// The counter of the last issued token.
    counter: u64,
    tokens_dirty: bool,
    n_leases: usize,
    resources: SortedChunks<ResourceName, Box<ResourceState>>,
    /// The waiters of each resource that has some, FIFO (most never do:
    /// kept apart so a held resource's state stays small).
    queues: HashMap<ResourceName, VecDeque<WaiterId>>,
    /// The held slots of each resource with shared holders or permits
    /// (`shape.rs`); each holder is a lease under its holder's name.
    groups: HashMap<ResourceName, shape::Slots>,
    /// The N of each semaphore with a holder or a waiter.
    semaphores: HashMap<ResourceName, u32>,
    waiters: HashMap<WaiterId, Waiter>,
    sessions: HashMap<SessionDigest, Session>,
    /// Ended sessions whose leases are dropped in bounded steps.
    draining: HashMap<SessionDigest, Draining>,
    /// At most this many of an ended session's leases, or of the expired
    /// ones, are dropped per step.
    ends_per_step: usize,
    /// Wait deadlines, session ends and drains.
    timers: BTreeSet<(MonoMs, Timer)>,
    /// The deadlines of the leases of their own (not a session's).
    expiries: SortedChunks<(MonoMs, ResourceName)>,
    /// Leases whose deadline a step reached, still to be dropped
    /// (`expiry.rs`): one set per step that reached some, oldest first.
    /// Already gone and uncounted.
    overdue: VecDeque<Due<((MonoMs, ResourceName), ())>>,
    /// Entries in `overdue`.
    n_overdue: usize,
    /// At most this many expired leases are dropped per millisecond.
    drops_per_ms: usize,
    /// The millisecond of the last expiry step, and its drops so far.
    drops: (MonoMs, usize),
    /// Every lease of its own (not a session's) whose deadline is at or
    /// before this is gone: the last timer a step reached.
    expired_through: MonoMs,
    /// Requests carrying a request id: what a repeat is answered.
    repeats: Repeats,
    /// The quotas in force and what each uses (`quotas.rs`).
    quotas: quotas::Quotas,
    effects: Effects,
}

impl LeaseTable {
    /// An empty table whose next token is `epoch << 40 | (counter + 1)`.
    pub fn new(limits: Limits, epoch: Epoch, counter: u64) -> Self {
        assert!(counter <= COUNTER_MAX, "counter {counter} out of range");
        assert!(
            limits.ttl_ms_max <= TTL_MS_MAX,
            "ttl_ms_max {} above TTL_MS_MAX",
            limits.ttl_ms_max
        );
        Self {
            limits,
            epoch,
            counter,
            tokens_dirty: false,
            n_leases: 0,
            resources: SortedChunks::default(),
            queues: HashMap::new(),
            groups: HashMap::new(),
            semaphores: HashMap::new(),
            waiters: HashMap::new(),
            sessions: HashMap::new(),
            draining: HashMap::new(),
            ends_per_step: ENDS_PER_STEP,
            timers: BTreeSet::new(),
            expiries: SortedChunks::default(),
            overdue: VecDeque::new(),
            n_overdue: 0,
            drops_per_ms: ENDS_PER_STEP,
            drops: (MonoMs(0), 0),
            expired_through: MonoMs(0),
            repeats: Repeats::default(),
            quotas: quotas::Quotas::default(),
            effects: Effects::default(),
        }
    }

    /// The last token issued (or the position a new table starts from).
    pub fn last_token(&self) -> (Epoch, u64) {
        (self.epoch, self.counter)
    }

    /// Live leases, kept as a count (O(1): called after every batch).
    pub fn n_leases(&self) -> usize {
        self.n_leases
    }

    /// Waiting acquire requests (O(1)).
    pub fn n_waiters(&self) -> usize {
        self.waiters.len()
    }

    /// The earliest instant at which [`LeaseTable::tick`] has work to do:
    /// a millisecond after the last step while expired leases are still to
    /// be dropped (as for an ended session's, so that other callers take
    /// the lock in between).
    pub fn next_deadline(&self) -> Option<MonoMs> {
        let overdue = (self.n_overdue > 0).then(|| self.expired_through.plus(1));
        let timer = self.timers.first().map(|(at, _)| *at);
        let expiry = self.expiries.first().map(|((at, _), ())| *at);
        [timer, expiry, overdue].into_iter().flatten().min()
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

    /// Runs every timer due at `now`: leases whose deadline came are gone
    /// from here on, at most [`ENDS_PER_STEP`] of them are dropped from the
    /// table now and the rest in later steps (`expiry.rs`); wait deadlines,
    /// session ends and the hand-offs they allow run in deadline order.
    pub fn tick(&mut self, now: MonoMs) {
        let reached = self.reach_expiries(now);
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let (at, timer) = self.timers.pop_first().expect("checked non-empty");
            // Every lease ending at or before `at` was reached above, and
            // is gone from here on; one ending later (but by `now`) is not
            // yet, for this timer.
            self.expired_through = at;
            match timer {
                Timer::WaitDeadline(waiter) => {
                    if self.settle_claims_of(now, waiter) {
                        // Granted: a lease it waited for was gone (an ended
                        // session's, or expired) before its wait ran out.
                        continue;
                    }
                    let claims = self.waiters[&waiter].claims.clone();
                    let blockers = self.blockers(now, claims.iter(), Some(waiter));
                    self.remove_waiter(now, waiter);
                    self.effects
                        .woken
                        .push((waiter, WaitResult::TimedOut(blockers)));
                    self.effects.events.push(Event::WaitTimedOut { waiter });
                }
                Timer::SessionExpiry(digest) => self.end_session(now, digest, true),
                Timer::SessionDrain(digest) => self.drain_session(now, digest),
            }
        }
        self.expired_through = self.expired_through.max(now);
        if reached > 0 {
            self.hand_over_reached(now);
        }
        self.expire_step(now, reached);
    }

    /// Acquires every claimed resource, or none: granted now, refused (try-once), or queued until `wait_ms` runs out. A grant sets `sync` in the effects.
    pub fn acquire(
        &mut self,
        now: MonoMs,
        request: AcquireRequest,
    ) -> Result<AcquireOutcome, AcquireError> {
        self.tick(now);
        self.validate(&request)?;
        for claim in &request.claims {
            self.settle_and_pump(now, &claim.resource);
        }
        for claim in &request.claims {
            self.check_shape(claim)?;
        }
        // An acquire on a session counts as its heartbeat, so a lease tied
        // to it is held a full session TTL from the request at least.
        if let LeaseTerm::Session(digest) = request.term {
            if !self.sessions.contains_key(&digest) {
                return Err(AcquireError::SessionNotOpen);
            }
            self.refresh_session(now, digest);
        }
        let key = match request.attempt {
            None => None,
            Some(attempt) => match self.seen(now, &request, attempt) {
                Seen::New(key) => Some(key),
                Seen::Answered(outcome) => return Ok(outcome),
            },
        };
        let blocker = self.not_acquired(now, request.claims.iter(), None);
        let Some(blocker) = blocker else {
            self.check_grant(now, &request.claims, key)?;
            let grants = request
                .claims
                .into_iter()
                .map(|claim| {
                    let holder = request.holder.clone();
                    self.grant(now, claim, request.term, None, holder)
                })
                .collect();
            if let Some(key) = key {
                self.repeats.granted(now, key);
            }
            return Ok(AcquireOutcome::Granted(grants));
        };
        if request.wait_ms == 0 {
            if let Some(key) = key {
                self.repeats.not_granted(now, key);
            }
            return Ok(AcquireOutcome::NotAcquired(blocker));
        }
        self.enqueue(now, request, key)
    }

    /// The last token issued (the position of the counter): every later
    /// token is above it.
    pub fn issued_through(&self) -> FencingToken {
        FencingToken::new(self.epoch, self.counter).expect("counter in range")
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
        claim: Claim,
        term: LeaseTerm,
        queued_at: Option<MonoMs>,
        holder: Option<Holder>,
    ) -> Grant {
        let Claim {
            resource: asked,
            acquisition_id: id,
            shape,
        } = claim;
        let (resource, slot) = self.name_for(&asked, shape);
        let session = term.session();
        let after_wait = queued_at.is_some();
        let waited_ms = queued_at.map_or(0, |at| now.0.saturating_sub(at.0));
        let token = self.issue_token();
        let (ttl_ms, expires_at) = self.bind(now, &resource, term);
        self.count_lease(&resource, true);
        let state = self
            .resources
            .get_or_insert_with(resource.clone(), Box::default);
        assert!(
            state.lease.is_none(),
            "granting {resource} while it is held"
        );
        self.n_leases += 1;
        let acquisition_digest = id.digest();
        state.lease = Some(Lease::new(
            (acquisition_digest, token),
            ttl_ms,
            (now, false),
            expires_at,
            session,
            holder.clone(),
        ));
        let record = LeaseRecord {
            acquisition_digest,
            token,
            ttl_ms,
            session,
            holder: holder.clone(),
            shape,
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
            holder,
        });
        Grant {
            resource: asked,
            acquisition_id: id,
            token,
            slot,
            ttl_ms,
            waited_ms,
        }
    }

    /// The name a new lease of `shape` on `asked` is kept under, and its
    /// slot: an exclusive lease under the resource's name; a shared holder
    /// or a permit under its holder's name, the resource's entry staying
    /// while it has holders (`shape.rs`).
    fn name_for(&mut self, asked: &ResourceName, shape: Shape) -> (ResourceName, Option<u32>) {
        match shape {
            Shape::Exclusive => (asked.clone(), None),
            Shape::Shared | Shape::Permits(_) => {
                self.resources
                    .get_or_insert_with(asked.clone(), Box::default);
                let (name, slot) = self.take_slot(asked, shape);
                (name, Some(slot))
            }
        }
    }

    /// Ties a new lease kept under `name` to its session, or schedules its
    /// own expiry: its TTL and deadline.
    fn bind(&mut self, now: MonoMs, name: &ResourceName, term: LeaseTerm) -> (u64, MonoMs) {
        match term {
            LeaseTerm::Session(digest) => {
                let s = self
                    .sessions
                    .get_mut(&digest)
                    .expect("granting on a session that is not open");
                s.leases.insert(name.clone());
                (s.ttl_ms, MonoMs::NEVER)
            }
            LeaseTerm::Own { ttl_ms } => {
                let at = now.end_of(ttl_ms);
                self.expiries.insert((at, name.clone()), ());
                (ttl_ms, at)
            }
        }
    }

    /// The lease `id` holds on `resource`, with the name it is kept
    /// under: the resource's own (exclusive), or a holder's (a shared
    /// holder or a permit).
    fn held_by(
        &self,
        resource: &ResourceName,
        id: &AcquisitionId,
    ) -> Option<(ResourceName, &Lease)> {
        let state = self.resources.get(resource)?;
        if let Some(lease) = state.lease.as_ref() {
            return lease
                .acquisition_digest
                .matches(id)
                .then(|| (resource.clone(), lease));
        }
        let slots = self.groups.get(resource)?;
        slots.iter().find_map(|&k| {
            let name = resource.slot(k);
            let lease = self.resources.get(&name)?.lease.as_ref()?;
            lease
                .acquisition_digest
                .matches(id)
                .then_some((name, lease))
        })
    }
}

#[cfg(test)]
mod tests;
