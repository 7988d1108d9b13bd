//! The verdict: the checker over the workers' histories and the publication
//! log, and the run's report as text or one JSON object.

use std::collections::BTreeMap;
use std::path::Path;

use baton_faults::checker::{self, Accepted, Verdict};
use serde::Serialize;

use crate::service::ServiceDb;

/// The checker's verdict on one run, with the counts around it.
pub struct Checked {
    pub verdict: Verdict,
    pub stale_rejected: u64,
    pub attempts: u64,
    pub accepted: usize,
    /// Resources whose pointer moved more than once: allowed (each move had a
    /// higher token), but a sign that an owner's publish outlived its lease.
    pub republished: usize,
}

/// The checker's figures, as `statements check` and the chaos report print them.
#[derive(Serialize)]
pub struct Figures {
    pub publish_attempts: u64,
    pub publications_accepted: usize,
    pub resources_published_more_than_once: usize,
    pub stale_rejected: u64,
    pub stale_overwrites: usize,
    pub doubled_operations: usize,
    pub lost_publications: usize,
    pub pointer_regressions: usize,
    pub verdict: &'static str,
}

impl Checked {
    /// The checker's figures.
    pub fn figures(&self) -> Figures {
        let v = &self.verdict;
        Figures {
            publish_attempts: self.attempts,
            publications_accepted: self.accepted,
            resources_published_more_than_once: self.republished,
            stale_rejected: self.stale_rejected,
            stale_overwrites: v.stale_overwrites.len(),
            doubled_operations: v.doubled_operations.len(),
            lost_publications: v.lost_publications.len(),
            pointer_regressions: v.pointer_regressions.len(),
            verdict: self.verdict_word(),
        }
    }

    pub fn verdict_word(&self) -> &'static str {
        if self.verdict.is_clean() {
            "clean"
        } else {
            "violations"
        }
    }
}

/// Checks the histories in `history` against the publication log and the
/// pointers of the statements of accounts starting with `prefix`.
pub async fn check(db: &dyn ServiceDb, history: &Path, prefix: &str) -> anyhow::Result<Checked> {
    let resource_prefix = format!("statement:{prefix}");
    let histories = baton_faults::history::read_dir(history)?;
    let accepted: Vec<Accepted> = db
        .publication_log(&resource_prefix)
        .await
        .map_err(|e| anyhow::anyhow!("reading the publication log: {e}"))?;
    let pointers: BTreeMap<String, i64> = db
        .pointers(&resource_prefix)
        .await
        .map_err(|e| anyhow::anyhow!("reading the pointers: {e}"))?
        .into_iter()
        .collect();
    let verdict = checker::check(
        &histories.observed,
        &accepted,
        &pointers,
        checker::PerGeneration::One,
    );
    let mut per_resource: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &accepted {
        *per_resource.entry(a.resource.as_str()).or_default() += 1;
    }
    Ok(Checked {
        stale_rejected: histories.stale_rejected,
        attempts: histories.attempts,
        accepted: accepted.len(),
        republished: per_resource.values().filter(|n| **n > 1).count(),
        verdict,
    })
}

/// One accepted write that broke the order.
#[derive(Serialize)]
pub struct Example {
    pub resource: String,
    pub operation: String,
    pub token: i64,
}

/// The chaos run's report: `--json` prints it as one object.
#[derive(Serialize)]
pub struct Report {
    pub seed: u64,
    pub schedule: String,
    pub negative_control: bool,
    pub backend: &'static str,
    pub workers: usize,
    pub duration_s: u64,
    pub ttl_ms: u64,
    pub faults: BTreeMap<&'static str, u64>,
    pub proxy: BTreeMap<&'static str, u64>,
    pub jobs_seeded: u64,
    pub jobs: BTreeMap<String, i64>,
    pub open_jobs_at_end: i64,
    pub stale_overwrite_examples: Vec<Example>,
    pub files: String,
    pub accounts: String,
    #[serde(flatten)]
    pub figures: Figures,
    #[serde(skip)]
    pub examples_text: Vec<String>,
    /// The service's external effects, when it has any on this backend.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<crate::DeliveryFigures>,
}

impl Report {
    /// Fills in the checker's side of the report.
    pub fn with_verdict(mut self, checked: &Checked) -> Self {
        let v = &checked.verdict;
        self.stale_overwrite_examples = v
            .stale_overwrites
            .iter()
            .take(5)
            .map(|a| Example {
                resource: a.resource.clone(),
                operation: a.operation.clone(),
                token: a.token,
            })
            .collect();
        self.examples_text = v
            .stale_overwrites
            .iter()
            .take(5)
            .map(|a| {
                format!(
                    "  stale overwrite: {} {} token {}",
                    a.resource, a.operation, a.token
                )
            })
            .chain(
                v.doubled_operations
                    .iter()
                    .take(5)
                    .map(|o| format!("  doubled: {o}")),
            )
            .chain(
                v.lost_publications
                    .iter()
                    .take(5)
                    .map(|o| format!("  lost: {} {}", o.resource, o.operation)),
            )
            .collect();
        self.figures = checked.figures();
        if let Some(d) = &self.deliveries {
            if self.figures.verdict == "clean"
                && (d.duplicate_deliveries > 0 || d.lost_deliveries > 0)
            {
                self.figures.verdict = "deliveries duplicated or lost";
            }
        }
        self
    }

    /// The report for people.
    pub fn text(&self) -> String {
        let f = &self.figures;
        let mut out = String::new();
        if self.negative_control {
            out += "NEGATIVE CONTROL (fencing off at the resource)\n";
        }
        out += &format!(
            "seed {} (rerun with --seed {})\nfaults fired:\n",
            self.seed, self.seed
        );
        for (k, n) in &self.faults {
            out += &format!("  {k:<26} {n}\n");
        }
        out += "proxy:\n";
        for (k, n) in &self.proxy {
            out += &format!("  {k:<26} {n}\n");
        }
        let jobs: Vec<String> = self.jobs.iter().map(|(s, n)| format!("{s} {n}")).collect();
        out += &format!(
            "jobs: {} seeded, {} still open at the end; {}\n",
            self.jobs_seeded,
            self.open_jobs_at_end,
            jobs.join(", ")
        );
        out += &format!(
            "publish attempts: {}, accepted: {}, stale attempts rejected at the resource: {}\n",
            f.publish_attempts, f.publications_accepted, f.stale_rejected
        );
        out += &format!(
            "checker: {} stale overwrites, {} doubled operations, {} lost publications, {} pointer regressions\n",
            f.stale_overwrites, f.doubled_operations, f.lost_publications, f.pointer_regressions
        );
        if let Some(d) = &self.deliveries {
            out += &format!(
                "deliveries: {} recorded, {} delivered, {} need attention, {} failed, {} unsettled; {} duplicate, {} lost; receiver faults {:?}\n",
                d.deliveries, d.delivered, d.needs_attention, d.failed, d.unsettled,
                d.duplicate_deliveries, d.lost_deliveries, d.receiver_faults
            );
        }
        for line in &self.examples_text {
            out += line;
            out += "\n";
        }
        out += &format!("verdict: {}", f.verdict);
        if f.verdict != "clean" {
            out += &format!(
                " (files kept in {}, accounts {})",
                self.files, self.accounts
            );
        }
        out
    }
}
