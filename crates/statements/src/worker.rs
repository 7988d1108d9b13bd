//! One worker: poll for open jobs, take the statement's lease, read a defined
//! input version, generate, upload an immutable candidate, publish it through
//! the fence kit, complete the job. Recovery first: finish the bookkeeping of
//! a statement already published for this input, or reuse a validated
//! candidate, before generating anything new.
//!
//! [`Attempt::run`] reads as the seed's steps: begin, recover the published
//! result, reuse or regenerate the candidate, publish fenced, settle the
//! outcome. Every step that has an effect asks the keeper first.

use std::path::PathBuf;
use std::time::Duration;

use baton_client::worker::{Backoff, Guard, Keeper, KeeperConfig};
use baton_client::{Acquired, Client};
use baton_faults::history::Step;
use baton_fence::objects::{Manifest, ObjectKit, Provenance};
use baton_fence::{FenceRequest, Outcome, ResourceKey, Token};
use serde_json::json;
use tokio::time::Instant;

use crate::events::emit;
use crate::store::{self, Db, Input, JobState, Result, Target};

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
    pub target: Target,
    pub objects: PathBuf,
    pub server: String,
    pub name: String,
    pub ttl: Duration,
    pub once: bool,
    pub poll: Duration,
    /// Only jobs of accounts starting with this ("" for all).
    pub accounts: String,
    /// Append every publish attempt here: invoked, then ok, failed or
    /// unknown (the history the fault suite's checker reads).
    pub history: Option<PathBuf>,
    pub drills: Drills,
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

