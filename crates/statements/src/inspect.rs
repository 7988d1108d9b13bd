//! The seed's incident procedure as a command: "compare the workflow
//! record, publication pointer and operation outcome without deciding
//! which worker's log feels more convincing". `statements inspect` puts
//! side by side the durable job record, the publication pointer and its
//! manifest, every recorded operation outcome with its token, and the
//! lease server's current state for the resource, then states in one line
//! which generation is authoritative and why ([`verdict`], a pure
//! function of what was gathered).

use baton_fence::objects::ObjectKit;
use baton_fence::{resource_name, FencingToken};
use serde::Serialize;

use crate::args::Paths;
use crate::store::{self, JobState};
use crate::{worker, NoSuchJob};

/// One recorded attempt's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    pub worker: String,
    pub token: i64,
    pub outcome: String,
    pub detail: String,
}

/// The lease server's view of the resource, or why it could not be had.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LeaseView {
    /// Not asked (`statements show`).
    NotAsked,
    /// The server did not answer.
    Unreachable { error: String },
    Held {
        token: u64,
        holder: Option<String>,
        remaining_ms: u64,
        waiters: u64,
        issued_through: Option<u64>,
    },
    Free {
        waiters: u64,
        issued_through: Option<u64>,
    },
    /// Held by shared holders, or by permits of a semaphore of `permits`
    /// (docs/locks.md): every one, by slot.
    HeldBySlots {
        permits: Option<u32>,
        holders: Vec<SlotView>,
        waiters: u64,
        issued_through: Option<u64>,
    },
}

/// One shared holder or permit of the resource.
#[derive(Clone, Debug, Serialize)]
pub struct SlotView {
    slot: u32,
    token: u64,
    holder: Option<String>,
    remaining_ms: u64,
}

impl LeaseView {
    fn issued_through(&self) -> Option<u64> {
        match self {
            LeaseView::Held { issued_through, .. }
            | LeaseView::Free { issued_through, .. }
            | LeaseView::HeldBySlots { issued_through, .. } => *issued_through,
            _ => None,
        }
    }
}

/// Everything the procedure compares, for one statement.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    pub account: String,
    pub date: String,
    pub resource: String,
    pub job_state: JobState,
    pub job_token: i64,
    pub job_detail: Option<String>,
    pub input_version: i64,
    /// The resource's floor: the highest token it accepted (or cancelled at).
    pub generation: u64,
    pub cancelled_at: u64,
    pub published_token: u64,
    pub published_key: String,
    pub published_operation: String,
    pub manifest_input: String,
    pub manifest_sha256: String,
    pub manifest_size_bytes: u64,
    pub manifest_generator: String,
    pub manifest_operation: String,
    /// `valid`, `no publication`, or why the object fails validation.
    pub object: String,
    pub outcomes: Vec<Attempt>,
    /// The outbox's deliveries caused by this statement's publication.
    pub deliveries: Vec<baton_fence::outbox::Delivery>,
    pub lease: LeaseView,
    pub verdict: Verdict,
}

/// The one-line conclusion, and the facts it rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The generation (token) whose publication is authoritative, if any.
    pub authoritative_token: Option<u64>,
    /// A stored token above the last one the lease server issued: the
    /// lease server's state is older than the resource's.
    pub recovery_mismatch: bool,
    /// Attempts refused at the resource for presenting an old token.
    pub stale_attempts: usize,
    pub line: String,
}

/// The facts [`verdict`] judges.
#[derive(Clone, Debug, Default)]
pub struct Facts<'a> {
    pub job_state: Option<JobState>,
    pub generation: u64,
    pub cancelled_at: u64,
    pub published_token: u64,
    pub object: &'a str,
    pub outcomes: &'a [Attempt],
    pub issued_through: Option<u64>,
}

