//! `statements dispatch`: sends what the outbox holds.
//!
//! Several dispatchers may run at once. Each delivery is claimed with a
//! Baton lease on `outbox:ID` (try once, never wait: a held row belongs to
//! another dispatcher) and the lease's fencing token, which the outbox
//! checks on every step, so a dispatcher that paused past its lease cannot
//! overwrite what its successor recorded. Before sending, the keeper must
//! still vouch for the lease and the row must still be claimed by this
//! token and not cancelled.
//!
//! After a send whose outcome is unknown (a timeout, a connection dropped
//! after the request went out), or when a claim finds an earlier send that
//! recorded nothing: the webhook is asked for the key's status, and sent
//! again with the same key if it never saw it; an email goes to
//! `needs_attention`, never out a second time without an operator.

mod callback;
mod smtp;
mod webhook;

use anyhow::Context;
use std::time::Duration;

use baton_client::worker::{Backoff, Keeper, KeeperConfig};
use baton_client::{Acquired, Client};
use baton_fence::outbox::{Delivery, DeliveryState, ReceiverKind, Report, StepOutcome};
use baton_fence::FencingToken;
use serde_json::json;

use crate::events::emit;
use crate::store::{self, Db, Location, Result};

/// What became of one send.
#[derive(Debug)]
pub enum Sent {
    /// The receiver took it.
    Delivered(String),
    /// The receiver took it and will confirm.
    Accepted(String),
    /// It cannot have arrived; another try is safe.
    NeverArrived(String),
    /// The receiver refused it for good.
    Refused(String),
    /// It may or may not have arrived.
    Unknown(String),
}

/// The fault drills of a dispatcher (off in production).
#[derive(Clone, Debug, Default)]
pub struct Drills {
    /// Abort right after a send, before its outcome is recorded.
    pub crash_after_send: bool,
    /// Stop with SIGSTOP right after a send, before its outcome is recorded.
    pub pause_after_send: bool,
    /// NEGATIVE CONTROL: no idempotency key, and an unknown outcome is
    /// retried whatever the receiver (duplicates follow).
    pub blind_retries: bool,
}

#[derive(Clone, Debug)]
pub struct DispatchConfig {
    pub target: Location,
    pub server: String,
    pub name: String,
    /// The lease on each delivery while it is being sent.
    pub ttl: Duration,
    pub poll: Duration,
    pub once: bool,
    /// The SMTP relay, `HOST:PORT`.
    pub smtp: Option<String>,
    pub smtp_from: String,
    /// How long a send may take before its outcome counts as unknown.
    pub send_timeout: Duration,
    /// Sends per delivery before it fails.
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How long an accepted webhook delivery waits for its callback before
    /// its status is asked.
    pub confirm_wait: Duration,
    pub callback_listen: Option<std::net::SocketAddr>,
    /// The bearer token a callback must present (read from a file).
    pub callback_token: Option<String>,
    pub drills: Drills,
}

/// Runs the dispatcher until killed (or, with `once`, for one pass).
pub async fn run(cfg: DispatchConfig) -> Result<()> {
    if let Some(listen) = cfg.callback_listen {
        let token = cfg.callback_token.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "--callback-listen needs --callback-token-file: a callback marks a delivery delivered, so it must prove it comes from the receiver"
            )
        })?;
        let bound = callback::serve(listen, cfg.target.clone(), token).await?;
        eprintln!("callbacks on http://{bound}/callback");
    }
    crate::events::outlive_errors("dispatcher", &cfg.name, cfg.once, async |backoff| {
        pass_loop(&cfg, backoff).await
    })
    .await
}

async fn pass_loop(cfg: &DispatchConfig, backoff: &mut Backoff) -> Result<()> {
    let client = Client::connect(&cfg.server).await?;
    let mut db = store::open(&cfg.target).await?;
    baton_telemetry::use_ring_for_https();
    let http = reqwest::Client::builder()
        .build()
        .context("the HTTP client")?;
    loop {
        let due = db.outbox().due(100).await?;
        for row in due {
            deliver(cfg, &client, &http, &mut db, &row).await?;
        }
        backoff.reset();
        if cfg.once {
            return Ok(());
        }
        tokio::time::sleep(cfg.poll).await;
    }
}

/// The backoff before attempt `attempts + 1`: full jitter under a ceiling
/// that doubles per attempt.
fn retry_after(cfg: &DispatchConfig, attempts: i32) -> Duration {
    let mut b = Backoff::new(cfg.backoff_base, cfg.backoff_max);
    for _ in 1..attempts.max(1) {
        b.next_delay();
    }
    b.next_delay().max(Duration::from_millis(1))
}

fn kind(row: &Delivery) -> ReceiverKind {
    ReceiverKind::parse(&row.receiver_kind).unwrap_or(ReceiverKind::Unrepeatable)
}

