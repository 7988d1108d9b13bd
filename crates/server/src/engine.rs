//! The engine: the lease table behind a lock, applied to by the callers
//! themselves, a timer thread for deadlines, and a committer thread that
//! owns the store.
//!
//! A caller (a gRPC task) takes the lock, applies its command to the table
//! and hands the step's writes and replies, in order, to the committer,
//! without a thread hand-off: renewals, releases and heartbeats are
//! answered before the lock is let go. The timer thread wakes at the
//! table's next deadline (expiries, wait timeouts, the lazy flush) and
//! steps the table the same way. The committer takes every step queued
//! while its last commit was in flight, commits their writes together
//! (group commit) when any of them issued a token, and only then releases
//! their replies, in order. So a commit's latency never holds the table,
//! and no reply goes out before every write of its step and of all earlier
//! steps is durable (or, for steps that issued no token, before every
//! earlier step that did is). Releases and expiries are written lazily:
//! losing them in a crash only keeps a lease held for one more TTL.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use baton_core::{
    AcquireError, AcquireOutcome, AcquireRequest, AcquisitionId, Event, FenceOutcome, Grant,
    LeaseStatus, LeaseTable, MonoMs, NotAcquired, ReleaseOutcome, RenewOutcome, ResourceName,
    Resumed, SessionDigest, SessionError, WaitResult, WaiterId, Write,
};
use baton_store::{LeaseStore, StoreError, Stored};
use tokio::sync::oneshot;
use tracing::{debug, error, info};

use crate::metrics::Metrics;
use crate::watch::{holder_changes, Hub, WatchStart};

/// Lazy writes are flushed at least this often, or when this many are pending.
const LAZY_FLUSH_INTERVAL_MS: u64 = 100;
const LAZY_WRITES_MAX: usize = 8_192;

#[derive(Debug)]
pub enum AcquireReply {
    Granted {
        grants: Vec<Grant>,
        after_wait: bool,
    },
    NotAcquired(NotAcquired),
    TimedOut,
    /// The request's session ended while it waited.
    SessionEnded,
}

pub type Reply<T> = oneshot::Sender<T>;

/// Who may keep a session alive or close it: the principal that opened
/// it (or an administrator), holding `lease` on what it holds.
pub use baton_core::SessionCheck;

pub enum Command {
    Acquire {
        request: AcquireRequest,
        reply: Reply<Result<AcquireReply, AcquireError>>,
    },
    Renew {
        resource: ResourceName,
        id: AcquisitionId,
        reply: Reply<RenewOutcome>,
    },
    Release {
        resource: ResourceName,
        id: AcquisitionId,
        reply: Reply<ReleaseOutcome>,
    },
    Status {
        resource: ResourceName,
        reply: Reply<LeaseStatus>,
    },
    List {
        prefix: String,
        start_after: Option<String>,
        limit: usize,
        reply: Reply<Vec<LeaseStatus>>,
    },
    Fence {
        resource: ResourceName,
        reply: Reply<FenceOutcome>,
    },
    Snapshot {
        reply: Reply<Stored>,
    },
    /// A watcher of `prefix`: the holders now, then every later change
    /// (see `watch.rs`).
    Watch {
        prefix: String,
        reply: Reply<WatchStart>,
    },
    CancelWait {
        waiter: WaiterId,
    },
    /// Answered after the session is durable.
    OpenSession {
        digest: SessionDigest,
        ttl_ms: u64,
        /// The principal that opens it (`None` with authentication off).
        opener: Option<String>,
        reply: Reply<Result<(), SessionError>>,
    },
    /// A heartbeat: the session's TTL and revoked leases. With `check` (a
    /// resume, or a heartbeat under a reloaded auth table), only if it
    /// accepts every resource of the session, decided in the same step;
    /// never `Refused` without one.
    KeepAlive {
        digest: SessionDigest,
        check: Option<SessionCheck>,
        reply: Reply<Resumed>,
    },
    /// Whether the session was open (it is closed now either way), or
    /// `None` if `may_hold` refuses a resource of the session (nothing
    /// changed).
    CloseSession {
        digest: SessionDigest,
        check: SessionCheck,
        reply: Reply<Option<bool>>,
    },
    /// Flush and stop, even if handles remain (connections that outlived the grace period).
    Shutdown,
}

/// A cheap handle for giving commands to the engine. When the last one is
/// dropped the engine flushes and stops (the committer's own reference
/// does not keep it alive).
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    _last: Arc<StopOnDrop>,
}

struct StopOnDrop(mpsc::Sender<Wake>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Wake::Stop);
    }
}

