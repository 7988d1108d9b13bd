//! A worker: acquires a resource, keeps its lease with the client
//! library's own deadline rule (`baton_client::deadline::Deadline`,
//! counted from each request's send time on the worker's clock) on the
//! keeper's own schedule (`KeeperConfig`'s interval and margin, its
//! `Backoff` after a failed renewal), writes
//! to the fenced resource only while that deadline says it holds the
//! lease, and releases it when done. Every call has a timeout; a call
//! that times out is reported indeterminate.
//!
//! Odd-numbered workers hold their leases in a session, as the session
//! driver does (`crates/client/src/session/driver.rs`): one heartbeat
//! every third of the session's TTL keeps every lease of the session,
//! the same `Deadline` is counted from each acknowledged heartbeat's send
//! time, a lease the heartbeat reports revoked is given up, and the
//! session is closed after a few leases and a new one opened.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_client::deadline::Deadline;
use baton_client::rng::Rng;
use baton_client::worker::{Backoff, KeeperConfig};
use baton_core::{AcquisitionId, FencingToken, SessionDigest, Shape};

use crate::world::{Addr, Answer, Clock, Msg, Request};
use crate::{Ctx, SimMs};

mod session;

/// How long a worker waits for an answer.
const RPC_TIMEOUT_MS: u64 = 400;

struct Hold {
    resource: u8,
    /// A permit's slot: its writes go under that slot's resource.
    slot: Option<u32>,
    id: AcquisitionId,
    token: FencingToken,
    grant: usize,
    ttl_ms: u64,
    /// The lease's own deadline; `None`: it lives with the session.
    deadline: Option<Deadline<SimMs>>,
    next_renew_ms: u64,
    /// The keeper's renew interval (`KeeperConfig::interval`).
    interval_ms: u64,
    /// The keeper's backoff between failed renewals.
    retry: Backoff,
    renewing: bool,
    writes_left: u32,
    next_write_ms: u64,
}

enum State {
    Idle { until_ms: u64 },
    Acquiring { op: u64 },
    Holding(Hold),
}

/// An open session: its heartbeat and the deadline it keeps.
struct Session {
    digest: SessionDigest,
    ttl_ms: u64,
    deadline: Deadline<SimMs>,
    next_beat_ms: u64,
    beating: bool,
    /// Leases to take under it before closing it.
    leases_left: u32,
}

struct Call {
    request: Request,
    sent_ms: u64,
    sent_true: u64,
    timeout_ms: u64,
}

pub struct Client {
    pub id: usize,
    pub clock: Clock,
    pub gen: u64,
    rng: Rng,
    target: usize,
    state: State,
    calls: BTreeMap<u64, Call>,
    next_op: u64,
    /// Holds its leases in a session.
    sessioned: bool,
    session: Option<Session>,
    /// The open request in flight.
    opening: Option<u64>,
}

impl Client {
    pub fn new(id: usize, clock: Clock, seed: u64) -> Self {
        Self {
            id,
            clock,
            gen: 0,
            rng: Rng::new(seed),
            target: 0,
            state: State::Idle { until_ms: 0 },
            calls: BTreeMap::new(),
            next_op: 0,
            sessioned: id % 2 == 1,
            session: None,
            opening: None,
        }
    }

    fn me(&self) -> Addr {
        Addr::Client(self.id)
    }

    fn call(&mut self, ctx: &mut Ctx, request: Request, timeout_ms: u64) -> u64 {
        self.next_op += 1;
        let op = (self.id as u64) << 32 | self.next_op;
        let now = self.clock.local(ctx.now);
        let to = Addr::Node(self.target);
        ctx.send(
            self.me(),
            to,
            Msg::Call {
                op,
                request: request.clone(),
            },
        );
        ctx.check.ops_started += 1;
        self.calls.insert(
            op,
            Call {
                request,
                sent_ms: now,
                sent_true: ctx.now,
                timeout_ms: now + timeout_ms,
            },
        );
        op
    }

