//! The engine shell around the real lease table, modelled on the
//! server's engine and committer (`crates/server/src/engine`): every step
//! runs the table at the node's clock; the step's writes join the
//! pending commit; answers that carry a token wait for the commit that
//! holds their step's writes (and every earlier one); renewals and
//! releases are answered at once, as the server answers them. One commit
//! is in flight at a time, and the steps during it are committed
//! together next (group commit).

use std::collections::BTreeMap;

use baton_core::bad::{self, Variant};
use baton_core::{
    AcquireOutcome, AcquireRequest, Event, LeaseTable, MonoMs, ReleaseOutcome, RenewOutcome,
    ResourceName, WaitResult, WaiterId, Write,
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

/// The table and its commit pipeline.
pub struct Engine {
    pub table: LeaseTable,
    pending: Vec<Write>,
    /// Answers of the steps since the commit in flight started.
    open: Vec<Out>,
    in_flight: Option<(u64, Vec<Out>)>,
    next_seq: u64,
    waiting: BTreeMap<WaiterId, (Addr, u64)>,
    next_waiter: u64,
}

impl Engine {
    pub fn new(table: LeaseTable) -> Self {
        Self {
            table,
            pending: Vec::new(),
            open: Vec::new(),
            in_flight: None,
            next_seq: 0,
            waiting: BTreeMap::new(),
            next_waiter: 0,
        }
    }

    /// One request, at the node's clock reading `now`.
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
        match request {
            Request::Acquire {
                resource,
                id,
                ttl_ms,
                wait_ms,
            } => {
                self.next_waiter += 1;
                let waiter = WaiterId(self.next_waiter);
                let mut req = AcquireRequest::single(name(resource), id, ttl_ms);
                req.wait_ms = wait_ms;
                req.waiter = waiter;
                let answer = match self.table.acquire(now, req) {
                    Ok(AcquireOutcome::Granted(g)) => Some(granted(&g)),
                    Ok(AcquireOutcome::NotAcquired(_)) => Some(Answer::NotAcquired),
                    Ok(AcquireOutcome::Queued { .. }) => {
                        self.waiting.insert(waiter, (from, op));
                        None
                    }
                    Err(e) => panic!("the simulator asked for something invalid: {e}"),
                };
                if let Some(a) = answer {
                    self.open.push((from, op, a));
                }
            }
            Request::Renew { resource, id } => {
                let a = match self.table.renew(now, &name(resource), &id) {
                    RenewOutcome::Renewed { ttl_ms, .. } => Answer::Renewed {
                        remaining_ms: ttl_ms,
                    },
                    RenewOutcome::NotOwner => Answer::NotOwner,
                };
                step.now.push((from, op, a));
            }
            Request::Release { resource, id } => {
                let a = match self.table.release(now, &name(resource), &id) {
                    ReleaseOutcome::Released { .. } => Answer::Released,
                    ReleaseOutcome::NotHeld => Answer::NotOwner,
                };
                step.now.push((from, op, a));
            }
            Request::Fence { resource } => {
                let out = self.table.fence(now, &name(resource));
                let a = Answer::Fenced {
                    token: out.token,
                    revoked: out.revoked,
                };
                self.open.push((from, op, a));
            }
        }
        self.settle(step)
    }

    /// Runs the table's due timers.
    pub fn tick(&mut self, now: MonoMs) -> Step {
        self.table.tick(now);
        self.settle(Step::default())
    }

    /// The commit `seq` is durable: its answers may go, and the next
    /// commit starts.
    pub fn committed(&mut self, seq: u64) -> Step {
        let mut step = Step::default();
        match self.in_flight.take() {
            Some((s, outs)) if s == seq => step.now.extend(outs),
            // Not the commit in flight (an answer to an older one).
            other => self.in_flight = other,
        }
        self.settle(step)
    }

    /// Everything still owed an answer: the engine stopped, so their
    /// outcome is unknown.
    pub fn abandon(self) -> Vec<Out> {
        let mut outs: Vec<Out> = self.in_flight.map(|(_, o)| o).unwrap_or_default();
        outs.extend(self.open);
        outs.extend(
            self.waiting
                .into_values()
                .map(|(a, op)| (a, op, Answer::NotAcquired)),
        );
        for o in &mut outs {
            o.2 = Answer::Indeterminate;
        }
        outs
    }

    fn settle(&mut self, mut step: Step) -> Step {
        let effects = self.table.take_effects();
        self.pending.extend(effects.writes);
        for (waiter, result) in effects.woken {
            let Some((from, op)) = self.waiting.remove(&waiter) else {
                continue;
            };
            let a = match result {
                WaitResult::Granted(g) => granted(&g),
                WaitResult::TimedOut | WaitResult::SessionEnded => Answer::NotAcquired,
            };
            self.open.push((from, op, a));
        }
        step.events = effects.events;
        if self.in_flight.is_some() {
            return step;
        }
        if self.pending.is_empty() {
            step.now.append(&mut self.open);
            return step;
        }
        self.next_seq += 1;
        let writes = std::mem::take(&mut self.pending);
        let outs = std::mem::take(&mut self.open);
        if bad::on(Variant::AnswerBeforeDurable) {
            // The committer's one line: answers before the commit returns.
            step.now.extend(outs);
            self.in_flight = Some((self.next_seq, Vec::new()));
        } else {
            self.in_flight = Some((self.next_seq, outs));
        }
        step.commit = Some((self.next_seq, writes));
        step
    }
}

fn granted(grants: &[baton_core::Grant]) -> Answer {
    let g = &grants[0];
    Answer::Granted {
        token: g.token,
        ttl_ms: g.ttl_ms,
    }
}