impl EngineHandle {
    /// Applies a command (its reply comes on its channel); `false` if the
    /// engine has stopped.
    pub fn send(&self, command: Command) -> bool {
        self.shared.submit(command)
    }
}

/// What the timer thread is woken for.
enum Wake {
    /// A deadline earlier than the one it sleeps towards was set.
    Rearm,
    /// Flush and stop: the last handle went, a shutdown was asked for, or
    /// a commit failed.
    Stop,
}

/// The table and the timer thread's channel, shared by every handle.
struct Shared {
    engine: Mutex<Engine>,
    timer: mpsc::Sender<Wake>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        match self.engine.lock() {
            Ok(engine) => engine,
            // A step panicked while it held the table (a violated
            // invariant; no input does this): take no more commands, and
            // let the timer thread stop the engine as a panic, as the
            // engine thread's own panic did.
            Err(poisoned) => {
                let mut engine = poisoned.into_inner();
                self.stop(&mut engine);
                engine
            }
        }
    }

    /// Takes no more commands and has the timer thread stop the engine.
    fn stop(&self, engine: &mut Engine) {
        if !engine.stopped {
            engine.stopped = true;
            let _ = self.timer.send(Wake::Stop);
        }
    }

    fn submit(&self, command: Command) -> bool {
        if let Command::Shutdown = command {
            return self.timer.send(Wake::Stop).is_ok();
        }
        let mut engine = self.lock();
        if engine.stopped {
            return false;
        }
        let now = engine.now();
        let mut replies = Vec::new();
        engine.apply(now, command, &mut replies);
        self.finish_step(&mut engine, now, replies);
        true
    }

    /// Hands the step to the committer and wakes the timer thread if the
    /// table's next deadline moved earlier than the one it sleeps towards.
    fn finish_step(&self, engine: &mut Engine, now: MonoMs, replies: Vec<Deferred>) {
        if !engine.step(now, replies) {
            // The committer stopped (a commit failed): its replies are
            // dropped, so their callers hear that the outcome is unknown.
            self.stop(engine);
            return;
        }
        if let Some(at) = engine.next_wake() {
            if at < engine.armed {
                engine.armed = at;
                let _ = self.timer.send(Wake::Rearm);
            }
        }
    }
}

type Deferred = Box<dyn FnOnce() + Send>;

/// One batch's share of durable work, handed to the committer in order.
struct Job {
    writes: Vec<Write>,
    /// A token was issued: commit before any reply of this job goes out.
    sync: bool,
    replies: Vec<Deferred>,
    /// Waiters granted or timed out; a grant whose caller left is handed back.
    woken: Vec<(Reply<Result<AcquireReply, AcquireError>>, AcquireReply)>,
}

enum ToCommitter {
    Job(Job),
    /// Commit whatever is pending, then stop.
    Flush,
}

/// The table and what goes with it; always behind [`Shared`]'s lock.
pub struct Engine {
    table: LeaseTable,
    origin: Instant,
    /// Lazy writes not yet handed over.
    lazy: Vec<Write>,
    flush_at: MonoMs,
    waiting: HashMap<WaiterId, Reply<Result<AcquireReply, AcquireError>>>,
    metrics: Arc<Metrics>,
    committer: mpsc::Sender<ToCommitter>,
    /// The deadline the timer thread sleeps towards.
    armed: MonoMs,
    /// No more commands are taken.
    stopped: bool,
    /// Watchers of holder changes.
    hub: Arc<Hub>,
}

