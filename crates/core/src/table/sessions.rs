//! Sessions: one TTL, kept alive by one heartbeat, for many leases.
//!
//! A lease tied to a session has no expiry timer of its own: it lives
//! exactly as long as the session, and all of a session's leases end in
//! the same step when the session expires or is closed: from that step on
//! none of them is held for any caller, although a big session's leases
//! are dropped from the table a bounded number per step (`drain.rs`). A
//! session's waiters are withdrawn at that step too, before any lease is
//! dropped, so no grant ever goes to a session that has ended.

use super::Write;
use super::{
    Draining, Event, KeptAlive, LeaseTable, MonoMs, Session, SessionError, SessionRecord, Timer,
    WaitResult,
};
use crate::{ResourceName, SessionDigest};

/// What resuming a session did ([`crate::LeaseTable::resume`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// Kept alive, as by a heartbeat.
    Kept(KeptAlive),
    /// The session is not open (it expired or was closed).
    NotOpen,
    /// The session holds (or has yet to report) a resource the resumer
    /// may not hold; nothing changed.
    Refused,
}

/// Given a session's opener (`None` if it was opened without
/// authentication): whether the caller may act for it.
pub type MayActFor = Box<dyn Fn(Option<&str>) -> bool + Send>;

/// Whether the caller may hold a resource.
pub type MayHold = Box<dyn Fn(&ResourceName) -> bool + Send>;

/// Who may keep a session alive (resume it, or close it): asked about
/// the principal that opened it and about each resource it holds.
pub struct SessionCheck {
    /// See [`MayActFor`].
    pub may_act_for: MayActFor,
    /// See [`MayHold`].
    pub may_hold: MayHold,
}

impl SessionCheck {
    /// Accepts everything (authentication is off).
    pub fn anyone() -> Self {
        Self {
            may_act_for: Box::new(|_| true),
            may_hold: Box::new(|_| true),
        }
    }
}

impl std::fmt::Debug for SessionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionCheck")
    }
}

impl LeaseTable {
    /// Opens a session with its own TTL from `now`, recording the
    /// principal that opens it (`None` without authentication). The
    /// session must be durable before the opener hears of it: this sets
    /// `sync`.
    pub fn open_session(
        &mut self,
        now: MonoMs,
        digest: SessionDigest,
        ttl_ms: u64,
        opener: Option<String>,
    ) -> Result<(), SessionError> {
        self.tick(now);
        let l = &self.limits;
        if ttl_ms < l.ttl_ms_min || ttl_ms > l.ttl_ms_max {
            return Err(SessionError::TtlOutOfRange {
                ttl_ms,
                ttl_ms_min: l.ttl_ms_min,
                ttl_ms_max: l.ttl_ms_max,
            });
        }
        // An ended session whose leases are still being dropped keeps its
        // digest until the last one is gone: its leases name it.
        if self.sessions.contains_key(&digest) || self.draining.contains_key(&digest) {
            return Err(SessionError::AlreadyOpen);
        }
        if self.sessions.len() >= l.n_sessions_max {
            return Err(SessionError::TooManySessions {
                n_sessions: self.sessions.len(),
            });
        }
        self.check_session(opener.as_deref())
            .map_err(SessionError::OverQuota)?;
        self.insert_session(now, digest, ttl_ms, opener.clone());
        self.effects.writes.push(Write::PutSession {
            record: SessionRecord {
                digest,
                ttl_ms,
                opener,
            },
        });
        self.effects.sync = true;
        self.effects.events.push(Event::SessionOpened { digest });
        Ok(())
    }

    pub(super) fn insert_session(
        &mut self,
        now: MonoMs,
        digest: SessionDigest,
        ttl_ms: u64,
        opener: Option<String>,
    ) {
        self.insert_session_until(now.end_of(ttl_ms), digest, ttl_ms, opener);
    }

    /// A session with `ttl_ms` that ends at `expires_at` unless kept alive.
    pub(super) fn insert_session_until(
        &mut self,
        expires_at: MonoMs,
        digest: SessionDigest,
        ttl_ms: u64,
        opener: Option<String>,
    ) {
        self.timers
            .insert((expires_at, Timer::SessionExpiry(digest)));
        self.count_session(opener.as_deref(), true);
        self.sessions.insert(
            digest,
            Session {
                ttl_ms,
                expires_at,
                leases: Default::default(),
                waiters: Default::default(),
                revoked: Vec::new(),
                opener,
            },
        );
    }

    /// A heartbeat: extends the session by its TTL from `now` and returns
    /// that TTL with the session's leases fenced since the last heartbeat,
    /// or `None` if the session is not open (it expired or was closed;
    /// nothing is extended or recreated).
    pub fn keep_alive(&mut self, now: MonoMs, digest: SessionDigest) -> Option<KeptAlive> {
        self.tick(now);
        if !self.sessions.contains_key(&digest) {
            return None;
        }
        let ttl_ms = self.refresh_session(now, digest);
        let session = self.sessions.get_mut(&digest).expect("checked");
        Some(KeptAlive {
            ttl_ms,
            revoked: std::mem::take(&mut session.revoked),
        })
    }