/// Appends one line to the publish history (`baton_faults::history`). A line
/// reaches the kernel before the call returns, so it survives a SIGKILL of
/// this process.
fn record(
    cfg: &WorkerConfig,
    resource: &str,
    operation: &str,
    token: Token,
    status: Step,
    outcome: &str,
) {
    let Some(path) = &cfg.history else { return };
    let line = baton_faults::history::Line {
        resource: resource.into(),
        operation: operation.into(),
        token: token.get(),
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
fn chaos_pause(cfg: &WorkerConfig, resource: &str, token: Token) -> bool {
    let d = &cfg.drills;
    if d.pause_chance_pct == 0 {
        return false;
    }
    let h = crate::rng::hash(d.chaos_seed, cfg.name.bytes().chain(resource.bytes()));
    crate::rng::Rng::new(h ^ token.get() as u64).below(100) < u64::from(d.pause_chance_pct)
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
    let token = Token::new(lease.token.get()).map_err(|e| e.to_string())?;
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
    let _ = c.release(&lease.resource, &lease.acquisition_id).await;
    result
}

/// One owner's attempt at one statement, under one lease.
struct Attempt<'a> {
    cfg: &'a WorkerConfig,
    kit: &'a ObjectKit,
    account: &'a str,
    date: &'a str,
    resource: String,
    token: Token,
    guard: Guard,
}

/// Where the attempt ended before publishing.
enum Stop {
    /// Nothing to do (cancelled or already published), or ownership was lost.
    Done,
}

impl Attempt<'_> {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    async fn run(&self, db: &mut Db) -> Result<()> {
        let Some(input) = self.begin(db).await? else {
            return Ok(());
        };
        let snap = snapshot(self.account, self.date, &input);
        if self.recover_published(db, &snap).await? {
            return Ok(());
        }
        let (object_key, manifest) = match self.reuse_or_generate(db, &snap, &input).await? {
            Ok(candidate) => candidate,
            Err(Stop::Done) => return Ok(()),
        };
        if let Err(Stop::Done) = self.before_publish(db).await? {
            return Ok(());
        }
        if self.cfg.drills.unfenced {
            return self.publish_unfenced(db, &object_key).await;
        }
        match self.publish_fenced(db, &object_key, &manifest).await? {
            Some(outcome) => self.settle(db, outcome, &object_key).await,
            None => Ok(()),
        }
    }

    /// Marks the job generating and reads its input; `None` if the job is
    /// final or ownership was lost after reading.
    async fn begin(&self, db: &Db) -> Result<Option<Input>> {
        let (name, token) = (self.name(), self.token.get());
        let job = db
            .job(self.account, self.date)
            .await?
            .ok_or("job vanished")?;
        if job.state.is_final() {
            emit("skipped", json!({"worker": name, "state": job.state}));
            return Ok(None);
        }
        let detail = format!("{name} generating");
        db.set_state(
            self.account,
            self.date,
            JobState::Generating,
            token,
            &detail,
        )
        .await?;
        let input = db
            .input(self.account, self.date)
            .await?
            .ok_or("no account data for the job")?;
        let snap = snapshot(self.account, self.date, &input);
        emit(
            "read_input",
            json!({"worker": name, "token": token, "input": snap}),
        );
        if self.cfg.drills.pause_after_read {
            emit("paused", json!({"worker": name, "token": token}));
            stop_self();
            emit("resumed", json!({"worker": name, "token": token}));
        }
        // Every step below has an effect (even bookkeeping): check ownership first.
        if !self.guard.may_start_effect() {
            self.lost(db, "after reading input").await?;
            return Ok(None);
        }
        Ok(Some(input))
    }

    /// Recovery: the statement may already be published for this input;
    /// then only the bookkeeping is left. True if it was.
    async fn recover_published(&self, db: &mut Db, snap: &str) -> Result<bool> {
        let key = ResourceKey::new(&self.resource).map_err(|e| e.to_string())?;
        let Some(p) = db.publication(&key).await? else {
            return Ok(false);
        };
        let valid = self
            .kit
            .validate(&p.object_key, Some(snap), Some(GENERATOR))
            .await
            .map_err(|e| e.to_string())?
            .is_ok();
        if !valid {
            return Ok(false);
        }
        let name = self.name();
        let detail = format!("bookkeeping completed by {name}");
        db.set_state(
            self.account,
            self.date,
            JobState::Published,
            p.token.get(),
            &detail,
        )
        .await?;
        db.record_outcome(
            name,
            self.account,
            self.date,
            self.token.get(),
            "bookkeeping",
            &p.object_key,
        )
        .await?;
        emit(
            "completed_bookkeeping",
            json!({"worker": name, "published_token": p.token.get(), "key": p.object_key}),
        );
        Ok(true)
    }

    /// Recovery: reuse a validated candidate made from this input, newest
    /// first; otherwise generate and upload a new one.
    async fn reuse_or_generate(
        &self,
        db: &Db,
        snap: &str,
        input: &Input,
    ) -> Result<std::result::Result<(String, Manifest), Stop>> {
        if let Some(candidate) = self.reusable_candidate(snap).await? {
            return Ok(Ok(candidate));
        }
        if !self.guard.may_start_effect() {
            self.lost(db, "before upload").await?;
            return Ok(Err(Stop::Done));
        }
        let op = format!(
            "generate:{}:{}:t{}",
            self.account,
            self.date,
            self.token.get()
        );
        let provenance = Provenance {
            input_snapshot: snap,
            generator_version: GENERATOR,
            operation: &op,
            resource: &self.resource,
        };
        let body = render(self.account, self.date, input);
        let path = object_path(self.account, self.date);
        let c = self
            .kit
            .put_candidate(&path, self.token, "txt", body, &provenance)
            .await
            .map_err(|e| e.to_string())?;
        emit(
            "uploaded",
            json!({"worker": self.name(), "token": self.token.get(), "key": c.key}),
        );
        Ok(Ok((c.key, c.manifest)))
    }

    async fn reusable_candidate(&self, snap: &str) -> Result<Option<(String, Manifest)>> {
        let path = object_path(self.account, self.date);
        let candidates = self.kit.list(&path).await.map_err(|e| e.to_string())?;
        for candidate in candidates.into_iter().rev() {
            let checked = self
                .kit
                .validate(&candidate, Some(snap), Some(GENERATOR))
                .await
                .map_err(|e| e.to_string())?;
            match checked {
                Ok(manifest) => {
                    emit(
                        "reuse_candidate",
                        json!({"worker": self.name(), "key": candidate}),
                    );
                    return Ok(Some((candidate, manifest)));
                }
                Err(why) => emit(
                    "candidate_rejected",
                    json!({"worker": self.name(), "key": candidate, "why": why.to_string()}),
                ),
            }
        }
        Ok(None)
    }

    /// The crash and pause drills, and the last local ownership check.
    async fn before_publish(&self, db: &Db) -> Result<std::result::Result<(), Stop>> {
        let (name, token) = (self.name(), self.token.get());
        if self.cfg.drills.crash_after == Some(CrashPoint::Upload) {
            emit("crashing", json!({"worker": name, "after": "upload"}));
            std::process::abort();
        }
        if !self.guard.may_start_effect() {
            self.lost(db, "before publish").await?;
            return Ok(Err(Stop::Done));
        }
        if self.cfg.drills.pause_before_publish || chaos_pause(self.cfg, &self.resource, self.token)
        {
            emit(
                "paused",
                json!({"worker": name, "token": token, "resource": self.resource}),
            );
            stop_self();
            emit("resumed", json!({"worker": name, "token": token}));
        }
        Ok(Ok(()))
    }

    fn publish_operation(&self) -> String {
        format!(
            "publish:{}:{}:t{}",
            self.account,
            self.date,
            self.token.get()
        )
    }

    /// The negative control: a blind pointer write.
    async fn publish_unfenced(&self, db: &Db, object_key: &str) -> Result<()> {
        let (cfg, op) = (self.cfg, self.publish_operation());
        record(cfg, &self.resource, &op, self.token, Step::Invoke, "");
        if let Err(e) = db
            .publish_unfenced(&self.resource, self.token.get(), &op, object_key)
            .await
        {
            record(cfg, &self.resource, &op, self.token, Step::Unknown, &e);
            return Err(e);
        }
        record(
            cfg,
            &self.resource,
            &op,
            self.token,
            Step::Ok,
            "applied_unfenced",
        );
        db.record_outcome(
            self.name(),
            self.account,
            self.date,
            self.token.get(),
            "applied_unfenced",
            object_key,
        )
        .await?;
        self.finish(db, object_key).await
    }

    /// The fenced publish. A publish sent without an answer may have
    /// committed: it is retried once with the same operation id, and a
    /// replay returns the saved result. `None` when the request was refused
    /// as invalid (the job needs attention).
    async fn publish_fenced(
        &self,
        db: &mut Db,
        object_key: &str,
        manifest: &Manifest,
    ) -> Result<Option<Outcome>> {
        let (cfg, op) = (self.cfg, self.publish_operation());
        let fingerprint = hex_bytes(&manifest.sha256_hex);
        let req = FenceRequest::new(
            &self.resource,
            self.token.get() as u64,
            &op,
            &fingerprint,
            object_key.as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        let mut retried = false;
        loop {
            record(cfg, &self.resource, &op, self.token, Step::Invoke, "");
            match db.publish(self.kit, &req).await {
                Ok(Ok(outcome)) => {
                    let status = match outcome {
                        Outcome::Applied { .. } | Outcome::Replayed { .. } => Step::Ok,
                        _ => Step::Failed,
                    };
                    record(
                        cfg,
                        &self.resource,
                        &op,
                        self.token,
                        status,
                        outcome.label(),
                    );
                    return Ok(Some(outcome));
                }
                Ok(Err(invalid)) => {
                    record(
                        cfg,
                        &self.resource,
                        &op,
                        self.token,
                        Step::Failed,
                        "invalid",
                    );
                    let why = invalid.to_string();
                    db.set_state(
                        self.account,
                        self.date,
                        JobState::NeedsAttention,
                        self.token.get(),
                        &why,
                    )
                    .await?;
                    emit(
                        "needs_attention",
                        json!({"worker": self.name(), "why": why}),
                    );
                    return Ok(None);
                }
                Err(e) => {
                    record(cfg, &self.resource, &op, self.token, Step::Unknown, &e);
                    emit(
                        "publish_unknown",
                        json!({"worker": self.name(), "token": self.token.get(), "why": e}),
                    );
                    if retried || !self.guard.may_start_effect() {
                        return Err(e);
                    }
                    retried = true;
                    *db = store::open(&cfg.target).await?;
                }
            }
        }
    }

    /// Records the outcome; a publication completes the job, a refusal is
    /// said and, unless it is the ordinary stale or cancelled case, flagged.
    async fn settle(&self, db: &Db, outcome: Outcome, object_key: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token.get());
        let detail = format!("{outcome:?}");
        db.record_outcome(
            name,
            self.account,
            self.date,
            token,
            outcome.label(),
            &detail,
        )
        .await?;
        match outcome {
            Outcome::Applied { .. } | Outcome::Replayed { .. } => {
                self.finish(db, object_key).await?
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
                db.set_state(
                    self.account,
                    self.date,
                    JobState::NeedsAttention,
                    token,
                    &detail,
                )
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
    async fn finish(&self, db: &Db, object_key: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token.get());
        emit(
            "published",
            json!({"worker": name, "token": token, "key": object_key}),
        );
        if self.cfg.drills.crash_after == Some(CrashPoint::Publish) {
            emit("crashing", json!({"worker": name, "after": "publish"}));
            std::process::abort();
        }
        let detail = format!("published by {name}");
        db.set_state(self.account, self.date, JobState::Published, token, &detail)
            .await?;
        emit("completed", json!({"worker": name, "token": token}));
        Ok(())
    }

    async fn lost(&self, db: &Db, when: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token.get());
        db.record_outcome(name, self.account, self.date, token, "lease_lost", when)
            .await?;
        emit(
            "lease_lost",
            json!({"worker": name, "token": token, "when": when}),
        );
        Ok(())
    }
}