impl Engine {
    /// Loads the table from `store` (every stored lease held for a full TTL
    /// from now) and starts the timer and committer threads. The returned
    /// thread (the timer's) ends when the engine stops, with the
    /// committer's outcome.
    pub fn start(
        store: Box<dyn LeaseStore>,
        limits: baton_core::Limits,
        metrics: Arc<Metrics>,
    ) -> Result<
        (
            EngineHandle,
            std::thread::JoinHandle<Result<(), StoreError>>,
        ),
        StoreError,
    > {
        let stored = store.load()?;
        let origin = Instant::now();
        let (n_leases, n_sessions) = (stored.leases.len(), stored.sessions.len());
        let table = LeaseTable::recover(
            limits,
            MonoMs(0),
            stored.epoch,
            stored.counter,
            stored.leases,
            stored.sessions,
        );
        info!(
            epoch = stored.epoch.get(),
            counter = stored.counter,
            n_leases,
            n_sessions,
            "recovered lease state; stored leases and sessions are held for a full TTL from now"
        );
        metrics.leases.set(n_leases as i64);
        let (timer, timer_rx) = mpsc::channel();
        let (to_committer, committer_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine {
                table,
                origin,
                lazy: Vec::new(),
                flush_at: MonoMs(LAZY_FLUSH_INTERVAL_MS),
                waiting: HashMap::new(),
                metrics: metrics.clone(),
                committer: to_committer,
                armed: MonoMs(u64::MAX),
                stopped: false,
                hub: Arc::default(),
            }),
            timer: timer.clone(),
        });
        let committer = Committer {
            store,
            rx: committer_rx,
            engine: Arc::downgrade(&shared),
            timer: timer.clone(),
            metrics,
        };
        let committer_thread = std::thread::Builder::new()
            .name("baton-commit".into())
            .spawn(move || committer.run())
            .expect("spawn committer thread");
        let timer_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("baton-engine".into())
            .spawn(move || run_timer(&timer_shared, &timer_rx, committer_thread))
            .expect("spawn engine thread");
        let stop = Arc::new(StopOnDrop(timer));
        Ok((
            EngineHandle {
                shared,
                _last: stop,
            },
            thread,
        ))
    }

    fn now(&self) -> MonoMs {
        MonoMs(self.origin.elapsed().as_millis() as u64)
    }

    /// When the table next needs a step without a command: its next
    /// deadline, or the lazy flush.
    fn next_wake(&self) -> Option<MonoMs> {
        [
            self.table.next_deadline(),
            (!self.lazy.is_empty()).then_some(self.flush_at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Ticks the table to `now` and hands the step's writes and replies to
    /// the committer. `false` if the committer has stopped (a commit failed).
    fn step(&mut self, now: MonoMs, mut replies: Vec<Deferred>) -> bool {
        self.table.tick(now);
        let fx = self.table.take_effects();
        let changes = holder_changes(&fx.events);
        if !changes.is_empty() {
            // Recorded and published by the committer after this step's
            // commit: neither the page nor a watcher sees a grant that is
            // not durable.
            let hub = self.hub.clone();
            let metrics = self.metrics.clone();
            replies.push(Box::new(move || {
                metrics.history.record(&changes, Instant::now());
                if hub.is_watched() {
                    hub.publish(changes);
                }
            }));
        }
        self.lazy.extend(fx.writes);
        let flush = !self.lazy.is_empty()
            && (fx.sync || now >= self.flush_at || self.lazy.len() >= LAZY_WRITES_MAX);
        let writes = if flush {
            self.flush_at = MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS);
            std::mem::take(&mut self.lazy)
        } else {
            Vec::new()
        };
        self.record(&fx.events);
        let mut woken = Vec::with_capacity(fx.woken.len());
        for (waiter, result) in fx.woken {
            let Some(reply) = self.waiting.remove(&waiter) else {
                continue;
            };
            let answer = match result {
                WaitResult::Granted(grants) => {
                    self.metrics.grants_after_wait.inc();
                    AcquireReply::Granted {
                        grants,
                        after_wait: true,
                    }
                }
                WaitResult::TimedOut => AcquireReply::TimedOut,
                WaitResult::SessionEnded => AcquireReply::SessionEnded,
            };
            woken.push((reply, answer));
        }
        self.metrics.leases.set(self.table.n_leases() as i64);
        self.metrics.waiters.set(self.table.n_waiters() as i64);
        self.metrics.sessions.set(self.table.n_sessions() as i64);
        if replies.is_empty() && woken.is_empty() && writes.is_empty() {
            return true;
        }
        let job = Job {
            writes,
            sync: fx.sync,
            replies,
            woken,
        };
        self.committer.send(ToCommitter::Job(job)).is_ok()
    }

    /// A watcher's snapshot now, and its registration in step order.
    fn watch(
        &mut self,
        now: MonoMs,
        prefix: String,
        reply: Reply<WatchStart>,
        replies: &mut Vec<Deferred>,
    ) {
        // Earlier events go to earlier watchers in a step of their own, so
        // that this snapshot and the events registered after it neither
        // overlap nor leave a gap.
        self.step(now, std::mem::take(replies));
        let holders: Vec<LeaseStatus> = self
            .table
            .list(now, &prefix, None, usize::MAX)
            .into_iter()
            .filter(|s| s.holder_token.is_some())
            .collect();
        self.hub.expect();
        let hub = self.hub.clone();
        replies.push(Box::new(move || {
            let _ = reply.send(hub.register(prefix, holders));
        }));
    }

    fn apply(&mut self, now: MonoMs, command: Command, replies: &mut Vec<Deferred>) {
        fn defer<T: Send + 'static>(replies: &mut Vec<Deferred>, reply: Reply<T>, value: T) {
            replies.push(Box::new(move || {
                let _ = reply.send(value);
            }));
        }
        match command {
            Command::Acquire { request, reply } => {
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
                    Ok(AcquireOutcome::Queued { .. }) => {
                        self.waiting.insert(waiter, reply);
                        return;
                    }
                    Err(e) => Err(e),
                };
                defer(replies, reply, answer);
            }
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
            Command::Watch { prefix, reply } => self.watch(now, prefix, reply, replies),
            Command::Snapshot { reply } => {
                let started = Instant::now();
                let (epoch, counter) = self.table.last_token();
                let leases: Vec<_> = self.table.leases().map(|(r, l)| (r.clone(), l)).collect();
                let sessions = self.table.sessions().collect();
                info!(
                    n_leases = leases.len(),
                    copy_ms = started.elapsed().as_millis() as u64,
                    "snapshot copied for a backup"
                );
                defer(
                    replies,
                    reply,
                    Stored {
                        epoch,
                        counter,
                        leases,
                        sessions,
                    },
                );
            }
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
                let out = match check {
                    Some(check) => self.table.resume(now, digest, &check),
                    None => {
                        (self.table.keep_alive(now, digest)).map_or(Resumed::NotOpen, Resumed::Kept)
                    }
                };
                let _ = reply.send(out);
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
                if self.waiting.remove(&waiter).is_some() {
                    self.table.cancel_wait(now, waiter);
                }
            }
        }
    }

    fn record(&self, events: &[Event]) {
        let m = &self.metrics;
        for event in events {
            match event {
                Event::Granted {
                    resource,
                    token,
                    acquisition_id,
                    after_wait,
                    holder,
                } => {
                    m.grants.inc();
                    if *after_wait {
                        m.ownership_transfers.inc();
                    }
                    debug!(%resource, %token, acquisition = %acquisition_id.prefix(), after_wait, holder = holder.as_ref().map(|h| h.as_str()), "granted");
                }
                Event::Renewed { .. } => {
                    m.renewals.inc();
                }
                Event::RenewRefused { resource } => {
                    m.renewals_failed.inc();
                    debug!(%resource, "renewal refused: not owner");
                }
                Event::Released {
                    resource,
                    token,
                    holder,
                } => {
                    m.releases.inc();
                    debug!(%resource, %token, holder = holder.as_ref().map(|h| h.as_str()), "released");
                }
                Event::Expired {
                    resource,
                    token,
                    holder,
                } => {
                    m.expiries.inc();
                    debug!(%resource, %token, holder = holder.as_ref().map(|h| h.as_str()), "lease expired");
                }
                Event::Fenced {
                    resource,
                    token,
                    revoked,
                    holder,
                } => {
                    m.fences.inc();
                    match revoked {
                        Some(revoked) => {
                            info!(%resource, %token, %revoked, holder = holder.as_ref().map(|h| h.as_str()), "fenced; lease revoked")
                        }
                        None => info!(%resource, %token, "fenced; no lease was held"),
                    }
                }
                Event::WaitTimedOut { .. } => {
                    m.wait_timeouts.inc();
                }
                Event::SessionOpened { .. } => {}
                Event::SessionEnded {
                    expired, n_leases, ..
                } => {
                    if *expired {
                        m.session_expiries.inc();
                        info!(
                            n_leases,
                            "session expired without a heartbeat; its leases expired with it"
                        );
                    } else {
                        debug!(n_leases, "session closed; its leases released");
                    }
                }
            }
        }
    }
}

