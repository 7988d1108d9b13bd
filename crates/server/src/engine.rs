//! The engine: one thread that owns the lease table and the store.
//!
//! It takes commands in batches, applies them to the table, commits the
//! batch's writes with one fsync when a token was issued (group commit), and
//! only then releases the batch's replies. Releases and expiries are written
//! lazily: losing them in a crash only keeps a lease held for one more TTL.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::{
    AcquireError, AcquireOutcome, AcquireRequest, AcquisitionId, Event, FenceOutcome, Grant,
    LeaseStatus, LeaseTable, MonoMs, NotAcquired, ReleaseOutcome, RenewOutcome, ResourceName,
    WaitResult, WaiterId, Write,
};
use baton_store::{LeaseStore, StoreError, Stored};
use tokio::sync::oneshot;
use tracing::{debug, error, info};

use crate::metrics::Metrics;

/// Most commands taken into one batch.
const BATCH_LEN_MAX: usize = 4_096;
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
}

pub type Reply<T> = oneshot::Sender<T>;

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
    CancelWait {
        waiter: WaiterId,
    },
    /// Flush and stop, even if handles remain (connections that outlived the grace period).
    Shutdown,
}

/// A cheap handle for sending commands to the engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
}

impl EngineHandle {
    /// Sends a command; `false` if the engine has stopped.
    pub fn send(&self, command: Command) -> bool {
        self.tx.send(command).is_ok()
    }
}

type Deferred = Box<dyn FnOnce() + Send>;

pub struct Engine {
    table: LeaseTable,
    store: Box<dyn LeaseStore>,
    rx: mpsc::Receiver<Command>,
    origin: Instant,
    pending: Vec<Write>,
    flush_at: MonoMs,
    waiting: HashMap<WaiterId, Reply<Result<AcquireReply, AcquireError>>>,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// Loads the table from `store` (every stored lease held for a full TTL
    /// from now) and starts the engine thread.
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
        let n_leases = stored.leases.len();
        let table = LeaseTable::recover(
            limits,
            MonoMs(0),
            stored.epoch,
            stored.counter,
            stored.leases,
        );
        info!(
            epoch = stored.epoch.get(),
            counter = stored.counter,
            n_leases,
            "recovered lease state; stored leases are held for a full TTL from now"
        );
        metrics.leases.set(n_leases as i64);
        let (tx, rx) = mpsc::channel();
        let engine = Engine {
            table,
            store,
            rx,
            origin,
            pending: Vec::new(),
            flush_at: MonoMs(LAZY_FLUSH_INTERVAL_MS),
            waiting: HashMap::new(),
            metrics,
        };
        let thread = std::thread::Builder::new()
            .name("baton-engine".into())
            .spawn(move || engine.run())
            .expect("spawn engine thread");
        Ok((EngineHandle { tx }, thread))
    }

    fn now(&self) -> MonoMs {
        MonoMs(self.origin.elapsed().as_millis() as u64)
    }

    fn run(mut self) -> Result<(), StoreError> {
        let mut batch = Vec::with_capacity(64);
        let mut again = false;
        loop {
            let now = self.now();
            let wake = [
                self.table.next_deadline(),
                (!self.pending.is_empty()).then_some(self.flush_at),
            ]
            .into_iter()
            .flatten()
            .min();
            let timeout = if again {
                Duration::ZERO
            } else {
                wake.map_or(Duration::from_secs(3600), |at| {
                    Duration::from_millis(at.0.saturating_sub(now.0))
                })
            };
            match self.rx.recv_timeout(timeout) {
                Ok(command) => batch.push(command),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            while batch.len() < BATCH_LEN_MAX {
                match self.rx.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            let stop = batch.iter().any(|c| matches!(c, Command::Shutdown));
            again = self.step(&mut batch)?;
            if stop {
                break;
            }
        }
        // Every handle is gone: the server is shutting down.
        if !self.pending.is_empty() {
            self.store.commit(&self.pending)?;
        }
        info!("engine stopped; lazy writes flushed");
        Ok(())
    }

    /// Runs one batch. Returns true if it left work for an immediate next round.
    fn step(&mut self, batch: &mut Vec<Command>) -> Result<bool, StoreError> {
        let now = self.now();
        let mut replies: Vec<Deferred> = Vec::with_capacity(batch.len());
        for command in batch.drain(..) {
            self.apply(now, command, &mut replies);
        }
        self.table.tick(now);
        let fx = self.table.take_effects();
        self.pending.extend(fx.writes);
        let flush = !self.pending.is_empty()
            && (fx.sync || now >= self.flush_at || self.pending.len() >= LAZY_WRITES_MAX);
        if flush {
            let started = Instant::now();
            if let Err(e) = self.store.commit(&self.pending) {
                // Dropping the replies tells every caller the outcome is unknown.
                self.metrics.store_errors.inc();
                error!(error = %e, "lease store commit failed; stopping");
                return Err(e);
            }
            self.metrics
                .observe_commit_latency_us(started.elapsed().as_micros() as u64);
            self.metrics.commits.inc();
            self.pending.clear();
            self.flush_at = MonoMs(now.0 + LAZY_FLUSH_INTERVAL_MS);
        }
        assert!(
            !fx.sync || flush,
            "a batch that issued a token must commit before replying"
        );
        self.record(&fx.events);
        let mut again = false;
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
            };
            if let Err(Ok(AcquireReply::Granted { grants, .. })) = reply.send(Ok(answer)) {
                // The caller left just as its turn came: give the leases back.
                for g in grants {
                    self.table.release(now, &g.resource, &g.acquisition_id);
                }
                again = true;
            }
        }
        for reply in replies {
            reply();
        }
        self.metrics.leases.set(self.table.n_leases() as i64);
        self.metrics.waiters.set(self.table.n_waiters() as i64);
        Ok(again)
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
            Command::Renew {
                resource,
                id,
                reply,
            } => {
                let out = self.table.renew(now, &resource, &id);
                defer(replies, reply, out);
            }
            Command::Release {
                resource,
                id,
                reply,
            } => {
                let out = self.table.release(now, &resource, &id);
                defer(replies, reply, out);
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
            Command::Snapshot { reply } => {
                let (epoch, counter) = self.table.last_token();
                let leases = self.table.leases().map(|(r, l)| (r.clone(), l)).collect();
                defer(
                    replies,
                    reply,
                    Stored {
                        epoch,
                        counter,
                        leases,
                    },
                );
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
                } => {
                    m.grants.inc();
                    if *after_wait {
                        m.ownership_transfers.inc();
                    }
                    debug!(%resource, %token, acquisition = %acquisition_id.prefix(), after_wait, "granted");
                }
                Event::Renewed { .. } => {
                    m.renewals.inc();
                }
                Event::RenewRefused { resource } => {
                    m.renewals_failed.inc();
                    debug!(%resource, "renewal refused: not owner");
                }
                Event::Released { resource, token } => {
                    m.releases.inc();
                    debug!(%resource, %token, "released");
                }
                Event::Expired { resource, token } => {
                    m.expiries.inc();
                    debug!(%resource, %token, "lease expired");
                }
                Event::Fenced {
                    resource,
                    token,
                    revoked,
                } => {
                    m.fences.inc();
                    match revoked {
                        Some(revoked) => {
                            info!(%resource, %token, %revoked, "fenced; lease revoked")
                        }
                        None => info!(%resource, %token, "fenced; no lease was held"),
                    }
                }
                Event::WaitTimedOut { .. } => {
                    m.wait_timeouts.inc();
                }
            }
        }
    }
}