/// Which generation is authoritative and why, in one line. The pointer is
/// authoritative because only a fenced write with a token at or above the
/// resource's floor moves it; logs and job states are not.
pub fn verdict(f: &Facts<'_>) -> Verdict {
    let stale_attempts = f.outcomes.iter().filter(|a| a.outcome == "stale").count();
    let highest_stored = f
        .outcomes
        .iter()
        .map(|a| a.token.max(0) as u64)
        .chain([f.generation, f.published_token, f.cancelled_at])
        .max()
        .unwrap_or(0);
    let authoritative_token = (f.published_token > 0).then_some(f.published_token);
    if let Some(issued) = f.issued_through {
        if highest_stored > issued {
            return Verdict {
                authoritative_token,
                recovery_mismatch: true,
                stale_attempts,
                line: format!(
                    "RECOVERY MISMATCH: the resource stored token {highest_stored}, above the last token the lease server issued ({issued}); the lease server's state is older than the resource's, so its next grants would be refused or, worse, could collide: stop workers and restore it with `baton admin restore --floor-from` before granting"
                ),
            };
        }
    }
    let refused = match stale_attempts {
        0 => String::new(),
        1 => "; 1 stale attempt was refused at the resource".into(),
        n => format!("; {n} stale attempts were refused at the resource"),
    };
    let object = if f.object == "valid" || f.published_token == 0 {
        String::new()
    } else {
        format!("; but its object fails validation: {}", f.object)
    };
    let line = match (f.job_state, authoritative_token) {
        (Some(JobState::Cancelled), Some(t)) => format!(
            "generation {t} is authoritative (published before the cancel); the job is cancelled at {}, so every token at or below it is refused{refused}{object}",
            f.cancelled_at
        ),
        (Some(JobState::Cancelled), None) => format!(
            "nothing is published: the job is cancelled at {}, every token at or below it is refused{refused}",
            f.cancelled_at
        ),
        (_, Some(t)) => format!(
            "generation {t} is authoritative: the publication pointer names it, and only a fenced write at or above the resource's floor ({}) moves it{refused}{object}",
            f.generation
        ),
        (state, None) => format!(
            "nothing is published yet (job {}){refused}",
            state.map_or("missing", JobState::as_str)
        ),
    };
    Verdict {
        authoritative_token,
        recovery_mismatch: false,
        stale_attempts,
        line,
    }
}

/// Gathers the records of one statement; asks the lease server at
/// `server` for the resource's state unless it is `None`.
pub async fn gather(
    paths: &Paths,
    account: &str,
    date: &str,
    server: Option<&str>,
) -> anyhow::Result<Inspection> {
    let mut db = store::open_existing(&paths.target()).await?;
    let kit = ObjectKit::open_existing(&paths.objects)?;
    let job = db
        .job(account, date)
        .await?
        .ok_or_else(|| NoSuchJob(format!("no job for {account} {date}")))?;
    let input = db.input(account, date).await?;
    let resource = worker::resource(account, date);
    let key = resource_name(&resource)?;
    let state = db.fence_state(&key).await?;
    let pointer = db.publication(&key).await?;
    let manifest = match &pointer {
        Some(p) => Some(kit.validate(&p.object_key, None, None).await?),
        None => None,
    };
    let (outcomes, deliveries) = worker_records(&mut db, account, date, &resource).await?;
    let lease = match server {
        None => LeaseView::NotAsked,
        Some(url) => lease_view(url, &resource).await,
    };
    let generation = state.as_ref().map_or(0, |s| s.generation.get());
    let cancelled_at = state.as_ref().and_then(|s| s.cancelled_at);
    let cancelled_at = cancelled_at.map_or(0, FencingToken::get);
    let published_token = pointer.as_ref().map_or(0, |p| p.token.get());
    let (manifest, object) = object_state(manifest);
    let verdict = verdict(&Facts {
        job_state: Some(job.state),
        generation,
        cancelled_at,
        published_token,
        object: &object,
        outcomes: &outcomes,
        issued_through: lease.issued_through(),
    });
    let m = manifest.as_ref();
    Ok(Inspection {
        account: account.to_string(),
        date: date.to_string(),
        resource,
        job_state: job.state,
        job_token: job.token.unwrap_or(0),
        job_detail: job.detail,
        input_version: input.as_ref().map_or(0, |i| i.version),
        generation,
        cancelled_at,
        published_token,
        published_key: pointer
            .as_ref()
            .map_or(String::new(), |p| p.object_key.clone()),
        published_operation: pointer
            .as_ref()
            .map_or(String::new(), |p| p.operation.clone()),
        manifest_input: m.map_or(String::new(), |m| m.input_snapshot.clone()),
        manifest_sha256: m.map_or(String::new(), |m| m.sha256_hex.clone()),
        manifest_size_bytes: m.map_or(0, |m| m.size_bytes),
        manifest_generator: m.map_or(String::new(), |m| m.generator_version.clone()),
        manifest_operation: m.map_or(String::new(), |m| m.operation.clone()),
        object,
        outcomes,
        deliveries,
        lease,
        verdict,
    })
}

