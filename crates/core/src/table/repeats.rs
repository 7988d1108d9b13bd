//! Repeats of an acquire. A client that lost an acquire's answer sends the
//! request again with the same request id, and so the same acquisition ids
//! ([`crate::RequestId::acquisition_id`]). The table answers a repeat with
//! what the request got, never with a second grant:
//!
//! - its leases, when all of them are still held under those ids (the
//!   store keeps their digests, so this holds across restarts and
//!   failovers), each with the time it has left;
//! - its place in line, when it still waits: the repeat takes it over;
//! - "ended", when one of its leases is held and another is not (a lease
//!   of a multi-resource grant was released), or when it was granted in
//!   the last [`REPEAT_MEMORY_MS`] (remembered here, in memory: at most
//!   [`REPEATS_REMEMBERED_MAX`] requests, one word and a queue entry each);
//! - a new request again when its first attempt was seen and not granted
//!   (refused, or withdrawn from the line when its connection broke);
//! - "ended" as well when the table cannot prove it never granted the
//!   request: the first attempt was sent before the table remembers
//!   (before a restart, before this leader's term, or before the oldest
//!   request it still remembers), and the store had issued tokens before
//!   the table started. Nothing is held under the id then either, since a
//!   lease granted before would have been found. (So a repeat within about
//!   half a second of a restart or takeover, of an attempt that never
//!   arrived, is answered "ended"; the caller acquires again.)
//!
//! Otherwise the request was never granted, and is served as a new one.
//!
//! What a restart or a takeover keeps: the store keeps every held lease
//! (so a repeat finds its leases) and the acquisition digest of every
//! lease that ended in the last [`REPEAT_MEMORY_MS`] or more
//! ([`Write::LeaseEnded`]), which a recovered table is given
//! ([`LeaseTable::remember_ended`]). For [`REPEAT_MEMORY_MS`] after it
//! starts, the table answers "ended" to any attempt, first or repeat, of a
//! request whose lease is held or ended: a late duplicate of a request
//! granted before the restart is never granted a second time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use super::*;
use crate::AcquisitionDigest;

/// How long a granted request is remembered after its grant: a repeat
/// sent later than this after its first attempt is answered "ended" unless
/// its leases are still held. Clients stop repeating well before.
pub const REPEAT_MEMORY_MS: u64 = 60_000;

/// The most granted requests remembered; past it the oldest are forgotten
/// early (and repeats of requests first sent before them are answered
/// "ended").
pub const REPEATS_REMEMBERED_MAX: usize = 1_000_000;

/// How much earlier than the client says a first attempt may have been
/// sent, as the server's clock counts: the repeat's own time in flight and
/// the clocks' difference in rate (plus 1% of the time since the first).
const SENT_SLACK_MS: u64 = 500;

/// Which attempt of a request carrying a request id this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Its first attempt.
    First,
    /// A repeat after a lost answer: the first attempt was sent this many
    /// milliseconds ago, on the client's monotonic clock.
    Repeat {
        /// Time since the first attempt was sent.
        first_sent_ms_ago: u64,
    },
}

/// What the table remembers of requests carrying a request id.
#[derive(Debug, Default)]
pub(super) struct Repeats {
    /// Requests seen recently, oldest first, with when they were seen.
    order: VecDeque<(MonoMs, RequestKey)>,
    /// Each of them, and whether it was granted (keys are hashes already).
    seen: HashMap<RequestKey, bool, BuildHasherDefault<KeyHasher>>,
    /// Every request granted since this instant is in `seen` or held: the
    /// start of a table recovered from state in which tokens were issued.
    /// `None`: nothing was ever granted before this table (a new store).
    known_since: Option<MonoMs>,
    /// The grant time of the last request forgotten.
    forgotten_through: Option<MonoMs>,
    /// Requests waiting in line.
    pub(super) waiting: HashMap<RequestKey, WaiterId, BuildHasherDefault<KeyHasher>>,
    /// The SipHash keys of this table's [`RequestKey`]s.
    keys: std::hash::RandomState,
    /// The leases that ended before the table started, as the store kept
    /// them (at most [`REPEATS_REMEMBERED_MAX`]); dropped once the table
    /// stops looking for them, [`REPEAT_MEMORY_MS`] after `known_since`.
    ended_before: HashSet<AcquisitionDigest>,
}

