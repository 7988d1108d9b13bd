//! The server's engine without its threads: the real lease table and the
//! real commit pipeline (`baton_core::pipeline`, which the server's
//! engine and committer run), stepped by the simulator. Each request is
//! applied at the node's clock as `crates/server/src/engine/apply.rs`
//! applies it (renewals and releases answered at once, the rest deferred
//! to the step's commit), the pipeline decides which writes the step
//! hands over (lazy releases and expiries wait for the flush) and
//! `pipeline::batch` decides what each commit holds and which answers
//! wait for it. What is the shell's own: one commit in flight at a time,
//! the jobs queued meanwhile (the server's channel), and the numbering
//! of commits.

use baton_core::pipeline::{self, Job, Pipeline};
use baton_core::{
    AcquireError, AcquireOutcome, AcquireRequest, Event, LeaseTable, LeaseTerm, MonoMs,
    ReleaseOutcome, RenewOutcome, ResourceName, SessionError, WaitResult, WaiterId, Write,
};

use crate::world::{Addr, Answer, Request};

/// An answer to send: to whom, for which call.
pub type Out = (Addr, u64, Answer);

/// What a step asks of the shell.
#[derive(Default)]
pub struct Step {
    /// Answers that may go now.
    pub now: Vec<Out>,
    /// A commit to start: its number and writes.
    pub commit: Option<(u64, Vec<Write>)>,
    /// The table's events, for the checker's view of the truth.
    pub events: Vec<Event>,
}

/// The table, its pipeline, and the jobs the committer has not taken.
pub struct Engine {
    pub table: LeaseTable,
    pipeline: Pipeline<(Addr, u64)>,
    /// Steps handed to the committer while its commit was in flight (the
    /// server's channel).
    queued: Vec<Job<Vec<Out>>>,
    /// The commit in flight, and the answers released when it is durable.
    in_flight: Option<(u64, Vec<Out>)>,
    next_seq: u64,
    next_waiter: u64,
}

impl Engine {
    pub fn new(table: LeaseTable, now: MonoMs) -> Self {
        Self {
            table,
            // No watcher is simulated: change numbers start again with
            // each engine (the server's come from its store).
            pipeline: Pipeline::new(now, 0),
            queued: Vec::new(),
            in_flight: None,
            next_seq: 0,
            next_waiter: 0,
        }
    }

    /// When the table next needs a step without a request.
    pub fn next_wake(&self) -> Option<MonoMs> {
        self.pipeline.next_wake(&self.table)
    }

    /// One request, at the node's clock reading `now`, applied as the
    /// server's `apply.rs` applies it: renewals, releases and session
    /// heartbeats and closes are answered at once, the rest with the
    /// step's commit.
    pub fn call(
        &mut self,
        now: MonoMs,
        from: Addr,
        op: u64,
        request: Request,
        names: &[ResourceName],
    ) -> Step {
        let mut step = Step::default();
        let name = |r: u8| names[usize::from(r)].clone();
        let answer = match request {
            Request::Acquire {
                resource,
                id,
                ttl_ms,
                wait_ms,
                session,
                shape,
            } => {
                self.next_waiter += 1;
                let mut req = AcquireRequest::single(name(resource), id, ttl_ms);
                req.claims[0].shape = shape;
                req.wait_ms = wait_ms;
                req.waiter = WaiterId(self.next_waiter);
                req.term = session.map_or(req.term, LeaseTerm::Session);
                self.acquire(now, (from, op), req)
            }
            Request::Renew { resource, id } => {
                At(match self.table.renew(now, &name(resource), &id) {
                    RenewOutcome::Renewed { ttl_ms, .. } => Answer::Renewed {
                        remaining_ms: ttl_ms,
                    },
                    RenewOutcome::NotOwner => Answer::NotOwner,
                })
            }
            Request::Release { resource, id } => {
                At(match self.table.release(now, &name(resource), &id) {
                    ReleaseOutcome::Released { .. } => Answer::Released,
                    ReleaseOutcome::NotHeld => Answer::NotOwner,
                })
            }
            Request::Fence { resource } => {
                let out = self.table.fence(now, &name(resource));
                Deferred(Answer::Fenced {
                    token: out.token,
                    revoked: out.revoked,
                })
            }
            r @ (Request::OpenSession { .. }
            | Request::KeepAlive { .. }
            | Request::CloseSession { .. }) => self.session(now, r, names),
        };
        let mut deferred = Vec::new();
        match answer {
            At(a) => step.now.push((from, op, a)),
            Deferred(a) => deferred.push((from, op, a)),
            Queued => {}
        }
        self.settle(now, step, deferred)
    }