/// What the workers recorded for a statement, and its deliveries.
async fn worker_records(
    db: &mut store::Db,
    account: &str,
    date: &str,
    resource: &str,
) -> anyhow::Result<(Vec<Attempt>, Vec<baton_fence::outbox::Delivery>)> {
    let outcomes: Vec<Attempt> = db
        .outcomes(account, date)
        .await?
        .into_iter()
        .map(|(worker, token, outcome, detail)| Attempt {
            worker,
            token,
            outcome,
            detail,
        })
        .collect();
    let deliveries = db
        .outbox()
        .list(&baton_fence::outbox::Filter {
            resource_prefix: resource.to_string(),
            ..Default::default()
        })
        .await?
        .into_iter()
        .filter(|d| d.resource == resource)
        .collect();
    Ok((outcomes, deliveries))
}

/// The published object's manifest, if valid, and what to say of it.
fn object_state<E: std::fmt::Display>(
    manifest: Option<Result<baton_fence::objects::Manifest, E>>,
) -> (Option<baton_fence::objects::Manifest>, String) {
    match manifest {
        Some(Ok(m)) => (Some(m), "valid".to_string()),
        Some(Err(why)) => (None, why.to_string()),
        None => (None, "no publication".to_string()),
    }
}

async fn lease_view(url: &str, resource: &str) -> LeaseView {
    let status = async {
        let mut client = baton_client::Client::connect(url).await?;
        client.status(resource).await
    };
    match status.await {
        Err(e) => LeaseView::Unreachable {
            error: e.to_string(),
        },
        Ok(s) => {
            let issued_through = s.issued_through.map(|t| t.get());
            match s.holder_token {
                Some(t) => LeaseView::Held {
                    token: t.get(),
                    holder: s.holder,
                    remaining_ms: s.remaining.as_millis() as u64,
                    waiters: s.n_waiters,
                    issued_through,
                },
                None if !s.slots.is_empty() => LeaseView::HeldBySlots {
                    permits: s.permits,
                    holders: s
                        .slots
                        .into_iter()
                        .map(|h| SlotView {
                            slot: h.slot,
                            token: h.token.get(),
                            holder: h.holder,
                            remaining_ms: h.remaining.as_millis() as u64,
                        })
                        .collect(),
                    waiters: s.n_waiters,
                    issued_through,
                },
                None => LeaseView::Free {
                    waiters: s.n_waiters,
                    issued_through,
                },
            }
        }
    }
}

impl Inspection {
    /// The side-by-side text, verdict last.
    pub fn text(&self) -> String {
        let job = match (self.job_token, self.job_detail.as_deref()) {
            (0, None) => String::new(),
            (0, Some(d)) => format!(" ({d})"),
            (t, None) => format!(" (token {t})"),
            (t, Some(d)) => format!(" (token {t}, {d})"),
        };
        let cancelled = if self.cancelled_at > 0 {
            format!(", cancelled at {}", self.cancelled_at)
        } else {
            String::new()
        };
        let publication = if self.published_key.is_empty() {
            "none".to_string()
        } else {
            format!(
                "{} (token {}, operation {})",
                self.published_key, self.published_token, self.published_operation
            )
        };
        let manifest = if self.manifest_sha256.is_empty() {
            String::new()
        } else {
            format!(
                " (input {}, sha256 {}, {} bytes, generator {}, operation {})",
                self.manifest_input,
                self.manifest_sha256,
                self.manifest_size_bytes,
                self.manifest_generator,
                self.manifest_operation
            )
        };
        let mut out = format!(
            "statement {} {}\n  job:          {}{job}\n  input:        version {}\n  resource:     generation {}{cancelled}\n  publication:  {publication}\n  object:       {}{manifest}\n",
            self.account,
            self.date,
            self.job_state.as_str(),
            self.input_version,
            self.generation,
            self.object,
        );
        out.push_str(&self.lease.line());
        out.push_str("  deliveries:\n");
        if self.deliveries.is_empty() {
            out.push_str("    none recorded\n");
        }
        for d in &self.deliveries {
            out.push_str(&format!("  {}\n", crate::deliveries::line(d)));
        }
        out.push_str("  outcomes:\n");
        if self.outcomes.is_empty() {
            out.push_str("    none recorded\n");
        }
        for a in &self.outcomes {
            out.push_str(&format!(
                "    {:<8} token {:<16} {:<12} {}\n",
                a.worker, a.token, a.outcome, a.detail
            ));
        }
        if !matches!(self.lease, LeaseView::NotAsked) {
            out.push_str(&format!("verdict: {}\n", self.verdict.line));
        }
        out.trim_end().to_string()
    }
}

