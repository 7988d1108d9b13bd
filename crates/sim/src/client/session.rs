//! A worker's session, as the session driver keeps one: opened, beaten
//! every third of its TTL, given up at its safe deadline or when the
//! server says it is not open, and closed after a few leases.

use baton_client::deadline::Deadline;

use super::{ms, Call, Client, Session, State, RPC_TIMEOUT_MS};
use crate::world::{Answer, Request};
use crate::{Ctx, SimMs};
use baton_core::SessionDigest;

impl Client {
    /// The session driver's loop: give the session up at its safe
    /// deadline, beat every third of its TTL.
    pub(super) fn keep_session(&mut self, ctx: &mut Ctx, now: u64) {
        let Some(session) = &mut self.session else {
            return;
        };
        let safe_until = session.deadline.safe_until().0;
        if now >= safe_until {
            let id = self.id;
            ctx.trace.record(ctx.now, &(id, 3u8), || {
                format!("c{id} lost its session at its deadline")
            });
            self.lose_session(now);
            return;
        }
        if now >= session.next_beat_ms && !session.beating {
            session.beating = true;
            let digest = session.digest;
            self.call(
                ctx,
                Request::KeepAlive { digest },
                (safe_until - now).min(RPC_TIMEOUT_MS),
            );
        }
    }

    /// The session ended (or may have): every lease of it is gone.
    pub(super) fn lose_session(&mut self, now: u64) {
        self.session = None;
        if matches!(&self.state, State::Holding(h) if h.deadline.is_none()) {
            self.idle(now, 200);
        }
    }

    pub(super) fn open_session(&mut self, ctx: &mut Ctx) {
        let ttl_ms = self.rng.between(2_000, 6_000);
        let digest = SessionDigest::from_bytes(self.fresh_id());
        let op = self.call(ctx, Request::OpenSession { digest, ttl_ms }, RPC_TIMEOUT_MS);
        self.opening = Some(op);
    }

    /// A lease of the session is done with: after a few, the session is
    /// closed (and a new one opened for the next).
    pub(super) fn lease_done(&mut self, ctx: &mut Ctx) {
        let Some(session) = &mut self.session else {
            return;
        };
        session.leases_left = session.leases_left.saturating_sub(1);
        if session.leases_left == 0 {
            let digest = session.digest;
            self.session = None;
            self.call(ctx, Request::CloseSession { digest }, RPC_TIMEOUT_MS);
        }
    }

    /// An answer about the session: open, kept, or gone.
    pub(super) fn on_session_reply(
        &mut self,
        ctx: &mut Ctx,
        op: u64,
        call: &Call,
        answer: &Answer,
    ) {
        let now = self.clock.local(ctx.now);
        match (&call.request, answer) {
            (Request::OpenSession { digest, ttl_ms }, Answer::Opened)
                if self.opening == Some(op) =>
            {
                self.opening = None;
                ctx.check.sessions_opened += 1;
                self.session = Some(Session {
                    digest: *digest,
                    ttl_ms: *ttl_ms,
                    deadline: Deadline::opened(SimMs(call.sent_ms), ms(*ttl_ms)),
                    next_beat_ms: call.sent_ms + ttl_ms / 3,
                    beating: false,
                    leases_left: self.rng.between(1, 5) as u32,
                });
            }
            (Request::OpenSession { .. }, _) if self.opening == Some(op) => {
                self.opening = None;
                self.idle(now, 300);
            }
            (Request::KeepAlive { digest }, answer) => {
                let Some(session) = self.session.as_mut().filter(|s| s.digest == *digest) else {
                    return;
                };
                session.beating = false;
                match answer {
                    Answer::Kept { ttl_ms, revoked } => {
                        ctx.check.heartbeats += 1;
                        session
                            .deadline
                            .acknowledged(SimMs(call.sent_ms), SimMs(now), ms(*ttl_ms));
                        session.next_beat_ms = call.sent_ms + session.ttl_ms / 3;
                        // The heartbeat keeps the session's lease, unless
                        // it reports it revoked.
                        match &self.state {
                            State::Holding(h) if h.deadline.is_none() => {
                                if revoked.contains(&(h.resource, h.token)) {
                                    self.idle(now, 200);
                                } else {
                                    ctx.check.extended(h.grant, call.sent_true);
                                }
                            }
                            _ => {}
                        }
                    }
                    Answer::NotOpen => self.lose_session(now),
                    _ => session.next_beat_ms = now + 20,
                }
            }
            (Request::Acquire { .. }, Answer::NotOpen) => self.lose_session(now),
            _ => {}
        }
    }
}
