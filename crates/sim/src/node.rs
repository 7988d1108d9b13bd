//! One `baton serve`: a single server on its disk, or a member of a
//! cluster over the shared store, whose election runs the cluster's own
//! rules (`baton_store_pg::election`: when to take over, until when to
//! answer).

use baton_core::{LeaseTable, Limits, MonoMs};
use baton_store::Stored;
use baton_store_pg::election::{Timing, Verdict, Watch};

use crate::disk::Disk;
use crate::engine::{Engine, Step};
use crate::shared::{StoreAns, StoreReq, WriteKey};
use crate::world::{Addr, Answer, Clock, Msg, Request};
use crate::Ctx;

/// The leadership lease of the simulated cluster.
pub const TIMING: Timing = Timing { ttl_ms: 2_000 };

/// A commit to the shared store unanswered this long failed (the
/// connection's timeout): the engine stops, as on any commit error.
const COMMIT_TIMEOUT_MS: u64 = 500;

/// What a node is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Down,
    /// A single server: answers for good while up.
    Solo,
    Follower,
    /// Leads `term`, answering until `deadline_ms` on its clock.
    Leader {
        term: u64,
        deadline_ms: u64,
    },
}

pub struct Node {
    pub id: usize,
    pub clock: Clock,
    pub role: Role,
    pub incarnation: u64,
    pub gen: u64,
    pub engine: Option<Engine>,
    pub disk: Disk,
    watch: Watch,
    /// When a store request of the election was sent, while it is in
    /// flight (no second one meanwhile, unless it is lost).
    asking: Option<u64>,
    next_poll_ms: u64,
    next_beat_ms: u64,
    pub leader_hint: Option<usize>,
    /// The commit in flight to the shared store, sent at this reading.
    committing: Option<u64>,
}

impl Node {
    pub fn new(id: usize, clock: Clock, solo: bool) -> Self {
        Self {
            id,
            clock,
            role: if solo { Role::Solo } else { Role::Follower },
            incarnation: 0,
            gen: 0,
            engine: None,
            disk: Disk::new(),
            watch: Watch::new(TIMING, &id.to_string()),
            asking: None,
            next_poll_ms: 0,
            next_beat_ms: 0,
            leader_hint: None,
            committing: None,
        }
    }

    pub fn local(&self, ctx: &Ctx) -> u64 {
        self.clock.local(ctx.now)
    }

    /// Starts (or restarts) the node: a single server loads its disk.
    pub fn start(&mut self, ctx: &mut Ctx, solo: bool) {
        self.incarnation += 1;
        self.asking = None;
        let now = self.local(ctx);
        if solo {
            let stored = self.disk.load();
            ctx.check.recovered(ctx.now, &stored);
            self.engine = Some(Engine::new(recover(now, stored), MonoMs(now)));
            self.role = Role::Solo;
        } else {
            self.watch = Watch::new(TIMING, &self.id.to_string());
            self.role = Role::Follower;
            self.next_poll_ms = now;
        }
        self.schedule(ctx);
    }

    /// `kill -9`: everything in memory is gone, answers owed are never sent.
    pub fn crash(&mut self, ctx: &mut Ctx) {
        self.engine = None;
        self.committing = None;
        self.role = Role::Down;
        self.incarnation += 1;
        let tear = self.disk.crash(&mut ctx.rng);
        ctx.trace.record(ctx.now, &(self.id, tear), || {
            format!("n{} crash, tail {tear:?}", self.id)
        });
    }

    /// Whether the node answers as leader now (the seat's check).
    fn answers(&self, ctx: &Ctx) -> bool {
        match self.role {
            Role::Solo => true,
            Role::Leader { deadline_ms, .. } => Timing::answers(self.local(ctx), deadline_ms),
            _ => false,
        }
    }

    pub fn on_call(&mut self, ctx: &mut Ctx, from: Addr, op: u64, request: Request) {
        if self.role == Role::Down {
            return;
        }
        if !self.answers(ctx) || self.engine.is_none() {
            let hint = self.leader_hint.filter(|h| *h != self.id);
            ctx.send(
                Addr::Node(self.id),
                from,
                Msg::Reply {
                    op,
                    answer: Answer::NotLeader { hint },
                },
            );
            return;
        }
        let now = MonoMs(self.local(ctx));
        let step = self
            .engine
            .as_mut()
            .expect("checked")
            .call(now, from, op, request, &ctx.names);
        self.run_step(ctx, step);
    }