impl LeaseView {
    /// The lease's line of the text report (empty when not asked).
    fn line(&self) -> String {
        match self {
            LeaseView::NotAsked => String::new(),
            LeaseView::Unreachable { error } => format!("  lease:        unknown: {error}\n"),
            LeaseView::Held {
                token,
                holder,
                remaining_ms,
                waiters,
                issued_through,
            } => format!(
                "  lease:        held by token {token}{} for {:.1} s more, {waiters} waiting; last token issued {}\n",
                holder.as_deref().map_or(String::new(), |h| format!(" ({h})")),
                *remaining_ms as f64 / 1000.0,
                issued_through.map_or("unknown".into(), |t| t.to_string()),
            ),
            LeaseView::Free {
                waiters,
                issued_through,
            } => format!(
                "  lease:        free, {waiters} waiting; last token issued {}\n",
                issued_through.map_or("unknown".into(), |t| t.to_string()),
            ),
            LeaseView::HeldBySlots {
                permits,
                holders,
                waiters,
                issued_through,
            } => {
                let how = permits.map_or("shared".to_string(), |n| format!("{n} permits"));
                let mut out = format!(
                    "  lease:        held by {} ({how}), {waiters} waiting; last token issued {}\n",
                    holders.len(),
                    issued_through.map_or("unknown".into(), |t| t.to_string()),
                );
                for h in holders {
                    out.push_str(&format!(
                        "                slot {} token {}{} for {:.1} s more\n",
                        h.slot,
                        h.token,
                        h.holder.as_deref().map_or(String::new(), |d| format!(" ({d})")),
                        h.remaining_ms as f64 / 1000.0,
                    ));
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(token: i64, outcome: &str) -> Attempt {
        Attempt {
            worker: "w".into(),
            token,
            outcome: outcome.into(),
            detail: String::new(),
        }
    }

    #[test]
    fn the_pointer_is_authoritative_and_stale_attempts_are_counted() {
        let outcomes = [attempt(5, "published"), attempt(3, "stale")];
        let v = verdict(&Facts {
            job_state: Some(JobState::Published),
            generation: 5,
            published_token: 5,
            object: "valid",
            outcomes: &outcomes,
            issued_through: Some(6),
            ..Facts::default()
        });
        assert_eq!(v.authoritative_token, Some(5));
        assert!(!v.recovery_mismatch);
        assert_eq!(v.stale_attempts, 1);
        assert!(
            v.line.starts_with("generation 5 is authoritative"),
            "{}",
            v.line
        );
        assert!(v.line.contains("1 stale attempt was refused"), "{}", v.line);
    }

    #[test]
    fn a_token_above_what_the_lease_server_issued_is_a_recovery_mismatch() {
        let v = verdict(&Facts {
            job_state: Some(JobState::Published),
            generation: 900,
            published_token: 900,
            object: "valid",
            issued_through: Some(12),
            ..Facts::default()
        });
        assert!(v.recovery_mismatch);
        assert!(v.line.starts_with("RECOVERY MISMATCH"), "{}", v.line);
        assert!(
            v.line.contains("900") && v.line.contains("12"),
            "{}",
            v.line
        );
        let unknown = verdict(&Facts {
            generation: 900,
            issued_through: None,
            ..Facts::default()
        });
        assert!(!unknown.recovery_mismatch, "not judged without the server");
    }

    #[test]
    fn a_cancelled_job_names_its_cancel_point() {
        let v = verdict(&Facts {
            job_state: Some(JobState::Cancelled),
            generation: 9,
            cancelled_at: 9,
            issued_through: Some(9),
            ..Facts::default()
        });
        assert_eq!(v.authoritative_token, None);
        assert!(v.line.contains("cancelled at 9"), "{}", v.line);
    }
}