/// The timer thread: steps the table at its deadlines; on [`Wake::Stop`]
/// flushes the lazy writes, stops the committer and returns its outcome.
fn run_timer(
    shared: &Shared,
    wakes: &mpsc::Receiver<Wake>,
    committer: std::thread::JoinHandle<Result<(), StoreError>>,
) -> Result<(), StoreError> {
    loop {
        let timeout = {
            let mut engine = shared.lock();
            let now = engine.now();
            let at = engine.next_wake().unwrap_or(MonoMs(now.0 + 3_600_000));
            // A caller that sets an earlier deadline from here on sends
            // `Rearm`, which ends the wait below at once.
            engine.armed = at;
            Duration::from_millis(at.0.saturating_sub(now.0))
        };
        match wakes.recv_timeout(timeout) {
            Ok(Wake::Rearm) | Err(RecvTimeoutError::Timeout) => {}
            Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => break,
        }
        let mut engine = shared.lock();
        if engine.stopped {
            break;
        }
        let now = engine.now();
        shared.finish_step(&mut engine, now, Vec::new());
    }
    // Shutting down (or a commit failed): take no more commands, flush the
    // lazy writes, then stop.
    {
        let mut engine = shared.lock();
        engine.stopped = true;
        let lazy = std::mem::take(&mut engine.lazy);
        let _ = engine.committer.send(ToCommitter::Job(Job {
            writes: lazy,
            sync: false,
            replies: Vec::new(),
            woken: Vec::new(),
        }));
        let _ = engine.committer.send(ToCommitter::Flush);
    }
    let outcome = match committer.join() {
        Ok(result) => result,
        Err(_) => Err(StoreError::Storage("the committer thread panicked".into())),
    };
    // Every watch ends with the engine.
    shared.lock().hub.close();
    assert!(
        !shared.engine.is_poisoned(),
        "a step panicked while it held the lease table; the engine stopped"
    );
    if outcome.is_ok() {
        info!("engine stopped; lazy writes flushed");
    }
    outcome
}

