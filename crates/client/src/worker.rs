//! The worker runtime: keep a lease alive on the monotonic clock, know when
//! ownership is uncertain, and stop work when it is lost.
//!
//! The [`Keeper`] renews every TTL/3 (by default) and keeps a *safe until*
//! deadline: the instant the last successful renew request was **sent**, plus
//! the TTL the server granted, minus a safety margin for clock rate
//! differences. Every renew has a deadline no later than that. A renew that
//! fails, times out or answers "not owner" never extends it.
//!
//! [`Keeper::may_start_effect`] answers from the deadline and the monotonic
//! clock, not from the last known state, so a process that was paused (GC,
//! SIGSTOP) and wakes past its deadline finds itself lost before it can start
//! an effect, even if the renew task has not run since.
//!
//! Over a [`Session`] (the default of [`run_guarded`] and
//! [`acquire_with_backoff`]), a lease tied to the session is not renewed
//! at all: the keeper follows the session's heartbeats, and its safe-until
//! is the send time of the last acknowledged heartbeat plus the session TTL
//! minus the margin, with the same guarantee. A fence of the lease is
//! reported on the next heartbeat and makes the keeper lose it.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::{AcquisitionId, FencingToken};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::deadline::Deadline;
use crate::{Acquired, Client, ClientError, Lease, Renewal, Session};

/// What the keeper knows about its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The last renewal succeeded and the safe deadline has not passed.
    Held,
    /// A renewal failed; the safe deadline has not passed yet. Finish or
    /// abandon, but think twice before starting a new effect.
    Uncertain,
    /// Not owner, or the safe deadline passed. Stop.
    Lost,
}

/// Why a keeper gave its lease up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The safe deadline passed without a successful renewal (or, over a
    /// session, an acknowledged heartbeat): the server may be unreachable,
    /// stopped or slow, and may already have given the resource away.
    DeadlinePassed,
    /// The server answered that this acquisition no longer holds the
    /// lease: it expired, was released, fenced or replaced; over a
    /// session, the lease was fenced or the session ended.
    NotOwner,
    /// The server refused the renewal as invalid (the message says why).
    Refused(String),
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::DeadlinePassed => f.write_str(
                "its safe-until deadline passed without a renewal or heartbeat acknowledged in time",
            ),
            LossReason::NotOwner => f.write_str("the server answered not owner"),
            LossReason::Refused(why) => write!(f, "renewal refused: {why}"),
        }
    }
}

/// Renews a lease. [`Client`] implements it; tests use scripted renewers.
pub trait Renewer: Send + 'static {
    /// Renews `resource` held by `id`.
    fn renew(
        &mut self,
        resource: &str,
        id: &AcquisitionId,
    ) -> impl Future<Output = Result<Renewal, ClientError>> + Send;
}

impl Renewer for Client {
    async fn renew(&mut self, resource: &str, id: &AcquisitionId) -> Result<Renewal, ClientError> {
        Client::renew(self, resource, id).await
    }
}

/// How a keeper renews and how much margin it keeps.
#[derive(Clone, Debug, Default)]
pub struct KeeperConfig {
    /// Time between renewals; default TTL/3.
    pub renew_interval: Option<Duration>,
    /// Subtracted from every granted TTL; default 5% of the TTL, at least 10 ms.
    pub safety_margin: Option<Duration>,
}

impl KeeperConfig {
    /// The time between renewals of a lease of `ttl`.
    pub fn interval(&self, ttl: Duration) -> Duration {
        self.renew_interval.unwrap_or(ttl / 3)
    }

    /// The margin kept below a granted `ttl`.
    pub fn margin(&self, ttl: Duration) -> Duration {
        self.safety_margin
            .unwrap_or((ttl / 20).max(Duration::from_millis(10)))
    }
}

/// Exponential backoff with full jitter: the n-th delay is uniform in
/// `[0, min(max, base * 2^n)]`.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    rng: crate::rng::Rng,
}

impl Backoff {
    /// Backoff seeded from the process's hash randomness.
    pub fn new(base: Duration, max: Duration) -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self::with_seed(base, max, seed)
    }

    /// A reproducible sequence, for tests and simulations.
    pub fn with_seed(base: Duration, max: Duration, seed: u64) -> Self {
        Self {
            base,
            max,
            attempt: 0,
            rng: crate::rng::Rng::new(seed),
        }
    }

    /// The ceiling of the next delay, before jitter.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The next delay: uniform in `[0, ceiling]`, then the ceiling doubles.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let nanos = ceiling.as_nanos() as u64;
        Duration::from_nanos(self.rng.below(nanos.saturating_add(1)))
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

struct Shared {
    safe_until: Mutex<Instant>,
    state: watch::Sender<Ownership>,
    cancel: CancellationToken,
    /// Set once, by the renew task, when it gives the lease up.
    why: Mutex<Option<LossReason>>,
}