/// Hashes a [`RequestKey`], a SipHash already, as itself.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (a u64 key); bytes fold in all the same.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A request as the table knows it: a 64-bit SipHash of its first
/// claim's acquisition id (never the id itself), under keys drawn at
/// random for each table, so that no client can choose request ids whose
/// keys collide in the maps (they are used as their own hash). Not
/// SHA-256: this is computed on the engine's thread for every acquire
/// carrying an id.
pub(super) type RequestKey = u64;

impl Repeats {
    /// The key of the request whose first claim is `id`.
    pub(super) fn key_of(&self, id: &AcquisitionId) -> RequestKey {
        use std::hash::BuildHasher;
        self.keys.hash_one(id.as_bytes())
    }

    /// The table starts at `now`: it knows nothing granted before.
    pub(super) fn start(&mut self, now: MonoMs) {
        self.known_since = Some(now);
    }

    /// Whether the table still looks for late attempts of requests
    /// granted before it started: for [`REPEAT_MEMORY_MS`] after a start
    /// from a store that had issued tokens (it forgets the ended leases
    /// once it no longer looks).
    fn recovering(&mut self, now: MonoMs) -> bool {
        let looking = self
            .known_since
            .is_some_and(|since| now <= since.plus(REPEAT_MEMORY_MS));
        if !looking && !self.ended_before.is_empty() {
            self.ended_before = HashSet::new();
        }
        looking
    }

    /// Remembers a request granted at `now`.
    pub(super) fn granted(&mut self, now: MonoMs, key: RequestKey) {
        self.waiting.remove(&key);
        self.remember(now, key, true);
    }

    /// Remembers a request seen at `now` and not granted: refused, or
    /// withdrawn from the line.
    pub(super) fn not_granted(&mut self, now: MonoMs, key: RequestKey) {
        self.remember(now, key, false);
    }

    fn remember(&mut self, now: MonoMs, key: RequestKey, granted: bool) {
        match self.seen.get(&key).copied() {
            None => {
                self.seen.insert(key, granted);
                self.order.push_back((now, key));
            }
            // Granted once stays granted.
            Some(before) => {
                self.seen.insert(key, before || granted);
            }
        }
        self.forget_old(now);
    }

    fn forget_old(&mut self, now: MonoMs) {
        while let Some(&(at, key)) = self.order.front() {
            let old = at.plus(REPEAT_MEMORY_MS) < now;
            if !old && self.order.len() <= REPEATS_REMEMBERED_MAX {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&key);
            self.forgotten_through = Some(at);
        }
    }

    /// Whether a request first sent `first_sent_ms_ago` would be here if
    /// this table had granted it.
    fn covers(&self, now: MonoMs, first_sent_ms_ago: u64) -> bool {
        let slack_ms = SENT_SLACK_MS + first_sent_ms_ago / 100;
        let sent = now
            .0
            .checked_sub(first_sent_ms_ago.saturating_add(slack_ms));
        let after_start = match (self.known_since, sent) {
            (None, _) => true,
            (Some(since), Some(sent)) => sent >= since.0,
            (Some(_), None) => false,
        };
        after_start
            && self
                .forgotten_through
                .is_none_or(|f| sent.is_some_and(|s| s > f.0))
    }
}

/// What a request carrying an id is to the table.
pub(super) enum Seen {
    /// New: serve it, remembering it under this key.
    New(RequestKey),
    /// A repeat, answered.
    Answered(AcquireOutcome),
}

impl LeaseTable {
    /// Judges a request carrying an id before anything else is done with
    /// it (after its session, if any, was refreshed).
    pub(super) fn seen(&mut self, now: MonoMs, request: &AcquireRequest, attempt: Attempt) -> Seen {
        let key = self.repeats.key_of(&request.claims[0].acquisition_id);
        self.repeats.forget_old(now);
        if self.repeats.recovering(now) && self.granted_before_start(now, request, attempt) {
            return Seen::Answered(AcquireOutcome::Ended);
        }
        // Only a repeat looks among the held leases (a digest per claim):
        // a first attempt granted before, arriving late, is in `seen`.
        let held = match attempt {
            Attempt::Repeat { .. } => self.held_under(now, request),
            Attempt::First => Vec::new(),
        };
        if held.len() == request.claims.len() {
            return Seen::Answered(AcquireOutcome::Repeated(held));
        }
        let seen = self.repeats.seen.get(&key).copied();
        if !held.is_empty() || seen == Some(true) {
            return Seen::Answered(AcquireOutcome::Ended);
        }
        if let Some(&waiter) = self.repeats.waiting.get(&key) {
            // The repeat replaces the attempt it repeats, in its place.
            if let Some(queued) = self.take_over(now, waiter, request) {
                return Seen::Answered(queued);
            }
            return Seen::New(key);
        }
        match attempt {
            Attempt::Repeat { first_sent_ms_ago }
                if seen.is_none() && !self.repeats.covers(now, first_sent_ms_ago) =>
            {
                Seen::Answered(AcquireOutcome::Ended)
            }
            _ => Seen::New(key),
        }
    }

