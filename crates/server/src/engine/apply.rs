//! One command applied to the table, its reply deferred until the step's
//! writes are durable where it carries a token.

use std::time::Instant;

use baton_core::{AcquireOutcome, AcquireRequest, MonoMs, Resumed, SessionCheck, SessionDigest};
use baton_store::Stored;
use tracing::info;

use super::{AcquireAnswer, AcquireReply, Command, Deferred, Engine, Reply};

impl Engine {
    pub(super) fn apply(&mut self, now: MonoMs, command: Command, replies: &mut Vec<Deferred>) {
        match command {
            Command::Acquire { request, reply } => self.acquire(now, request, reply, replies),
            // Renewals and releases are answered at once, not behind the
            // commits in flight: only the holder of a lease can ask, and it
            // holds a grant that was committed before it heard of it, so
            // the answer reveals nothing that is not durable. (A release's
            // own write is lazy, as it always was.)
            Command::Renew {
                resource,
                id,
                reply,
            } => {
                let _ = reply.send(self.table.renew(now, &resource, &id));
            }
            Command::Release {
                resource,
                id,
                reply,
            } => {
                let _ = reply.send(self.table.release(now, &resource, &id));
            }
            Command::Status { resource, reply } => {
                let out = self.table.status(now, &resource);
                defer(replies, reply, out);
            }
            Command::List {
                prefix,
                start_after,
                limit,
                reply,
            } => {
                let out = self.table.list(now, &prefix, start_after.as_deref(), limit);
                defer(replies, reply, out);
            }
            Command::Fence { resource, reply } => {
                let out = self.table.fence(now, &resource);
                defer(replies, reply, out);
            }
            Command::SetPermits {
                resource,
                n_permits,
                reply,
            } => {
                let out = self.table.set_permits(now, &resource, n_permits);
                defer(replies, reply, out);
            }
            Command::Watch {
                prefix,
                after,
                reply,
            } => self.watch(now, (prefix, after), reply, replies),
            Command::Snapshot { reply } => {
                // Flush the lazy writes in this step: the view then holds
                // every change so far.
                self.pipeline.flush_next_step(now);
                self.snapshots.push(reply);
            }
            Command::CopyTable { reply } => defer(replies, reply, self.copy_table()),
            Command::OpenSession {
                digest,
                ttl_ms,
                opener,
                reply,
            } => {
                let out = self.table.open_session(now, digest, ttl_ms, opener);
                defer(replies, reply, out);
            }
            // Like renewals and releases: only the session's holder can ask,
            // and the session was durable before its holder heard of it.
            Command::KeepAlive {
                digest,
                check,
                reply,
            } => {
                let _ = reply.send(self.keep_alive(now, digest, check));
            }
            Command::CloseSession {
                digest,
                check,
                reply,
            } => {
                let _ = reply.send(self.table.close_session_as(now, digest, &check));
            }
            Command::Shutdown => {}
            Command::CancelWait { waiter } => {
                if self.pipeline.cancel(waiter).is_some() {
                    self.table.cancel_wait(now, waiter);
                }
            }
        }
    }

    /// Grants now, refuses now, or queues the caller until its turn or
    /// its wait's end.
    fn acquire(
        &mut self,
        now: MonoMs,
        request: AcquireRequest,
        reply: Reply<AcquireAnswer>,
        replies: &mut Vec<Deferred>,
    ) {
        let waiter = request.waiter;
        let answer = match self.table.acquire(now, request) {
            Ok(AcquireOutcome::Granted(grants)) => Ok(AcquireReply::Granted {
                grants,
                after_wait: false,
            }),
            Ok(AcquireOutcome::NotAcquired(n)) => {
                self.metrics.not_acquired.inc();
                Ok(AcquireReply::NotAcquired(n))
            }
            Ok(AcquireOutcome::Repeated(grants)) => Ok(AcquireReply::Repeated(grants)),
            Ok(AcquireOutcome::Ended) => {
                self.metrics.not_acquired.inc();
                Ok(AcquireReply::Ended)
            }
            Ok(AcquireOutcome::Queued { .. }) => {
                self.pipeline.wait(waiter, reply);
                return;
            }
            Err(e) => Err(e),
        };
        defer(replies, reply, answer);
    }

    /// A heartbeat (no check) or a resume (checked: see `SessionCheck`).
    fn keep_alive(
        &mut self,
        now: MonoMs,
        digest: SessionDigest,
        check: Option<SessionCheck>,
    ) -> Resumed {
        match check {
            Some(check) => self.table.resume(now, digest, &check),
            None => (self.table.keep_alive(now, digest)).map_or(Resumed::NotOpen, Resumed::Kept),
        }
    }

    /// A copy of the table for a backup (a store without snapshots).
    fn copy_table(&self) -> Stored {
        let started = Instant::now();
        let (epoch, counter) = self.table.last_token();
        let leases: Vec<_> = self.table.leases().map(|(r, l)| (r.clone(), l)).collect();
        let sessions = self.table.sessions().collect();
        info!(
            n_leases = leases.len(),
            copy_ms = started.elapsed().as_millis() as u64,
            "snapshot copied for a backup"
        );
        Stored {
            epoch,
            counter,
            leases,
            sessions,
        }
    }
}

/// Sends `value` once the step's writes are durable (see `committer.rs`).
fn defer<T: Send + 'static>(replies: &mut Vec<Deferred>, reply: Reply<T>, value: T) {
    replies.push(Box::new(move || {
        let _ = reply.send(value);
    }));
}