    pub fn on_wake(&mut self, ctx: &mut Ctx, gen: u64) {
        if gen != self.gen || self.role == Role::Down {
            return;
        }
        let now = self.local(ctx);
        if let Role::Leader { term, deadline_ms } = self.role {
            if !Timing::answers(now, deadline_ms) {
                self.step_down(ctx, term, "deadline passed");
            } else if self
                .committing
                .is_some_and(|at| now >= at + COMMIT_TIMEOUT_MS)
            {
                self.step_down(ctx, term, "commit timed out");
            }
        }
        if let Some(engine) = self.engine.as_mut() {
            let step = engine.tick(MonoMs(now));
            self.run_step(ctx, step);
        }
        self.elect(ctx, now);
        self.schedule(ctx);
    }

    /// The election task's timers: a follower polls, a leader renews.
    fn elect(&mut self, ctx: &mut Ctx, now: u64) {
        if self.asking.is_some_and(|at| now < at + TIMING.ttl_ms / 4) {
            return;
        }
        let req = match self.role {
            Role::Follower if now >= self.next_poll_ms => {
                self.next_poll_ms = now + TIMING.poll_interval_ms();
                StoreReq::Read
            }
            Role::Leader { term, .. } if now >= self.next_beat_ms => {
                self.next_beat_ms = now + TIMING.renew_interval_ms();
                StoreReq::Beat { term, sent_ms: now }
            }
            _ => return,
        };
        self.ask(ctx, req);
    }

    fn ask(&mut self, ctx: &mut Ctx, req: StoreReq) {
        if !matches!(req, StoreReq::Commit { .. } | StoreReq::StepDown { .. }) {
            self.asking = Some(self.local(ctx));
        }
        let node_incarnation = self.incarnation;
        ctx.send(
            Addr::Node(self.id),
            Addr::Store,
            Msg::ToStore {
                node_incarnation,
                req,
            },
        );
    }

    pub fn on_store(&mut self, ctx: &mut Ctx, incarnation: u64, ans: StoreAns) {
        if incarnation != self.incarnation || self.role == Role::Down {
            return;
        }
        let now = self.local(ctx);
        match ans {
            StoreAns::Row(row) => {
                self.asking = None;
                self.leader_hint = row.0.holder.as_deref().and_then(|h| h.parse().ok());
                if self.role == Role::Follower
                    && self.watch.observe(now, &row.0) == Verdict::TakeOver
                {
                    let row = row.clone();
                    self.ask(
                        ctx,
                        StoreReq::TakeOver {
                            seen: row,
                            sent_ms: now,
                        },
                    );
                }
            }
            StoreAns::Lost => self.asking = None,
            StoreAns::Won {
                term,
                sent_ms,
                state,
            } => {
                self.asking = None;
                self.lead(ctx, term, sent_ms, state.0);
            }
            StoreAns::Beat { term, sent_ms, ok } => {
                self.asking = None;
                match self.role {
                    Role::Leader {
                        term: t,
                        deadline_ms,
                    } if t == term && ok => {
                        let deadline_ms = deadline_ms.max(TIMING.deadline_ms(sent_ms));
                        self.role = Role::Leader { term, deadline_ms };
                    }
                    Role::Leader { term: t, .. } if t == term => {
                        self.step_down(ctx, term, "deposed")
                    }
                    _ => {}
                }
            }
            StoreAns::Committed { term, seq, ok } => match self.role {
                Role::Leader { term: t, .. } if t == term && ok => {
                    self.committing = None;
                    self.committed(ctx, seq)
                }
                Role::Leader { term: t, .. } if t == term => {
                    self.step_down(ctx, term, "commit refused")
                }
                _ => {}
            },
        }
        self.schedule(ctx);
    }

    fn lead(&mut self, ctx: &mut Ctx, term: u64, sent_ms: u64, stored: Stored) {
        let now = self.local(ctx);
        let deadline_ms = TIMING.deadline_ms(sent_ms);
        if self.role != Role::Follower || !Timing::answers(now, deadline_ms) {
            self.ask(ctx, StoreReq::StepDown { term });
            return;
        }
        ctx.check.recovered(ctx.now, &stored);
        self.engine = Some(Engine::new(recover(now, stored), MonoMs(now)));
        self.role = Role::Leader { term, deadline_ms };
        self.leader_hint = Some(self.id);
        self.next_beat_ms = now + TIMING.renew_interval_ms();
        ctx.trace.record(ctx.now, &(self.id, term), || {
            format!("n{} leads term {term}", self.id)
        });
    }