    /// A client resuming the session on a new stream: a heartbeat, but
    /// only if `check` accepts the session's opener and every resource the
    /// session holds a lease on or has yet to report as revoked. Otherwise
    /// nothing changes (not the TTL, not the revoked list):
    /// [`Resumed::Refused`].
    pub fn resume(&mut self, now: MonoMs, digest: SessionDigest, check: &SessionCheck) -> Resumed {
        self.tick(now);
        if !self.sessions.contains_key(&digest) {
            return Resumed::NotOpen;
        }
        if !self.may_keep(digest, check) {
            return Resumed::Refused;
        }
        match self.keep_alive(now, digest) {
            Some(kept) => Resumed::Kept(kept),
            None => Resumed::NotOpen,
        }
    }

    /// Moves an open session's expiry to a full TTL from `now`.
    pub(super) fn refresh_session(&mut self, now: MonoMs, digest: SessionDigest) -> u64 {
        let session = self
            .sessions
            .get_mut(&digest)
            .expect("refreshing an open session");
        let old = session.expires_at;
        session.expires_at = now.end_of(session.ttl_ms);
        let (ttl_ms, new) = (session.ttl_ms, session.expires_at);
        self.timers.remove(&(old, Timer::SessionExpiry(digest)));
        self.timers.insert((new, Timer::SessionExpiry(digest)));
        ttl_ms
    }

    /// Whether `check` accepts the (open) session's opener and every
    /// resource it holds a lease on or has yet to report as revoked.
    fn may_keep(&self, digest: SessionDigest, check: &SessionCheck) -> bool {
        let Some(session) = self.sessions.get(&digest) else {
            return true;
        };
        if !(check.may_act_for)(session.opener.as_deref()) {
            return false;
        }
        let mut names = session
            .leases
            .iter()
            .chain(session.revoked.iter().map(|(r, _)| r));
        names.all(|r| (check.may_hold)(r))
    }

    /// [`LeaseTable::close_session`], only if `check` accepts the session
    /// (closing releases its leases); `None`, with nothing changed,
    /// otherwise.
    pub fn close_session_as(
        &mut self,
        now: MonoMs,
        digest: SessionDigest,
        check: &SessionCheck,
    ) -> Option<bool> {
        self.tick(now);
        if !self.may_keep(digest, check) {
            return None;
        }
        Some(self.close_session(now, digest))
    }

    /// Ends a session at its client's request: withdraws its waiters and
    /// releases its leases. `false` if it was not open.
    pub fn close_session(&mut self, now: MonoMs, digest: SessionDigest) -> bool {
        self.tick(now);
        let Some(session) = self.sessions.get(&digest) else {
            return false;
        };
        let at = session.expires_at;
        self.timers.remove(&(at, Timer::SessionExpiry(digest)));
        self.end_session(now, digest, false);
        true
    }

    /// Open sessions (O(1)).
    pub fn n_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Withdraws the session's waiters, forgets the session, and starts
    /// dropping its leases (handing each resource to its next waiter): the
    /// first bounded step now, the rest in later steps (`drain.rs`). From
    /// here on every one of its leases is gone for every caller. Its timer
    /// is already gone (popped, or removed by the caller).
    pub(super) fn end_session(&mut self, now: MonoMs, digest: SessionDigest, expired: bool) {
        let session = self
            .sessions
            .get_mut(&digest)
            .expect("ending an open session");
        // Due now: withdrawing one waiter must not hand a resource to the
        // next waiter of this same session (see `pump`).
        session.expires_at = now;
        let waiters = std::mem::take(&mut session.waiters);
        for waiter in waiters {
            let deadline = self.waiters[&waiter].deadline;
            self.timers.remove(&(deadline, Timer::WaitDeadline(waiter)));
            self.remove_waiter(now, waiter);
            self.effects.woken.push((waiter, WaitResult::SessionEnded));
        }
        let session = self.sessions.remove(&digest).expect("still open");
        self.count_session(session.opener.as_deref(), false);
        let n_leases = session.leases.len();
        self.n_leases -= n_leases;
        self.effects.writes.push(Write::DeleteSession { digest });
        self.effects.events.push(Event::SessionEnded {
            digest,
            expired,
            n_leases,
        });
        if n_leases > 0 {
            self.draining.insert(
                digest,
                Draining {
                    leases: session.leases,
                    expired,
                },
            );
            // Gone for every caller from here: those with waiters go now.
            let waited = self.waiting_on_ended(self.draining[&digest].leases.iter(), n_leases);
            for resource in &waited {
                self.settle_and_pump(now, resource);
            }
            self.drain_session(now, digest);
        }
    }

    /// Forgets `waiter` in its session's set (it was granted or withdrawn).
    pub(super) fn unbind_waiter(
        &mut self,
        waiter: crate::WaiterId,
        session: Option<SessionDigest>,
    ) {
        if let Some(s) = session.and_then(|d| self.sessions.get_mut(&d)) {
            s.waiters.remove(&waiter);
        }
    }
}