/// The thread that owns the store: commits queued batches together and
/// releases their replies in order.
struct Committer {
    store: Box<dyn LeaseStore>,
    rx: mpsc::Receiver<ToCommitter>,
    /// For handing back grants whose waiter left before its answer (weak:
    /// it must not keep the engine alive).
    engine: Weak<Shared>,
    /// To stop the engine when a commit fails.
    timer: mpsc::Sender<Wake>,
    metrics: Arc<Metrics>,
}

impl Committer {
    fn run(mut self) -> Result<(), StoreError> {
        let mut pending: Vec<Write> = Vec::new();
        loop {
            let Ok(first) = self.rx.recv() else {
                break;
            };
            let mut jobs = Vec::new();
            let mut stop = false;
            for message in std::iter::once(first).chain(self.rx.try_iter()) {
                match message {
                    ToCommitter::Job(job) => jobs.push(job),
                    ToCommitter::Flush => stop = true,
                }
            }
            let sync = stop || jobs.iter().any(|j| j.sync || !j.writes.is_empty());
            for job in &mut jobs {
                pending.append(&mut job.writes);
            }
            if sync && !pending.is_empty() {
                let started = Instant::now();
                if let Err(e) = self.store.commit(&pending) {
                    // Dropping the replies tells every caller the outcome is unknown.
                    self.metrics.store_errors.inc();
                    error!(error = %e, "lease store commit failed; stopping");
                    // Stop the engine too.
                    let _ = self.timer.send(Wake::Stop);
                    return Err(e);
                }
                self.metrics
                    .observe_commit_latency_us(started.elapsed().as_micros() as u64);
                self.metrics.commits.inc();
                pending.clear();
            }
            // Invariant: a job that issued a token is answered only after a
            // commit that holds its writes and every earlier job's.
            assert!(
                pending.is_empty() || !jobs.iter().any(|j| j.sync),
                "a batch that issued a token must commit before replying"
            );
            for job in jobs {
                for reply in job.replies {
                    reply();
                }
                for (reply, answer) in job.woken {
                    if let Err(Ok(AcquireReply::Granted { grants, .. })) = reply.send(Ok(answer)) {
                        // The caller left just as its turn came: give the leases back.
                        let Some(engine) = self.engine.upgrade() else {
                            continue;
                        };
                        for g in grants {
                            let (tx, _) = oneshot::channel();
                            engine.submit(Command::Release {
                                resource: g.resource,
                                id: g.acquisition_id,
                                reply: tx,
                            });
                        }
                    }
                }
            }
            if stop {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_testkit::store::MemStore;

    #[test]
    fn a_panic_while_the_table_is_held_stops_the_engine_as_a_panic() {
        let metrics = Arc::new(Metrics::default());
        let (handle, thread) = Engine::start(
            Box::new(MemStore::default()),
            baton_core::Limits::default(),
            metrics,
        )
        .unwrap();
        let shared = handle.shared.clone();
        let poisoner = std::thread::spawn(move || {
            let _held = shared.lock();
            panic!("a violated invariant while the table is held");
        });
        assert!(poisoner.join().is_err());
        let (reply, _rx) = oneshot::channel();
        let status = Command::Status {
            resource: ResourceName::parse("r").unwrap(),
            reply,
        };
        assert!(!handle.send(status), "no command is taken after the panic");
        assert!(thread.join().is_err(), "the engine stops as a panic");
    }
}