    fn step_down(&mut self, ctx: &mut Ctx, term: u64, why: &str) {
        ctx.trace.record(ctx.now, &(self.id, term, 1u8), || {
            format!("n{} steps down from {term}: {why}", self.id)
        });
        self.committing = None;
        if let Some(engine) = self.engine.take() {
            for (to, op, answer) in engine.abandon() {
                ctx.send(Addr::Node(self.id), to, Msg::Reply { op, answer });
            }
        }
        self.watch.ended_own_term(term);
        self.role = Role::Follower;
        self.leader_hint = None;
        self.ask(ctx, StoreReq::StepDown { term });
        self.asking = None;
    }

    /// A commit is durable (the disk synced it, or the store committed it).
    pub fn committed(&mut self, ctx: &mut Ctx, seq: u64) {
        if let Some(engine) = self.engine.as_mut() {
            let step = engine.committed(seq);
            self.run_step(ctx, step);
        }
    }

    pub fn on_synced(&mut self, ctx: &mut Ctx, incarnation: u64, seq: u64) {
        if incarnation == self.incarnation && self.role == Role::Solo {
            self.disk.synced(seq);
            self.committed(ctx, seq);
            self.schedule(ctx);
        }
    }

    fn run_step(&mut self, ctx: &mut Ctx, step: Step) {
        // Only the table of the store's current term speaks for the
        // server; a deposed leader's table is a ghost until it notices.
        let authoritative = match self.role {
            Role::Solo => true,
            Role::Leader { term, .. } => term == ctx.store_term,
            _ => false,
        };
        for e in step.events.iter().filter(|_| authoritative) {
            ctx.check.server_event(ctx.now, e);
        }
        let confirmed = self.answers(ctx);
        for (to, op, answer) in step.now {
            // The seat's confirm: an answer computed by a term that ended is unknown.
            let answer = if confirmed {
                answer
            } else {
                Answer::Indeterminate
            };
            ctx.send(Addr::Node(self.id), to, Msg::Reply { op, answer });
        }
        let Some((seq, writes)) = step.commit else {
            return;
        };
        match self.role {
            Role::Solo => {
                self.disk.write(seq, &writes);
                let at = ctx.now + ctx.disk_latency_ms();
                ctx.queue.push(
                    at,
                    crate::world::Ev::Synced {
                        node: self.id,
                        incarnation: self.incarnation,
                        seq,
                    },
                );
            }
            Role::Leader { term, .. } => {
                self.committing = Some(self.local(ctx));
                let writes = writes.into_iter().map(WriteKey).collect();
                self.ask(ctx, StoreReq::Commit { term, seq, writes });
            }
            _ => {}
        }
    }

    /// Wakes the node at its next timer.
    pub fn schedule(&mut self, ctx: &mut Ctx) {
        if self.role == Role::Down {
            return;
        }
        let mut at: Option<u64> = self
            .engine
            .as_ref()
            .and_then(|e| e.next_wake())
            .map(|m| m.0);
        let mut consider = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        let unblocked = self.asking.map_or(0, |asked| asked + TIMING.ttl_ms / 4);
        match self.role {
            Role::Follower => consider(self.next_poll_ms.max(unblocked)),
            Role::Leader { deadline_ms, .. } => {
                consider(self.next_beat_ms.max(unblocked));
                if deadline_ms > self.local(ctx) {
                    consider(deadline_ms);
                }
                if let Some(at) = self.committing {
                    consider(at + COMMIT_TIMEOUT_MS);
                }
            }
            _ => {}
        }
        if let Some(local) = at {
            self.gen += 1;
            let t = self.clock.true_at(local).max(ctx.now);
            ctx.queue.push(
                t,
                crate::world::Ev::Wake {
                    who: Addr::Node(self.id),
                    gen: self.gen,
                },
            );
        }
    }
}

/// The table a (re)start or a takeover leads from: the real recovery,
/// every lease held a full TTL from now. It drops ended leases two per
/// step, so that a few leases ending together (an ended session's, or
/// expiries in one tick) already take several steps, with faults between.
fn recover(now: u64, stored: Stored) -> LeaseTable {
    let mut table = LeaseTable::recover(
        Limits::default(),
        MonoMs(now),
        stored.epoch,
        stored.counter,
        stored.leases,
        stored.sessions,
    );
    table.set_ends_per_step(ENDS_PER_STEP);
    table
}

/// Ended leases dropped per step in the simulated servers.
const ENDS_PER_STEP: usize = 2;