    /// Whether an attempt, soon after the table started, is a late one of
    /// a request granted before: a first attempt whose lease is held (a
    /// repeat finds its leases itself), or any whose lease ended then.
    fn granted_before_start(
        &self,
        now: MonoMs,
        request: &AcquireRequest,
        attempt: Attempt,
    ) -> bool {
        let ended = &self.repeats.ended_before;
        let ended_before = !ended.is_empty()
            && request
                .claims
                .iter()
                .any(|c| ended.contains(&c.acquisition_id.digest()));
        ended_before || (attempt == Attempt::First && !self.held_under(now, request).is_empty())
    }

    /// Gives a table recovered at a restart or a takeover the leases that
    /// ended before, as its store kept them ([`Write::LeaseEnded`]): for
    /// [`REPEAT_MEMORY_MS`] after the start, any attempt of their requests
    /// is answered "ended". At most [`REPEATS_REMEMBERED_MAX`] are kept.
    pub fn remember_ended(&mut self, ended: impl IntoIterator<Item = AcquisitionDigest>) {
        if self.repeats.known_since.is_some() {
            let ended = ended.into_iter().take(REPEATS_REMEMBERED_MAX);
            self.repeats.ended_before.extend(ended);
        }
    }

    /// The request's claims still held under its ids, as grants with the
    /// time they have left (a lease tied to a session: the session's TTL).
    fn held_under(&self, now: MonoMs, request: &AcquireRequest) -> Vec<Grant> {
        let held = request.claims.iter().filter_map(|claim| {
            let (resource, id) = (&claim.resource, &claim.acquisition_id);
            let (name, lease) = self
                .held_by(resource, id)
                .filter(|(_, l)| !self.is_gone(l))?;
            let ttl_ms = match lease.session() {
                Some(digest) => self.sessions.get(&digest).map_or(0, |s| s.ttl_ms),
                None => lease.expires_at.left_at(now),
            };
            Some(Grant {
                resource: resource.clone(),
                acquisition_id: *id,
                token: lease.token,
                slot: name.split_slot().map(|(_, slot)| slot),
                ttl_ms,
                waited_ms: 0,
            })
        });
        held.collect()
    }

    /// Moves a waiting request to the repeat's waiter id, keeping its
    /// place in every line; its wait now ends when the repeat's does. The
    /// earlier attempt's caller, if still there, hears "timed out". A
    /// repeat that does not wait withdraws the earlier attempt instead
    /// (`None`: serve the repeat as a new try-once request).
    fn take_over(
        &mut self,
        now: MonoMs,
        old: WaiterId,
        request: &AcquireRequest,
    ) -> Option<AcquireOutcome> {
        self.effects
            .woken
            .push((old, WaitResult::TimedOut(Vec::new())));
        let new = request.waiter;
        if request.wait_ms == 0 || self.waiters.contains_key(&new) {
            let deadline = self.waiters[&old].deadline;
            self.timers.remove(&(deadline, Timer::WaitDeadline(old)));
            self.remove_waiter(now, old);
            return None;
        }
        let mut w = self
            .waiters
            .remove(&old)
            .expect("a waiting request's waiter is in the table");
        self.timers.remove(&(w.deadline, Timer::WaitDeadline(old)));
        for claim in &w.claims {
            if let Some(queue) = self.queues.get_mut(&claim.resource) {
                queue
                    .iter_mut()
                    .filter(|q| **q == old)
                    .for_each(|q| *q = new);
            }
        }
        if let Some(session) = w.term.session().and_then(|d| self.sessions.get_mut(&d)) {
            session.waiters.remove(&old);
            session.waiters.insert(new);
        }
        w.deadline = now.plus(request.wait_ms);
        self.timers.insert((w.deadline, Timer::WaitDeadline(new)));
        if let Some(key) = w.key {
            self.repeats.waiting.insert(key, new);
        }
        self.waiters.insert(new, w);
        Some(AcquireOutcome::Queued { waiter: new })
    }
}