impl Shared {
    fn safe_until(&self) -> Instant {
        *self.safe_until.lock().expect("keeper mutex")
    }

    fn ownership(&self) -> Ownership {
        if Instant::now() >= self.safe_until() {
            Ownership::Lost
        } else {
            *self.state.borrow()
        }
    }

    fn lose(&self, resource: &str, token: FencingToken, why: LossReason) {
        tracing::warn!(%resource, %token, %why, "lease lost");
        crate::observe::lost(&why);
        self.why.lock().expect("keeper mutex").get_or_insert(why);
        self.state.send_replace(Ownership::Lost);
        self.cancel.cancel();
    }

    fn loss_reason(&self) -> Option<LossReason> {
        let why = self.why.lock().expect("keeper mutex").clone();
        match why {
            Some(why) => Some(why),
            // Lost by the clock before the renew task ran (a pause).
            None if self.ownership() == Ownership::Lost => Some(LossReason::DeadlinePassed),
            None => None,
        }
    }
}

/// A cheap handle for work running under a lease.
#[derive(Clone)]
pub struct Guard {
    lease: Lease,
    shared: Arc<Shared>,
}

impl Guard {
    /// The lease being kept.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token to carry into every protected write.
    pub fn token(&self) -> FencingToken {
        self.lease.token
    }

    /// The monotonic instant after which this process must assume it no longer owns the lease.
    pub fn safe_until(&self) -> Instant {
        self.shared.safe_until()
    }

    /// Held, uncertain or lost, answered from the deadline and the clock.
    pub fn ownership(&self) -> Ownership {
        self.shared.ownership()
    }

    /// May a new effect start now? Read from the monotonic deadline, so it is
    /// right even just after a pause in which the renew task never ran.
    pub fn may_start_effect(&self) -> bool {
        self.shared.ownership() == Ownership::Held
    }

    /// Fires when the lease is lost or the safe deadline passes.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Why the lease was lost; `None` while it is not.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss_reason()
    }
}

/// Keeps one lease alive until stopped or lost.
pub struct Keeper {
    guard: Guard,
    state: watch::Receiver<Ownership>,
    task: JoinHandle<()>,
}

impl Keeper {
    /// Starts renewing `lease`. The first safe deadline is the lease's
    /// [`Lease::valid_until`] (counted from the acquire's send time) minus
    /// the margin; a lease already past it is lost at once.
    pub fn start<R: Renewer>(renewer: R, lease: Lease, config: KeeperConfig) -> Self {
        let margin = config.margin(lease.ttl);
        let first_safe_until = lease
            .valid_until
            .checked_sub(margin)
            .unwrap_or(lease.valid_until);
        let (state, rx) = watch::channel(Ownership::Held);
        let shared = Arc::new(Shared {
            safe_until: Mutex::new(first_safe_until),
            state,
            cancel: CancellationToken::new(),
            why: Mutex::new(None),
        });
        // In the caller's span: its renewals join the caller's trace.
        let task =
            tokio::spawn(run(renewer, lease.clone(), config, shared.clone()).in_current_span());
        Self {
            guard: Guard { lease, shared },
            state: rx,
            task,
        }
    }

    /// A cheap handle the work carries to ask about ownership.
    pub fn guard(&self) -> Guard {
        self.guard.clone()
    }

    /// The lease being kept.
    pub fn lease(&self) -> &Lease {
        &self.guard.lease
    }

    /// Held, uncertain or lost, answered from the deadline and the clock.
    pub fn ownership(&self) -> Ownership {
        self.guard.ownership()
    }

    /// Whether an effect may start now: only before the safe-until deadline.
    pub fn may_start_effect(&self) -> bool {
        self.guard.may_start_effect()
    }

    /// The instant after which the server may have expired the lease.
    pub fn safe_until(&self) -> Instant {
        self.guard.safe_until()
    }

    /// Fires when ownership is lost or at the deadline, whichever is first.
    pub fn cancellation(&self) -> CancellationToken {
        self.guard.cancellation()
    }