async fn deliver(
    cfg: &DispatchConfig,
    client: &Client,
    http: &reqwest::Client,
    db: &mut Db,
    row: &Delivery,
) -> Result<()> {
    let resource = format!("outbox:{}", row.id);
    let session = client.session(cfg.ttl).await?;
    let lease = match session.acquire(&resource, Duration::ZERO).await? {
        Acquired::Granted(lease) => lease,
        Acquired::NotAcquired(_) => return Ok(()),
    };
    let keeper = Keeper::start(session.clone(), lease.clone(), KeeperConfig::default());
    let token = lease.token;
    let result = Delivering {
        cfg,
        http,
        row,
        token,
        guard: keeper.guard(),
    }
    .run(db)
    .await;
    let lease = keeper.stop();
    let _ = session
        .release(&lease.resource, &lease.acquisition_id)
        .await;
    result
}

struct Delivering<'a> {
    cfg: &'a DispatchConfig,
    http: &'a reqwest::Client,
    row: &'a Delivery,
    token: FencingToken,
    guard: baton_client::worker::Guard,
}

impl Delivering<'_> {
    fn said(&self, what: &str, extra: serde_json::Value) {
        let mut fields = json!({
            "dispatcher": self.cfg.name,
            "delivery": self.row.id,
            "operation": self.row.operation,
            "token": self.token.get(),
        });
        if let (Some(f), serde_json::Value::Object(extra)) = (fields.as_object_mut(), extra) {
            f.extend(extra);
        }
        emit(what, fields);
    }

    async fn run(&self, db: &mut Db) -> Result<()> {
        let id = self.row.id;
        let claim = db.outbox().claim(id, self.token, &self.cfg.name).await?;
        if claim.outcome != StepOutcome::Claimed {
            return Ok(());
        }
        let previous = claim.previous();
        let attempts = claim.attempts.unwrap_or(0);
        self.said("claimed", json!({"was": previous.map(|p| p.as_str())}));
        if let Some(done) = self.settle_doubt(db, previous, attempts).await? {
            return Ok(done);
        }
        if !self.guard.may_start_effect() {
            self.said("lease_lost", json!({"when": "before send"}));
            return Ok(());
        }
        let begun = db.outbox().begin_send(id, self.token).await?;
        match begun.outcome {
            StepOutcome::Sending => {}
            StepOutcome::Cancelled => {
                self.said("not_sent", json!({"why": "cancelled"}));
                return Ok(());
            }
            other => {
                self.said("not_sent", json!({"why": other.label()}));
                return Ok(());
            }
        }
        let attempts = begun.attempts.unwrap_or(attempts + 1);
        let payload = db
            .outbox()
            .payload(id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("delivery {id} vanished"))?;
        let sent = self.send(payload).await;
        self.said(
            "sent",
            json!({"attempt": attempts, "result": format!("{sent:?}")}),
        );
        self.drills_after_send();
        let (report, evidence) = self.judge(sent, attempts).await;
        self.record(db, report, &evidence).await
    }

    /// An earlier send that recorded no outcome (or awaits confirmation),
    /// unless the drill retries blindly: an unrepeatable receiver goes to
    /// an operator, an idempotent one is asked. `Some` when that settled
    /// the delivery.
    async fn settle_doubt(
        &self,
        db: &mut Db,
        previous: Option<DeliveryState>,
        attempts: i32,
    ) -> Result<Option<()>> {
        if !matches!(
            previous,
            Some(DeliveryState::Sending | DeliveryState::Accepted)
        ) || self.cfg.drills.blind_retries
        {
            return Ok(None);
        }
        // An earlier send recorded no outcome (or awaits confirmation).
        match kind(self.row) {
            ReceiverKind::Unrepeatable => {
                let why = format!(
                    "attempt {attempts} began at {} by {} and recorded no outcome: the message may have been delivered, and this receiver can neither deduplicate nor be asked",
                    self.row.send_started_at.as_deref().unwrap_or("?"),
                    self.row.claimed_by.as_deref().unwrap_or("?"),
                );
                self.record(db, Report::NeedsAttention, &why)
                    .await
                    .map(Some)
            }
            ReceiverKind::Idempotent => self.reconcile(db, attempts).await,
        }
    }

    /// The drills that stop a dispatcher right after a send.
    fn drills_after_send(&self) {
        let id = self.row.id;
        if self.cfg.drills.crash_after_send {
            emit(
                "crashing",
                json!({"dispatcher": self.cfg.name, "after": "send"}),
            );
            std::process::abort();
        }
        if self.cfg.drills.pause_after_send {
            emit(
                "paused",
                json!({"dispatcher": self.cfg.name, "delivery": id}),
            );
            crate::worker::stop_self();
            emit(
                "resumed",
                json!({"dispatcher": self.cfg.name, "delivery": id}),
            );
        }
    }

    /// What a send's result makes of the delivery, and the evidence.
    async fn judge(&self, sent: Sent, attempts: i32) -> (Report, String) {
        match sent {
            Sent::Delivered(e) => (Report::Delivered, e),
            Sent::Accepted(e) => (self.accepted(), e),
            Sent::Refused(e) => (Report::Failed, e),
            Sent::NeverArrived(e) => self.retry_or_fail(attempts, e),
            Sent::Unknown(e) => match (kind(self.row), self.cfg.drills.blind_retries) {
                (_, true) => self.retry_or_fail(attempts, e),
                (ReceiverKind::Unrepeatable, false) => (
                    Report::NeedsAttention,
                    format!(
                        "outcome unknown ({e}); this receiver can neither deduplicate nor be asked"
                    ),
                ),
                (ReceiverKind::Idempotent, false) => {
                    let why = format!("outcome unknown ({e})");
                    match self.ask(attempts, &why).await {
                        Some(settled) => settled,
                        None => self.retry_or_fail(
                            attempts,
                            format!("{why}; the receiver never saw the key"),
                        ),
                    }
                }
            },
        }
    }

    /// For an idempotent receiver whose earlier send is in doubt: its
    /// status. `Some` when that settled the delivery; `None` to send again
    /// with the same key.
    async fn reconcile(&self, db: &mut Db, attempts: i32) -> Result<Option<()>> {
        match self.ask(attempts, "an unrecorded send").await {
            Some((report, evidence)) => {
                self.record(db, report, &evidence).await?;
                Ok(Some(()))
            }
            None => Ok(None),
        }
    }

    /// Asks the webhook whether the key was applied, after `why` left the
    /// outcome in doubt: what to record, or `None` if it never saw the key.
    async fn ask(&self, attempts: i32, why: &str) -> Option<(Report, String)> {
        let status = webhook::status(
            self.http,
            &self.row.recipient,
            &self.row.operation,
            self.cfg.send_timeout,
        )
        .await;
        match status {
            webhook::Status::Applied(s) => {
                Some((Report::Delivered, format!("{why}; status query: {s}")))
            }
            webhook::Status::Accepted(s) => {
                Some((self.accepted(), format!("{why}; status query: {s}")))
            }
            webhook::Status::NotApplied => None,
            webhook::Status::Unreachable(s) => {
                Some(self.retry_or_fail(attempts, format!("{why}; status query failed: {s}")))
            }
        }
    }

    /// Accepted, to be asked again after the confirmation wait.
    fn accepted(&self) -> Report {
        Report::Accepted {
            check_after_ms: self.cfg.confirm_wait.as_millis() as u64,
        }
    }

    fn retry_or_fail(&self, attempts: i32, evidence: String) -> (Report, String) {
        if attempts >= self.cfg.max_attempts as i32 {
            (
                Report::Failed,
                format!("gave up after {attempts} attempts; last: {evidence}"),
            )
        } else {
            let after = retry_after(self.cfg, attempts);
            (
                Report::Retry {
                    after_ms: after.as_millis() as u64,
                },
                evidence,
            )
        }
    }

    async fn send(&self, payload: Vec<u8>) -> Sent {
        let timeout = self.cfg.send_timeout;
        match kind(self.row) {
            ReceiverKind::Idempotent => {
                let key = (!self.cfg.drills.blind_retries).then_some(self.row.operation.as_str());
                webhook::send(self.http, &self.row.recipient, key, payload, timeout).await
            }
            ReceiverKind::Unrepeatable => {
                let Some(relay) = &self.cfg.smtp else {
                    return Sent::NeverArrived(
                        "no SMTP relay configured (--smtp HOST:PORT)".into(),
                    );
                };
                let mail: serde_json::Value = match serde_json::from_slice(&payload) {
                    Ok(v) => v,
                    Err(e) => return Sent::Refused(format!("the payload is not an email: {e}")),
                };
                let text = |k: &str| {
                    mail.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                let (subject, body) = (text("subject"), text("body"));
                let m = smtp::Mail {
                    from: &self.cfg.smtp_from,
                    to: &self.row.recipient,
                    subject: &subject,
                    body: &body,
                    operation: &self.row.operation,
                };
                smtp::send(relay, &m, timeout).await
            }
        }
    }

    async fn record(&self, db: &mut Db, report: Report, evidence: &str) -> Result<()> {
        let step = db
            .outbox()
            .record(self.row.id, self.token, report, evidence)
            .await?;
        match step.outcome {
            StepOutcome::Recorded => self.said(
                "recorded",
                json!({"outcome": report.label(), "evidence": evidence}),
            ),
            other => self.said(
                "outcome_refused",
                json!({"outcome": report.label(), "why": other.label(), "claim_token": step.claim_token}),
            ),
        }
        Ok(())
    }
}