    pub fn on_wake(&mut self, ctx: &mut Ctx, gen: u64) {
        if gen != self.gen {
            return;
        }
        let now = self.clock.local(ctx.now);
        self.time_out_calls(ctx, now);
        self.keep_session(ctx, now);
        match &mut self.state {
            State::Idle { until_ms } if now >= *until_ms => {
                if !self.sessioned {
                    self.acquire(ctx, None);
                } else if let Some(digest) = self.session.as_ref().map(|s| s.digest) {
                    self.acquire(ctx, Some(digest));
                } else if self.opening.is_none() {
                    self.open_session(ctx);
                }
            }
            State::Holding(_) => self.keep(ctx, now),
            _ => {}
        }
        self.schedule(ctx);
    }

    /// Sixteen bytes no other worker draws.
    fn fresh_id(&mut self) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.rng.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&(self.id as u64).to_le_bytes());
        bytes
    }

    fn time_out_calls(&mut self, ctx: &mut Ctx, now: u64) {
        let due: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| now >= c.timeout_ms)
            .map(|(op, _)| *op)
            .collect();
        for op in due {
            let call = self.calls.remove(&op).expect("listed");
            ctx.check.ops_indeterminate += 1;
            self.target = ctx.rng.below(ctx.n_nodes as u64) as usize;
            match (&mut self.state, call.request) {
                (State::Acquiring { op: o }, _) if *o == op => self.idle(now, 50),
                (State::Holding(h), Request::Renew { .. }) => {
                    h.renewing = false;
                    h.next_renew_ms = now + h.retry.next_delay().as_millis() as u64;
                }
                (_, Request::KeepAlive { digest }) => {
                    if let Some(s) = self.session.as_mut().filter(|s| s.digest == digest) {
                        s.beating = false;
                    }
                }
                (_, Request::OpenSession { .. }) => self.opening = None,
                _ => {}
            }
        }
    }

    fn idle(&mut self, now: u64, max_ms: u64) {
        self.state = State::Idle {
            until_ms: now + self.rng.between(1, max_ms),
        };
    }

    fn acquire(&mut self, ctx: &mut Ctx, session: Option<SessionDigest>) {
        let resource = self.rng.below(ctx.names.len() as u64) as u8;
        let bytes = self.fresh_id();
        let ttl_ms = self.rng.between(1_000, 8_000);
        let wait_ms = if self.rng.below(2) == 0 {
            0
        } else {
            self.rng.between(100, 1_000)
        };
        let shape = match resource {
            crate::SEMAPHORE => Shape::Permits(crate::SEMAPHORE_PERMITS),
            crate::SHARED_LOCK if self.rng.below(3) > 0 => Shape::Shared,
            _ => Shape::Exclusive,
        };
        let request = Request::Acquire {
            resource,
            id: AcquisitionId::from_bytes(bytes),
            ttl_ms,
            wait_ms,
            session,
            shape,
        };
        let op = self.call(ctx, request, RPC_TIMEOUT_MS + wait_ms);
        self.state = State::Acquiring { op };
    }

    /// The keeper and the work: lose the lease at the safe deadline,
    /// renew every third of the TTL, write while held, release when done.
    fn keep(&mut self, ctx: &mut Ctx, now: u64) {
        let State::Holding(h) = &mut self.state else {
            return;
        };
        let session = self.session.as_ref().map(|s| s.deadline);
        let Some(safe_until) = h.deadline.or(session).map(|d| d.safe_until()) else {
            // Granted under a session given up meanwhile: never held.
            self.idle(now, 200);
            return;
        };
        if SimMs(now) >= safe_until {
            ctx.trace
                .record(ctx.now, &(self.id, h.token.get(), 2u8), || {
                    format!("c{} lost {} at its deadline", self.id, h.token)
                });
            self.idle(now, 200);
            return;
        }
        if now >= h.next_write_ms && h.writes_left > 0 {
            h.writes_left -= 1;
            h.next_write_ms = now + h.ttl_ms / 8;
            self.next_op += 1;
            let op = (self.id as u64) << 32 | self.next_op;
            ctx.check.claimed(ctx.now, h.grant);
            if h.deadline.is_none() {
                ctx.check.session_claims += 1;
            }
            let msg = Msg::Write {
                op,
                resource: h.resource,
                slot: h.slot,
                token: h.token,
            };
            ctx.send(Addr::Client(self.id), Addr::Resources, msg);
        }
        if h.writes_left == 0 {
            let (resource, id, grant) = (h.resource, h.id, h.grant);
            ctx.check.released(ctx.now, grant);
            self.call(ctx, Request::Release { resource, id }, RPC_TIMEOUT_MS);
            self.idle(now, 300);
            self.lease_done(ctx);
            return;
        }
        if now >= h.next_renew_ms && !h.renewing && h.deadline.is_some() {
            h.renewing = true;
            let left = safe_until.0 - now;
            let request = Request::Renew {
                resource: h.resource,
                id: h.id,
            };
            self.call(ctx, request, left.min(RPC_TIMEOUT_MS));
        }
    }

    pub fn on_reply(&mut self, ctx: &mut Ctx, op: u64, answer: Answer) {
        let Some(call) = self.calls.remove(&op) else {
            return; // late, duplicated, or after its timeout
        };
        let now = self.clock.local(ctx.now);
        match answer {
            Answer::NotLeader { hint } => {
                self.target = hint.unwrap_or_else(|| ctx.rng.below(ctx.n_nodes as u64) as usize);
            }
            Answer::Indeterminate => ctx.check.ops_indeterminate += 1,
            _ => {}
        }
        self.on_session_reply(ctx, op, &call, &answer);
        match (&mut self.state, call.request, answer) {
            (
                State::Acquiring { op: o },
                Request::Acquire { resource, id, .. },
                Answer::Granted {
                    token,
                    ttl_ms,
                    slot,
                },
            ) if *o == op => {
                let grant =
                    ctx.check
                        .granted((resource, slot), token, call.sent_true, ctx.now, ttl_ms);
                // The keeper's own schedule and margin (`worker.rs`).
                let keeper = KeeperConfig::default();
                let (ttl, sent) = (ms(ttl_ms), SimMs(call.sent_ms));
                let interval = keeper.interval(ttl);
                let own = (!self.sessioned)
                    .then(|| Deadline::opened_with_margin(sent, ttl, keeper.margin(ttl)));
                let interval_ms = interval.as_millis() as u64;
                self.state = State::Holding(Hold {
                    resource,
                    slot,
                    id,
                    token,
                    grant,
                    ttl_ms,
                    deadline: own,
                    next_renew_ms: call.sent_ms + interval_ms,
                    interval_ms,
                    retry: Backoff::with_seed(interval / 8, interval / 2, self.rng.next_u64()),
                    renewing: false,
                    writes_left: self.rng.between(2, 12) as u32,
                    next_write_ms: now,
                });
            }
            (State::Acquiring { op: o }, _, _) if *o == op => self.idle(now, 300),
            (State::Holding(h), Request::Renew { id, .. }, answer) if id == h.id => {
                h.renewing = false;
                match answer {
                    Answer::Renewed { remaining_ms } => {
                        if let Some(d) = h.deadline.as_mut() {
                            d.acknowledged(SimMs(call.sent_ms), SimMs(now), ms(remaining_ms));
                        }
                        ctx.check.extended(h.grant, call.sent_true);
                        h.retry.reset();
                        h.next_renew_ms = call.sent_ms + h.interval_ms;
                    }
                    Answer::NotOwner => self.idle(now, 200),
                    _ => h.next_renew_ms = now + h.retry.next_delay().as_millis() as u64,
                }
            }
            _ => {}
        }
        self.schedule(ctx);
    }

    pub fn schedule(&mut self, ctx: &mut Ctx) {
        let mut at = self.calls.values().map(|c| c.timeout_ms).min();
        let mut consider = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        if let Some(s) = &self.session {
            consider(s.deadline.safe_until().0);
            if !s.beating {
                consider(s.next_beat_ms);
            }
        }
        match &self.state {
            // Not while its session's open is in flight: its answer or
            // timeout wakes it.
            State::Idle { until_ms } if self.opening.is_none() => consider(*until_ms),
            State::Idle { .. } => {}
            State::Acquiring { .. } => {}
            State::Holding(h) => {
                if let Some(d) = h.deadline {
                    consider(d.safe_until().0);
                }
                if h.writes_left > 0 {
                    consider(h.next_write_ms);
                }
                if !h.renewing && h.deadline.is_some() {
                    consider(h.next_renew_ms);
                }
            }
        }
        if let Some(local) = at {
            self.gen += 1;
            let t = self.clock.true_at(local).max(ctx.now);
            ctx.queue.push(
                t,
                crate::world::Ev::Wake {
                    who: self.me(),
                    gen: self.gen,
                },
            );
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
