//! One owner's attempt at one statement: the seed's steps, in order.

use super::Step;
use baton_client::worker::Guard;
use baton_fence::objects::{Manifest, ObjectKit, Provenance};
use baton_fence::{resource_name, FenceRequest, FencingToken, Outcome};
use serde_json::json;

use super::{
    chaos_pause, hex_bytes, object_path, record, render, snapshot, stop_self, CrashPoint,
    WorkerConfig, GENERATOR,
};
use crate::events::emit;
use crate::store::{self, Db, Input, JobState, Result};

/// One owner's attempt at one statement, under one lease.
pub(super) struct Attempt<'a> {
    pub(super) cfg: &'a WorkerConfig,
    pub(super) kit: &'a ObjectKit,
    pub(super) account: &'a str,
    pub(super) date: &'a str,
    pub(super) resource: String,
    pub(super) token: FencingToken,
    pub(super) guard: Guard,
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

    pub(super) async fn run(&self, db: &mut Db) -> Result<()> {
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
        let (name, token) = (self.name(), self.token);
        let job = db
            .job(self.account, self.date)
            .await?
            .ok_or_else(|| anyhow::anyhow!("job vanished"))?;
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
            .ok_or_else(|| anyhow::anyhow!("no account data for the job"))?;
        let snap = snapshot(self.account, self.date, &input);
        emit(
            "read_input",
            json!({"worker": name, "token": token.get(), "input": snap}),
        );
        if self.cfg.drills.pause_after_read {
            emit("paused", json!({"worker": name, "token": token.get()}));
            stop_self();
            emit("resumed", json!({"worker": name, "token": token.get()}));
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
        let key = resource_name(&self.resource)?;
        let Some(p) = db.publication(&key).await? else {
            return Ok(false);
        };
        let valid = self
            .kit
            .validate(&p.object_key, Some(snap), Some(GENERATOR))
            .await?
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
            p.token,
            &detail,
        )
        .await?;
        db.record_outcome(
            name,
            self.account,
            self.date,
            self.token,
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
            .await?;
        emit(
            "uploaded",
            json!({"worker": self.name(), "token": self.token.get(), "key": c.key}),
        );
        Ok(Ok((c.key, c.manifest)))
    }

    async fn reusable_candidate(&self, snap: &str) -> Result<Option<(String, Manifest)>> {
        let path = object_path(self.account, self.date);
        let candidates = self.kit.list(&path).await?;
        for candidate in candidates.into_iter().rev() {
            let checked = self
                .kit
                .validate(&candidate, Some(snap), Some(GENERATOR))
                .await?;
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
        let (name, token) = (self.name(), self.token);
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
                json!({"worker": name, "token": token.get(), "resource": self.resource}),
            );
            stop_self();
            emit("resumed", json!({"worker": name, "token": token.get()}));
        }
        Ok(Ok(()))
    }

    /// One line of the publish history for operation `op` of this attempt.
    fn record(&self, op: &str, step: Step, outcome: &str) {
        record(self.cfg, &self.resource, op, self.token, step, outcome);
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
        let op = self.publish_operation();
        let intents =
            self.cfg
                .notify
                .intents(&op, self.account, self.date, self.token, object_key)?;
        self.record(&op, Step::Invoke, "");
        if let Err(e) = db
            .publish_unfenced(&self.resource, self.token, &op, object_key, &intents)
            .await
        {
            self.record(&op, Step::Unknown, &format!("{e:#}"));
            return Err(e);
        }
        self.record(&op, Step::Ok, "applied_unfenced");
        db.record_outcome(
            self.name(),
            self.account,
            self.date,
            self.token,
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
        let op = self.publish_operation();
        let fingerprint = hex_bytes(&manifest.sha256_hex);
        let req = FenceRequest::new(
            &self.resource,
            self.token,
            &op,
            &fingerprint,
            object_key.as_bytes(),
        )?;
        let intents =
            self.cfg
                .notify
                .intents(&op, self.account, self.date, self.token, object_key)?;
        let mut retried = false;
        loop {
            self.record(&op, Step::Invoke, "");
            match db.publish(self.kit, &req, &intents).await {
                Ok(Ok(outcome)) => {
                    let status = match outcome {
                        Outcome::Applied { .. } | Outcome::Replayed { .. } => Step::Ok,
                        _ => Step::Failed,
                    };
                    self.record(&op, status, outcome.label());
                    return Ok(Some(outcome));
                }
                Ok(Err(invalid)) => {
                    self.record(&op, Step::Failed, "invalid");
                    self.needs_attention(db, &invalid.to_string()).await?;
                    return Ok(None);
                }
                Err(e) => {
                    self.record(&op, Step::Unknown, &format!("{e:#}"));
                    emit(
                        "publish_unknown",
                        json!({"worker": self.name(), "token": self.token.get(), "why": format!("{e:#}")}),
                    );
                    if retried || !self.guard.may_start_effect() {
                        return Err(e);
                    }
                    retried = true;
                    *db = store::open(&self.cfg.target).await?;
                }
            }
        }
    }

    /// A request the fence kit refused as invalid cannot succeed by retrying.
    async fn needs_attention(&self, db: &Db, why: &str) -> Result<()> {
        db.set_state(
            self.account,
            self.date,
            JobState::NeedsAttention,
            self.token,
            why,
        )
        .await?;
        emit(
            "needs_attention",
            json!({"worker": self.name(), "why": why}),
        );
        Ok(())
    }

    /// Records the outcome; a publication completes the job, a refusal is
    /// said and, unless it is the ordinary stale or cancelled case, flagged.
    async fn settle(&self, db: &Db, outcome: Outcome, object_key: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token);
        let detail = outcome.describe();
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
                    json!({"worker": name, "outcome": other.label(), "token": token.get()}),
                );
            }
        }
        Ok(())
    }

    /// After the pointer moved: the job is done.
    async fn finish(&self, db: &Db, object_key: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token);
        emit(
            "published",
            json!({"worker": name, "token": token.get(), "key": object_key}),
        );
        if self.cfg.drills.crash_after == Some(CrashPoint::Publish) {
            emit("crashing", json!({"worker": name, "after": "publish"}));
            std::process::abort();
        }
        let detail = format!("published by {name}");
        db.set_state(self.account, self.date, JobState::Published, token, &detail)
            .await?;
        emit("completed", json!({"worker": name, "token": token.get()}));
        Ok(())
    }

    async fn lost(&self, db: &Db, when: &str) -> Result<()> {
        let (name, token) = (self.name(), self.token);
        db.record_outcome(name, self.account, self.date, token, "lease_lost", when)
            .await?;
        emit(
            "lease_lost",
            json!({"worker": name, "token": token.get(), "when": when}),
        );
        Ok(())
    }
}