    /// Why the lease was lost; `None` while it is not.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard.loss_reason()
    }

    /// Waits until the ownership state changes and returns the new one.
    pub async fn changed(&mut self) -> Ownership {
        let _ = self.state.changed().await;
        let state = *self.state.borrow_and_update();
        state
    }

    /// Stops renewing (the lease then runs out unless released) and returns it.
    pub fn stop(self) -> Lease {
        self.task.abort();
        self.guard.lease.clone()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run<R: Renewer>(mut renewer: R, lease: Lease, config: KeeperConfig, shared: Arc<Shared>) {
    let interval = config.interval(lease.ttl);
    let margin = config.margin(lease.ttl);
    // The lease's TTL started no earlier than this (its send time, for a
    // lease with its own TTL): the first renewal is one interval later.
    let started = lease
        .valid_until
        .checked_sub(lease.ttl)
        .unwrap_or_else(Instant::now);
    let mut deadline = Deadline::opened_with_margin(started, lease.ttl, margin);
    let mut next = started + interval;
    let mut retry = Backoff::new(interval / 8, interval / 2);
    let (resource, token) = (lease.resource.as_str(), lease.token);
    loop {
        let safe_until = shared.safe_until();
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(safe_until) => {
                shared.lose(resource, token, LossReason::DeadlinePassed);
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        if sent >= safe_until {
            shared.lose(resource, token, LossReason::DeadlinePassed);
            return;
        }
        match tokio::time::timeout_at(safe_until, renewer.renew(resource, &lease.acquisition_id))
            .await
        {
            Ok(Ok(Renewal::Renewed { remaining, .. })) => {
                deadline.acknowledged(sent, Instant::now(), remaining);
                *shared.safe_until.lock().expect("keeper mutex") = deadline.safe_until();
                shared
                    .state
                    .send_if_modified(|s| std::mem::replace(s, Ownership::Held) != Ownership::Held);
                retry.reset();
                next = sent + interval;
            }
            Ok(Ok(Renewal::NotOwner)) => {
                crate::observe::renewal_failed("not_owner");
                shared.lose(resource, token, LossReason::NotOwner);
                return;
            }
            Ok(Err(e @ ClientError::Invalid(_))) => {
                crate::observe::renewal_failed("refused");
                shared.lose(resource, token, LossReason::Refused(e.to_string()));
                return;
            }
            Ok(Err(e)) => {
                crate::observe::renewal_failed("error");
                tracing::info!(%resource, %token, error = %e, "renewal failed; ownership uncertain");
                shared.state.send_if_modified(|s| {
                    std::mem::replace(s, Ownership::Uncertain) != Ownership::Uncertain
                });
                next = Instant::now() + retry.next_delay();
            }
            Err(_) => {
                crate::observe::renewal_failed("timeout");
                shared.lose(resource, token, LossReason::DeadlinePassed);
                return;
            }
        }
    }
}

/// How guarded work ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Guarded<T> {
    /// The work finished while the lease was held (or at least not known lost).
    Completed(T),
    /// The lease was lost; the work was stopped (its future dropped).
    Lost {
        /// The token of the lease that was lost.
        token: FencingToken,
    },
    /// The resource could not be acquired.
    NotAcquired,
}

/// Acquires `resource` (waiting up to `wait` on the server), runs `work`
/// with a [`Guard`] while a [`Keeper`] keeps the lease, stops the work if
/// the lease is lost, and releases the lease at the end (best effort).
///
/// The lease is tied to the client's shared session for `ttl`
/// ([`Client::session`]): it needs no renewals of its own, and it expires
/// `ttl` after the session's last heartbeat reached the server.
pub async fn run_guarded<F, Fut, T>(
    client: &Client,
    resource: &str,
    ttl: Duration,
    wait: Duration,
    config: KeeperConfig,
    work: F,
) -> Result<Guarded<T>, ClientError>
where
    F: FnOnce(Guard) -> Fut,
    Fut: Future<Output = T>,
{
    let session = client.session(ttl).await?;
    let lease = match session.acquire(resource, wait).await? {
        Acquired::Granted(lease) => lease,
        Acquired::NotAcquired(_) => return Ok(Guarded::NotAcquired),
    };
    let keeper = Keeper::start(session.clone(), lease, config);
    let cancel = keeper.cancellation();
    let outcome = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        value = work(keeper.guard()) => Some(value),
    };
    let lease = keeper.stop();
    if let Err(e) = session
        .release(&lease.resource, &lease.acquisition_id)
        .await
    {
        tracing::info!(resource = %lease.resource, token = %lease.token, error = %e, "release failed; the lease will expire");
    }
    Ok(match outcome {
        Some(value) => Guarded::Completed(value),
        None => Guarded::Lost { token: lease.token },
    })
}

/// Tries to acquire every resource in `resources` (all or nothing) until
/// `budget` runs out, sleeping with exponential backoff and full jitter
/// between attempts. The leases are tied to the client's shared session for
/// `ttl`. Returns them with the session (for [`Keeper::start`]), or `None`
/// if the budget ran out.
pub async fn acquire_with_backoff(
    client: &Client,
    resources: &[&str],
    ttl: Duration,
    budget: Duration,
    backoff: &mut Backoff,
) -> Result<Option<(Vec<Lease>, Session)>, ClientError> {
    let deadline = Instant::now() + budget;
    let session = client.session(ttl).await?;
    loop {
        match session.acquire_all(resources, Duration::ZERO).await? {
            crate::AcquiredAll::Granted { leases, .. } => return Ok(Some((leases, session))),
            crate::AcquiredAll::NotAcquired(_) => {
                let delay = backoff.next_delay();
                if Instant::now() + delay >= deadline {
                    return Ok(None);
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
