//! The engine: the lease table behind a lock, applied to by the callers
//! themselves, a timer thread for deadlines, and a committer thread that
//! owns the store. The rules of the pipeline between them (which writes
//! a step hands over, what a commit holds, when a reply may go) are pure,
//! in `baton_core::pipeline`, which the simulator runs too; this module
//! and `committer.rs` are the threads and channels around them.
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

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use baton_core::pipeline::{Job, Pipeline};
use baton_core::{AcquireError, LeaseStatus, LeaseTable, MonoMs, WaitResult};
use baton_store::{LeaseStore, StoreError};
use tracing::info;

mod apply;
mod command;
mod committer;
mod quotas;
mod record;
mod timer;
pub(crate) mod watch;

use crate::metrics::Metrics;
use crate::observed::Observed;
use crate::quota::Quotas;
use committer::{Committer, Replies, ToCommitter};
use timer::run_timer;
use watch::{Hub, WatchStart};

pub use command::{AcquireAnswer, AcquireReply, Command, Reply, SessionCheck, SnapshotReply};

/// What bounds an engine: its table's limits, the quotas in force, and how
/// many holder changes it keeps for watchers that resume.
#[derive(Clone)]
pub struct Bounds {
    pub limits: baton_core::Limits,
    pub quotas: Arc<Quotas>,
    /// `baton serve --watch-history`.
    pub watch_history_len: usize,
}

#[cfg(test)]
impl Bounds {
    /// The defaults, with `quotas`.
    pub fn with_quotas(quotas: Arc<Quotas>) -> Self {
        Self {
            limits: baton_core::Limits::default(),
            quotas,
            watch_history_len: watch::WATCH_HISTORY_LEN_DEFAULT,
        }
    }
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
        let e = &mut *engine;
        e.quotas.catch_up(&mut e.table);
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

/// The table and what goes with it; always behind [`Shared`]'s lock.
pub struct Engine {
    table: LeaseTable,
    origin: Instant,
    /// Lazy writes not yet handed over, and the waiting callers.
    pipeline: Pipeline<Reply<AcquireAnswer>>,
    metrics: Arc<Metrics>,
    /// Where the page's history is kept.
    observed: Arc<Observed>,
    committer: mpsc::Sender<ToCommitter>,
    /// The deadline the timer thread sleeps towards.
    armed: MonoMs,
    /// No more commands are taken.
    stopped: bool,
    /// Watchers of holder changes.
    hub: Arc<Hub>,
    /// Backups waiting for this step's writes to be durable.
    snapshots: Vec<SnapshotReply>,
    /// This engine's recorder of the page's history (retired when it stops).
    recorder: u64,
    /// The quota file in force, and the reload the table last took.
    quotas: quotas::Followed,
}

impl Engine {
    /// Loads the table from `store` (every stored lease held for a full TTL
    /// from now) and starts the timer and committer threads. The returned
    /// thread (the timer's) ends when the engine stops, with the
    /// committer's outcome.
    pub fn start(
        store: Box<dyn LeaseStore>,
        bounds: Bounds,
        metrics: Arc<Metrics>,
        observed: Arc<Observed>,
    ) -> Result<
        (
            EngineHandle,
            std::thread::JoinHandle<Result<(), StoreError>>,
        ),
        StoreError,
    > {
        // The clock starts before the load, as the leases are read while
        // the table is built: every stored lease was granted (and every
        // session heartbeat sent) before the crash that this start follows,
        // so a TTL counted from any moment after the crash is a full one.
        let origin = Instant::now();
        let mut table = committer::recover(&*store, bounds.limits)?;
        let quotas = quotas::Followed::start(bounds.quotas, &mut table);
        let (epoch, counter) = table.last_token();
        let history = store.history(bounds.watch_history_len)?;
        // A restore's new epoch numbers its changes above every earlier one.
        let seq = history.seq.max(baton_core::first_seq(epoch));
        let hub = Hub::new(seq, history.changes, bounds.watch_history_len);
        let n_leases = table.n_leases();
        info!(
            epoch = epoch.get(),
            counter,
            n_leases,
            n_sessions = table.n_sessions(),
            seq,
            "recovered lease state; stored leases and sessions are held for a full TTL from now"
        );
        metrics.leases.set(n_leases as i64);
        let (timer, timer_rx) = mpsc::channel();
        let (to_committer, committer_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine {
                table,
                origin,
                pipeline: Pipeline::new(MonoMs(0), seq),
                metrics: metrics.clone(),
                observed: observed.clone(),
                committer: to_committer.clone(),
                armed: MonoMs(u64::MAX),
                stopped: false,
                hub: Arc::new(hub),
                snapshots: Vec::new(),
                recorder: observed.history.new_recorder(),
                quotas,
            }),
            timer: timer.clone(),
        });
        metrics.read_quota_use(quotas::reader(&shared));
        Ok(spawn_threads(
            shared,
            store,
            timer,
            timer_rx,
            (to_committer, committer_rx),
            metrics,
            observed,
        ))
    }

    fn now(&self) -> MonoMs {
        MonoMs(self.origin.elapsed().as_millis() as u64)
    }

    /// When the table next needs a step without a command: its next
    /// deadline, or the lazy flush.
    fn next_wake(&self) -> Option<MonoMs> {
        self.pipeline.next_wake(&self.table)
    }

    /// Ticks the table to `now` and hands the step's writes and replies to
    /// the committer. `false` if the committer has stopped (a commit failed).
    fn step(&mut self, now: MonoMs, mut replies: Vec<Deferred>) -> bool {
        self.pipeline.set_watched(self.hub.is_watched());
        let step = self.pipeline.step(&mut self.table, now);
        let pace = committer::expiry_drops_per_ms(&self.metrics);
        self.table.set_expiry_drops_per_ms(pace);
        if !step.changes.is_empty() {
            // Kept, published and recorded by the committer once the
            // writes they came with are durable: neither the page nor a
            // watcher sees a change that a crash could take back.
            let hub = self.hub.clone();
            let observed = self.observed.clone();
            let changes = step.changes;
            replies.push(Box::new(move || {
                hub.publish(&changes);
                let changes = changes.into_iter().map(|c| c.change).collect();
                observed.history.queue(changes, Instant::now());
            }));
        }
        self.record(&step.events);
        let mut woken = Vec::with_capacity(step.woken.len());
        for (reply, result) in step.woken {
            let answer = match result {
                WaitResult::Granted(grants) => {
                    self.metrics.grants_after_wait.inc();
                    Ok(AcquireReply::Granted {
                        grants,
                        after_wait: true,
                    })
                }
                WaitResult::TimedOut(blockers) => Ok(AcquireReply::TimedOut(blockers)),
                WaitResult::SessionEnded => Ok(AcquireReply::SessionEnded),
                WaitResult::OverQuota(over) => Err(AcquireError::OverQuota(over)),
            };
            woken.push((reply, answer));
        }
        self.metrics.leases.set(self.table.n_leases() as i64);
        self.metrics.waiters.set(self.table.n_waiters() as i64);
        self.metrics.sessions.set(self.table.n_sessions() as i64);
        self.metrics
            .leases_ending
            .set((self.table.n_overdue() + self.table.n_draining()) as i64);
        let snapshots = std::mem::take(&mut self.snapshots);
        if replies.is_empty() && woken.is_empty() && step.writes.is_empty() && snapshots.is_empty()
        {
            return true;
        }
        self.metrics
            .commit_queue_writes
            .inc_by(step.writes.len() as i64);
        let job = Job {
            writes: step.writes,
            sync: step.sync,
            replies: Replies {
                replies,
                woken,
                snapshots,
            },
        };
        self.committer.send(ToCommitter::Job(job)).is_ok()
    }

    /// A watcher's snapshot now (or, resuming after `after`, the kept
    /// changes after it), and its registration in step order.
    fn watch(
        &mut self,
        now: MonoMs,
        (prefix, after): (String, Option<u64>),
        reply: Reply<Result<WatchStart, watch::Refused>>,
        replies: &mut Vec<Deferred>,
    ) {
        // Every change so far is handed over, and goes to earlier watchers
        // in a step of its own, so that this snapshot and the events
        // registered after it neither overlap nor leave a gap.
        self.pipeline.flush_next_step(now);
        self.step(now, std::mem::take(replies));
        self.hub.expect();
        let hub = self.hub.clone();
        if let Some(after) = after {
            replies.push(Box::new(move || {
                let _ = reply.send(hub.resume(prefix, after));
            }));
            return;
        }
        let holders: Vec<LeaseStatus> = self
            .table
            .list(now, &prefix, None, usize::MAX)
            .into_iter()
            .filter(|s| s.holder_token.is_some())
            .collect();
        replies.push(Box::new(move || {
            let _ = reply.send(Ok(hub.register(prefix, holders)));
        }));
    }
}