    /// A session's open, heartbeat or close.
    fn session(&mut self, now: MonoMs, request: Request, names: &[ResourceName]) -> When {
        match request {
            Request::OpenSession { digest, ttl_ms } => {
                match self.table.open_session(now, digest, ttl_ms, None) {
                    Ok(()) => Deferred(Answer::Opened),
                    // A duplicated open, delivered again: its caller
                    // already heard (or gave up on) the first answer.
                    Err(SessionError::AlreadyOpen) => Deferred(Answer::NotOpen),
                    Err(e) => panic!("the simulator opened a session badly: {e}"),
                }
            }
            Request::KeepAlive { digest } => At(match self.table.keep_alive(now, digest) {
                Some(kept) => Answer::Kept {
                    ttl_ms: kept.ttl_ms,
                    revoked: kept
                        .revoked
                        .iter()
                        .map(|(r, t)| (index_of(names, r), *t))
                        .collect(),
                },
                None => Answer::NotOpen,
            }),
            Request::CloseSession { digest } => {
                self.table.close_session(now, digest);
                At(Answer::Closed)
            }
            _ => unreachable!("not a session request"),
        }
    }

    /// Runs the table's due timers.
    pub fn tick(&mut self, now: MonoMs) -> Step {
        self.settle(now, Step::default(), Vec::new())
    }

    /// The commit `seq` is durable: its answers may go, and the committer
    /// takes the next batch.
    pub fn committed(&mut self, seq: u64) -> Step {
        let mut step = Step::default();
        match self.in_flight.take() {
            Some((s, outs)) if s == seq => step.now.extend(outs),
            // Not the commit in flight (an answer to an older one).
            other => self.in_flight = other,
        }
        self.take_batch(&mut step);
        step
    }

    /// Everything still owed an answer: the engine stopped, so their
    /// outcome is unknown.
    pub fn abandon(self) -> Vec<Out> {
        let mut outs: Vec<Out> = self.in_flight.map(|(_, o)| o).unwrap_or_default();
        outs.extend(self.queued.into_iter().flat_map(|j| j.replies));
        outs.extend(
            self.pipeline
                .into_waiting()
                .map(|(a, op)| (a, op, Answer::NotAcquired)),
        );
        for o in &mut outs {
            o.2 = Answer::Indeterminate;
        }
        outs
    }

    /// The server's `Engine::step`: the pipeline's step, its woken waiters
    /// answered with the step's own answers, handed to the committer.
    fn settle(&mut self, now: MonoMs, mut step: Step, mut deferred: Vec<Out>) -> Step {
        let stepped = self.pipeline.step(&mut self.table, now);
        for ((from, op), result) in stepped.woken {
            let a = match result {
                WaitResult::Granted(g) => granted(&g),
                WaitResult::TimedOut(_) | WaitResult::SessionEnded | WaitResult::OverQuota(_) => {
                    Answer::NotAcquired
                }
            };
            deferred.push((from, op, a));
        }
        step.events = stepped.events;
        if !deferred.is_empty() || !stepped.writes.is_empty() {
            self.queued.push(Job {
                writes: stepped.writes,
                sync: stepped.sync,
                replies: deferred,
            });
        }
        self.take_batch(&mut step);
        step
    }

    /// The server's committer loop, one turn: when no commit is in flight
    /// it takes every queued job as one batch.
    fn take_batch(&mut self, step: &mut Step) {
        if self.in_flight.is_some() || self.queued.is_empty() {
            return;
        }
        let batch = pipeline::batch(self.queued.drain(..));
        step.now.extend(batch.before.into_iter().flatten());
        let after: Vec<Out> = batch.after.into_iter().flatten().collect();
        if batch.commit.is_empty() {
            step.now.extend(after);
            return;
        }
        self.next_seq += 1;
        self.in_flight = Some((self.next_seq, after));
        step.commit = Some((self.next_seq, batch.commit));
    }
}

/// When a request's answer may go.
enum When {
    /// Now, before the step's commit (the server answers it at once).
    At(Answer),
    /// With the step's commit.
    Deferred(Answer),
    /// When its wait ends.
    Queued,
}
use When::{At, Deferred, Queued};

impl Engine {
    /// An acquire: answered when its step is durable, or queued.
    fn acquire(&mut self, now: MonoMs, caller: (Addr, u64), req: AcquireRequest) -> When {
        let waiter = req.waiter;
        match self.table.acquire(now, req) {
            Ok(AcquireOutcome::Granted(g)) => Deferred(granted(&g)),
            Ok(AcquireOutcome::NotAcquired(_)) => Deferred(Answer::NotAcquired),
            Ok(AcquireOutcome::Queued { .. }) => {
                self.pipeline.wait(waiter, caller);
                Queued
            }
            Ok(other) => unreachable!("no request ids are sent: {other:?}"),
            Err(AcquireError::SessionNotOpen) => Deferred(Answer::NotOpen),
            Err(e) => panic!("the simulator asked for something invalid: {e}"),
        }
    }
}

/// The simulation's number for resource `name`.
fn index_of(names: &[ResourceName], name: &ResourceName) -> u8 {
    let i = names.iter().position(|n| n == name);
    u8::try_from(i.expect("a simulated resource")).expect("few resources")
}

fn granted(grants: &[baton_core::Grant]) -> Answer {
    let g = &grants[0];
    Answer::Granted {
        token: g.token,
        ttl_ms: g.ttl_ms,
        slot: g.slot,
    }
}
