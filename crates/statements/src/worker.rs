//! One worker: poll for open jobs, take the statement's lease, read a defined
//! input version, generate, upload an immutable candidate, publish it through
//! the fence kit, complete the job. Recovery first: finish the bookkeeping of
//! a statement already published for this input, or reuse a validated
//! candidate, before generating anything new.

use baton_faults::history::Step;
use std::path::PathBuf;
use std::time::Duration;

use baton_client::worker::{Backoff, Guard, Keeper, KeeperConfig};
use baton_client::{Acquired, Client};
use baton_fence::objects::{ObjectKit, Provenance};
use baton_fence::{FenceRequest, Outcome, ResourceKey};
use tokio::time::Instant;

use crate::events::emit;
use crate::store::{self, Db, Input, Result, Target};
use serde_json::json;

pub const GENERATOR: &str = "statements/1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CrashPoint {
    /// After the candidate is uploaded, before it is published.
    Upload,
    /// After the publication commits, before the job is completed.
    Publish,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub target: Target,
    pub objects: PathBuf,
    pub server: String,
    pub name: String,
    pub ttl: Duration,
    pub once: bool,
    pub poll: Duration,
    /// Stop this process with SIGSTOP after the last local ownership check,
    /// just before the publish: the race a lease alone cannot close.
    pub pause_before_publish: bool,
    /// Stop this process with SIGSTOP right after it read its input.
    pub pause_after_read: bool,
    pub crash_after: Option<CrashPoint>,
    /// Only jobs of accounts starting with this ("" for all).
    pub accounts: String,
    /// Append every publish attempt here: invoked, then ok, failed or
    /// unknown (the history the fault suite's checker reads).
    pub history: Option<PathBuf>,
    /// Negative control: move the pointer with no fence at all.
    pub unfenced: bool,
    /// Chaos runs: stop with SIGSTOP just before publishing on this share
    /// (percent) of attempts, chosen by `chaos_seed`, the resource and the token.
    pub pause_chance_pct: u32,
    pub chaos_seed: u64,
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

fn stop_self() {
    // A real SIGSTOP, delivered by the kernel like any other pause.
    let _ = crate::signal::send(std::process::id(), crate::signal::Signal::SIGSTOP);
}