/// Starts the committer thread, which owns `store`, and the timer thread,
/// which steps `shared` at its deadlines and joins the committer.
fn spawn_threads(
    shared: Arc<Shared>,
    store: Box<dyn LeaseStore>,
    timer: mpsc::Sender<Wake>,
    timer_rx: mpsc::Receiver<Wake>,
    committer: (mpsc::Sender<ToCommitter>, mpsc::Receiver<ToCommitter>),
    metrics: Arc<Metrics>,
    observed: Arc<Observed>,
) -> (
    EngineHandle,
    std::thread::JoinHandle<Result<(), StoreError>>,
) {
    let recorder = shared.lock().recorder;
    let (to_self, rx) = committer;
    let committer = Committer {
        store,
        rx,
        to_self,
        engine: Arc::downgrade(&shared),
        timer: timer.clone(),
        metrics,
    };
    std::thread::Builder::new()
        .name("baton-history".into())
        .spawn(move || observed.history.run_recorder(recorder))
        .expect("spawn history thread");
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
    (
        EngineHandle {
            shared,
            _last: stop,
        },
        thread,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::ResourceName;
    use baton_testkit::store::MemStore;
    use tokio::sync::oneshot;

    #[test]
    fn a_panic_while_the_table_is_held_stops_the_engine_as_a_panic() {
        let metrics = Arc::new(Metrics::default());
        let (handle, thread) = Engine::start(
            Box::new(MemStore::default()),
            Bounds::with_quotas(Arc::default()),
            metrics,
            Arc::default(),
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
