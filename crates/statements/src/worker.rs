//! One worker: poll for open jobs, take the statement's lease, read a defined
//! input version, generate, upload an immutable candidate, publish it through
//! the fence kit, complete the job. Recovery first: finish the bookkeeping of
//! a statement already published for this input, or reuse a validated
//! candidate, before generating anything new.
//!
//! [`Attempt::run`] reads as the seed's steps: begin, recover the published
//! result, reuse or regenerate the candidate, publish fenced, settle the
//! outcome. Every step that has an effect asks the keeper first.

use std::time::Duration;

use baton_client::worker::{Backoff, Keeper, KeeperConfig};
use baton_client::{Acquired, Client};
use baton_fence::objects::ObjectKit;
use baton_fence::outbox::{Intent, ReceiverKind};
use baton_fence::FencingToken;
use serde_json::json;
use tracing::Instrument;

use crate::events::emit;
use crate::store::{self, Db, Input, Location, Result};

mod attempt;

use attempt::Attempt;

pub const GENERATOR: &str = "statements/1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CrashPoint {
    /// After the candidate is uploaded, before it is published.
    Upload,
    /// After the publication commits, before the job is completed.
    Publish,
}

/// The fault suite's hooks into the worker, in one place. All off in
/// production; the drills and `statements chaos` switch them on.
#[derive(Clone, Debug, Default)]
pub struct Drills {
    /// Stop this process with SIGSTOP after the last local ownership check,
    /// just before the publish: the race a lease alone cannot close.
    pub pause_before_publish: bool,
    /// Stop this process with SIGSTOP right after it read its input.
    pub pause_after_read: bool,
    /// Abort the process at this point.
    pub crash_after: Option<CrashPoint>,
    /// Negative control: move the pointer with no fence at all.
    pub unfenced: bool,
    /// Stop with SIGSTOP just before publishing on this share (percent) of
    /// attempts, chosen by `chaos_seed`, the resource and the token.
    pub pause_chance_pct: u32,
    pub chaos_seed: u64,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub target: Location,
    /// A directory or `s3://BUCKET/PREFIX` (see `--objects`).
    pub objects: String,
    pub server: String,
    pub name: String,
    pub ttl: Duration,
    pub once: bool,
    pub poll: Duration,
    /// Only jobs of accounts starting with this ("" for all).
    pub accounts: String,
    #[cfg(feature = "chaos")]
    /// Append every publish attempt here: invoked, then ok, failed or
    /// unknown (the history the fault suite's checker reads).
    pub history: Option<std::path::PathBuf>,
    /// Who hears of each publication: delivery intents recorded with it.
    pub notify: Notify,
    pub drills: Drills,
}

/// The external effects of a publication, sent later by `statements dispatch`.
#[derive(Clone, Debug, Default)]
pub struct Notify {
    /// An HTTP webhook that honours `Idempotency-Key` and answers status queries.
    pub webhook: Option<String>,
    /// An email address, sent by SMTP (a receiver that can neither
    /// deduplicate nor be asked).
    pub email: Option<String>,
}

impl Notify {
    /// The intents of one publication. Each operation id is derived from
    /// the publication's, so a replay of the publish gives the same ids.
    pub fn intents(
        &self,
        publish_operation: &str,
        account: &str,
        date: &str,
        token: FencingToken,
        object_key: &str,
    ) -> Result<Vec<Intent>> {
        let mut out = Vec::new();
        if let Some(url) = &self.webhook {
            let body = json!({
                "event": "statement.published",
                "account": account,
                "date": date,
                "token": token.get(),
                "object_key": object_key,
                "operation": format!("{publish_operation}/webhook"),
            });
            out.push(Intent::new(
                &format!("{publish_operation}/webhook"),
                ReceiverKind::Idempotent,
                url,
                body.to_string().into_bytes(),
            )?);
        }
        if let Some(address) = &self.email {
            let mail = json!({
                "subject": format!("Your statement for {date} is ready"),
                "body": format!("Account {account}: your statement for {date} is published as {object_key}.\n"),
                "operation": format!("{publish_operation}/email"),
            });
            out.push(Intent::new(
                &format!("{publish_operation}/email"),
                ReceiverKind::Unrepeatable,
                address,
                mail.to_string().into_bytes(),
            )?);
        }
        Ok(out)
    }
}

pub fn resource(account: &str, date: &str) -> String {
    format!("statement:{account}:{date}")
}

pub fn object_path(account: &str, date: &str) -> String {
    format!("statements/{account}/{date}")
}

pub fn snapshot(account: &str, date: &str, input: &Input) -> String {
    format!("{account}:{date}@v{}", input.version)
}