/// Runs the worker. With `once`, the first error ends it; otherwise a
/// worker outlives its errors (a server restart, a lost database connection):
/// it says so, backs off with jitter, reconnects and carries on.
pub async fn run(cfg: WorkerConfig) -> Result<()> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match session(&cfg, &mut backoff).await {
            Ok(()) => return Ok(()),
            Err(e) if cfg.once => return Err(e),
            Err(e) => {
                emit("error", json!({"worker": cfg.name, "why": e}));
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

async fn session(cfg: &WorkerConfig, backoff: &mut Backoff) -> Result<()> {
    let client = Client::connect(&cfg.server)
        .await
        .map_err(|e| e.to_string())?;
    let kit = ObjectKit::local(&cfg.objects).map_err(|e| e.to_string())?;
    let mut db = store::open(&cfg.target).await?;
    loop {
        for (account, date) in db.open_jobs(&cfg.accounts).await? {
            process(cfg, &client, &kit, &mut db, &account, &date).await?;
        }
        backoff.reset();
        if cfg.once {
            return Ok(());
        }
        tokio::time::sleep(cfg.poll).await;
    }
}

/// Appends one line to the publish history (`baton_faults::history`). A line reaches the kernel before the call returns, so it
/// survives a SIGKILL of this process.
fn record(
    cfg: &WorkerConfig,
    resource: &str,
    operation: &str,
    token: i64,
    status: Step,
    outcome: &str,
) {
    let Some(path) = &cfg.history else { return };
    let line = baton_faults::history::Line {
        resource: resource.into(),
        operation: operation.into(),
        token,
        status,
        outcome: outcome.into(),
    };
    if let Err(e) = baton_faults::history::append(path, &line) {
        // A history with holes would let the checker miss a violation.
        eprintln!("cannot append to the history {}: {e}", path.display());
        std::process::abort();
    }
}

/// Whether a chaos run pauses this attempt: a pure function of the seed,
/// the worker, the resource and the token.
fn chaos_pause(cfg: &WorkerConfig, resource: &str, token: i64) -> bool {
    if cfg.pause_chance_pct == 0 {
        return false;
    }
    let h = crate::rng::hash(cfg.chaos_seed, cfg.name.bytes().chain(resource.bytes()));
    crate::rng::Rng::new(h ^ token as u64).below(100) < u64::from(cfg.pause_chance_pct)
}

async fn process(
    cfg: &WorkerConfig,
    client: &Client,
    kit: &ObjectKit,
    db: &mut Db,
    account: &str,
    date: &str,
) -> Result<()> {
    let resource = resource(account, date);
    let mut c = client.clone();
    let sent_at = Instant::now();
    let lease = match c
        .acquire(&resource, cfg.ttl, Duration::ZERO)
        .await
        .map_err(|e| e.to_string())?
    {
        Acquired::Granted(lease) => lease,
        Acquired::NotAcquired(_) => return Ok(()),
    };
    let keeper = Keeper::start(
        client.clone(),
        lease.clone(),
        sent_at,
        KeeperConfig::default(),
    );
    emit(
        "acquired",
        json!({"worker": cfg.name, "resource": resource, "token": lease.token.get() as i64}),
    );
    let result = pipeline(cfg, kit, db, account, date, &keeper.guard()).await;
    let lease = keeper.stop();
    // Best effort: a lost release only delays the next worker by one TTL.
    let _ = c.release(&lease.resource, &lease.acquisition_id).await;
    result
}

async fn pipeline(
    cfg: &WorkerConfig,
    kit: &ObjectKit,
    db: &mut Db,
    account: &str,
    date: &str,
    guard: &Guard,
) -> Result<()> {
    let name = cfg.name.as_str();
    let resource = resource(account, date);
    let token = guard.token().get() as i64;
    let job = db.job(account, date).await?.ok_or("job vanished")?;
    if job.state == "cancelled" || job.state == "published" {
        emit("skipped", json!({"worker": name, "state": job.state}));
        return Ok(());
    }
    db.set_state(
        account,
        date,
        "generating",
        token,
        &format!("{name} generating"),
    )
    .await?;
    let input = db
        .input(account, date)
        .await?
        .ok_or("no account data for the job")?;
    let snap = snapshot(account, date, &input);
    emit(
        "read_input",
        json!({"worker": name, "token": token, "input": snap}),
    );
    if cfg.pause_after_read {
        emit("paused", json!({"worker": name, "token": token}));
        stop_self();
        emit("resumed", json!({"worker": name, "token": token}));
    }
    // Every step below has an effect (even bookkeeping): check ownership first.
    if !guard.may_start_effect() {
        return lost(db, name, account, date, token, "after reading input").await;
    }

    // Recovery: the statement may already be published for this input.
    let key = ResourceKey::new(&resource).map_err(|e| e.to_string())?;
    if let Some(p) = db.publication(&key).await? {
        if kit
            .validate(&p.object_key, Some(&snap), Some(GENERATOR))
            .await
            .map_err(|e| e.to_string())?
            .is_ok()
        {
            db.set_state(
                account,
                date,
                "published",
                p.token.get(),
                &format!("bookkeeping completed by {name}"),
            )
            .await?;
            db.record_outcome(name, account, date, token, "bookkeeping", &p.object_key)
                .await?;
            emit(
                "completed_bookkeeping",
                json!({"worker": name, "published_token": p.token.get(), "key": p.object_key}),
            );
            return Ok(());
        }
    }
    // Recovery: reuse a validated candidate made from this input, newest first.
    let path = object_path(account, date);
    let mut chosen = None;
    for candidate in kit
        .list(&path)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .rev()
    {
        match kit
            .validate(&candidate, Some(&snap), Some(GENERATOR))
            .await
            .map_err(|e| e.to_string())?
        {
            Ok(manifest) => {
                emit("reuse_candidate", json!({"worker": name, "key": candidate}));
                chosen = Some((candidate, manifest));
                break;
            }
            Err(why) => emit(
                "candidate_rejected",
                json!({"worker": name, "key": candidate, "why": why.to_string()}),
            ),
        }
    }
    let (object_key, manifest) = match chosen {
        Some(c) => c,
        None => {
            if !guard.may_start_effect() {
                return lost(db, name, account, date, token, "before upload").await;
            }
            let op = format!("generate:{account}:{date}:t{token}");
            let provenance = Provenance {
                input_snapshot: &snap,
                generator_version: GENERATOR,
                operation: &op,
                resource: &resource,
            };
            let c = kit
                .put_candidate(
                    &path,
                    fence_token(token)?,
                    "txt",
                    render(account, date, &input),
                    &provenance,
                )
                .await
                .map_err(|e| e.to_string())?;
            emit(
                "uploaded",
                json!({"worker": name, "token": token, "key": c.key}),
            );
            (c.key, c.manifest)
        }
    };
    if cfg.crash_after == Some(CrashPoint::Upload) {
        emit("crashing", json!({"worker": name, "after": "upload"}));
        std::process::abort();
    }
    if !guard.may_start_effect() {
        return lost(db, name, account, date, token, "before publish").await;
    }
    if cfg.pause_before_publish || chaos_pause(cfg, &resource, token) {
        emit(
            "paused",
            json!({"worker": name, "token": token, "resource": resource}),
        );
        stop_self();
        emit("resumed", json!({"worker": name, "token": token}));
    }
    let op = format!("publish:{account}:{date}:t{token}");
    if cfg.unfenced {
        record(cfg, &resource, &op, token, Step::Invoke, "");
        if let Err(e) = db
            .publish_unfenced(&resource, token, &op, &object_key)
            .await
        {
            record(cfg, &resource, &op, token, Step::Unknown, &e);
            return Err(e);
        }
        record(cfg, &resource, &op, token, Step::Ok, "applied_unfenced");
        db.record_outcome(name, account, date, token, "applied_unfenced", &object_key)
            .await?;
        return finish(cfg, db, account, date, token, &object_key).await;
    }
    let req = FenceRequest::new(
        &resource,
        token as u64,
        &op,
        &hex_bytes(&manifest.sha256_hex),
        object_key.as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    let mut retried = false;
    let outcome = loop {
        record(cfg, &resource, &op, token, Step::Invoke, "");
        match db.publish(kit, &req).await {
            Ok(Ok(outcome)) => {
                let status = match outcome {
                    Outcome::Applied { .. } | Outcome::Replayed { .. } => Step::Ok,
                    _ => Step::Failed,
                };
                record(cfg, &resource, &op, token, status, outcome.label());
                break outcome;
            }
            Ok(Err(invalid)) => {
                record(cfg, &resource, &op, token, Step::Failed, "invalid");
                db.set_state(
                    account,
                    date,
                    "needs_attention",
                    token,
                    &invalid.to_string(),
                )
                .await?;
                emit(
                    "needs_attention",
                    json!({"worker": name, "why": invalid.to_string()}),
                );
                return Ok(());
            }
            Err(e) => {
                // Sent, no answer: it may have committed. Retry once with the
                // same operation id; a replay returns the saved result.
                record(cfg, &resource, &op, token, Step::Unknown, &e);
                emit(
                    "publish_unknown",
                    json!({"worker": name, "token": token, "why": e}),
                );
                if retried || !guard.may_start_effect() {
                    return Err(e);
                }
                retried = true;
                *db = store::open(&cfg.target).await?;
            }
        }
    };
    let detail = format!("{outcome:?}");
    db.record_outcome(name, account, date, token, outcome.label(), &detail)
        .await?;
    match outcome {
        Outcome::Applied { .. } | Outcome::Replayed { .. } => {
            finish(cfg, db, account, date, token, &object_key).await?;
        }
        Outcome::Stale { presented, current } => emit(
            "publish_refused",
            json!({"worker": name, "outcome": "stale", "token": presented.get(), "current": current.get()}),
        ),
        Outcome::Cancelled {
            presented,
            cancelled_at,
        } => emit(
            "publish_refused",
            json!({"worker": name, "outcome": "cancelled", "token": presented.get(), "current": cancelled_at.get()}),
        ),
        other => {
            db.set_state(account, date, "needs_attention", token, &detail)
                .await?;
            emit(
                "publish_refused",
                json!({"worker": name, "outcome": other.label(), "token": token}),
            );
        }
    }
    Ok(())
}

/// After the pointer moved: the job is done.
async fn finish(
    cfg: &WorkerConfig,
    db: &Db,
    account: &str,
    date: &str,
    token: i64,
    object_key: &str,
) -> Result<()> {
    let name = cfg.name.as_str();
    emit(
        "published",
        json!({"worker": name, "token": token, "key": object_key}),
    );
    if cfg.crash_after == Some(CrashPoint::Publish) {
        emit("crashing", json!({"worker": name, "after": "publish"}));
        std::process::abort();
    }
    db.set_state(
        account,
        date,
        "published",
        token,
        &format!("published by {name}"),
    )
    .await?;
    emit("completed", json!({"worker": name, "token": token}));
    Ok(())
}

fn fence_token(token: i64) -> Result<baton_fence::Token> {
    baton_fence::Token::new(token as u64).map_err(|e| e.to_string())
}

async fn lost(
    db: &Db,
    name: &str,
    account: &str,
    date: &str,
    token: i64,
    when: &str,
) -> Result<()> {
    db.record_outcome(name, account, date, token, "lease_lost", when)
        .await?;
    emit(
        "lease_lost",
        json!({"worker": name, "token": token, "when": when}),
    );
    Ok(())
}