/// The statement document: a deterministic function of the input.
pub fn render(account: &str, date: &str, input: &Input) -> Vec<u8> {
    let b = input.balance_cents;
    format!(
        "STATEMENT\naccount: {account}\ndate: {date}\ninput version: {}\nclosing balance: {}{}.{:02}\ngenerator: {GENERATOR}\n",
        input.version,
        if b < 0 { "-" } else { "" },
        b.abs() / 100,
        b.abs() % 100
    )
    .into_bytes()
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

pub(crate) fn stop_self() {
    // A real SIGSTOP, delivered by the kernel like any other pause.
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
}

/// Runs the worker. With `once`, the first error ends it; otherwise a
/// worker outlives its errors (a server restart, a lost database connection):
/// it says so, backs off with jitter, reconnects and carries on.
pub async fn run(cfg: WorkerConfig) -> Result<()> {
    crate::events::outlive_errors("worker", &cfg.name, cfg.once, async |backoff| {
        session(&cfg, backoff).await
    })
    .await
}

async fn session(cfg: &WorkerConfig, backoff: &mut Backoff) -> Result<()> {
    let client = Client::connect(&cfg.server).await?;
    let kit = ObjectKit::open(&cfg.objects).await?;
    let mut db = store::open(&cfg.target).await?;
    loop {
        let jobs = db.open_jobs(&cfg.accounts).await?;
        let mut left = Vec::new();
        for (account, date) in &jobs {
            // One trace per job when traces are exported: the acquire, the
            // server's grant, the renewals and the fenced write under it.
            let span = tracing::debug_span!(
                target: baton_telemetry::TRACE_TARGET,
                "publish statement",
                worker = %cfg.name,
                account = %account,
                date = %date,
            );
            let held = process(cfg, &client, &kit, &mut db, account, date)
                .instrument(span)
                .await?;
            left.extend(held);
        }
        backoff.reset();
        if cfg.once {
            if jobs.is_empty() {
                eprintln!("worker {}: no open jobs; nothing to do", cfg.name);
            }
            if !left.is_empty() {
                return Err(LeftToOthers(left).into());
            }
            return Ok(());
        }
        tokio::time::sleep(cfg.poll).await;
    }
}

/// A step of a publish attempt, as the fault suite's history records it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// About to send the publish.
    Invoke,
    /// Acknowledged: applied or replayed.
    Ok,
    /// Refused (the outcome says why).
    Failed,
    /// Sent, no answer: it may or may not have happened.
    Unknown,
}

/// Appends one line to the publish history (`baton_faults::history`). A line
/// reaches the kernel before the call returns, so it survives a SIGKILL of
/// this process. Only a build with the fault suite (feature `chaos`) has a
/// history to write.
#[cfg(feature = "chaos")]
fn record(
    cfg: &WorkerConfig,
    resource: &str,
    operation: &str,
    token: FencingToken,
    status: Step,
    outcome: &str,
) {
    let Some(path) = &cfg.history else { return };
    use baton_faults::history::Step as Written;
    let status = match status {
        Step::Invoke => Written::Invoke,
        Step::Ok => Written::Ok,
        Step::Failed => Written::Failed,
        Step::Unknown => Written::Unknown,
    };
    let line = baton_faults::history::Line {
        resource: resource.into(),
        operation: operation.into(),
        token: token.bigint(),
        status,
        outcome: outcome.into(),
    };
    if let Err(e) = baton_faults::history::append(path, &line) {
        // A history with holes would let the checker miss a violation.
        eprintln!("cannot append to the history {}: {e}", path.display());
        std::process::abort();
    }
}

#[cfg(not(feature = "chaos"))]
fn record(_: &WorkerConfig, _: &str, _: &str, _: FencingToken, _: Step, _: &str) {}

/// Whether a chaos run pauses this attempt: a pure function of the seed,
/// the worker, the resource and the token.
fn chaos_pause(cfg: &WorkerConfig, resource: &str, token: FencingToken) -> bool {
    let d = &cfg.drills;
    if d.pause_chance_pct == 0 {
        return false;
    }
    let h = baton_client::rng::hash(d.chaos_seed, cfg.name.bytes().chain(resource.bytes()));
    baton_client::rng::Rng::new(h ^ token.get()).below(100) < u64::from(d.pause_chance_pct)
}

/// Publishes one job under its lease; `Some(what)` when another worker
/// holds the lease (the job is left to it).
async fn process(
    cfg: &WorkerConfig,
    client: &Client,
    kit: &ObjectKit,
    db: &mut Db,
    account: &str,
    date: &str,
) -> Result<Option<String>> {
    let resource = resource(account, date);
    // The lease is tied to the client's session: its heartbeat keeps it.
    let session = client.session(cfg.ttl).await?;
    let lease = match session.acquire(&resource, Duration::ZERO).await? {
        Acquired::Granted(lease) => lease,
        Acquired::NotAcquired(n) => {
            let token = n
                .holder_token
                .map_or("waiters".into(), |t| format!("token {t}"));
            return Ok(Some(format!("{resource} (held: {token})")));
        }
    };
    let keeper = Keeper::start(session.clone(), lease.clone(), KeeperConfig::default());
    let token = lease.token;
    emit(
        "acquired",
        json!({"worker": cfg.name, "resource": resource, "token": token.get()}),
    );
    let attempt = Attempt {
        cfg,
        kit,
        account,
        date,
        resource,
        token,
        guard: keeper.guard(),
    };
    let result = attempt.run(db).await;
    let lease = keeper.stop();
    // Best effort: a lost release only delays the next worker by one TTL.
    let _ = session
        .release(&lease.resource, &lease.acquisition_id)
        .await;
    result.map(|()| None)
}

/// A `--once` pass that left jobs to other workers: their leases were held
/// (exit code 4). Each entry names the job's resource and its holder.
#[derive(Debug, thiserror::Error)]
#[error("left {} job(s) to other workers, their leases held elsewhere: {}; this worker published none of them", .0.len(), .0.join(", "))]
pub(crate) struct LeftToOthers(pub(crate) Vec<String>);
