//! The worker's history of publish attempts: written in one place, read in
//! one place, next to the checker that consumes it.
//!
//! A worker appends `invoke` before it sends a publish and `ok`, `failed` or
//! `unknown` after, one `write` per line to an append-only file, so a
//! SIGKILL leaves at worst an `invoke` without an answer, which reads as
//! unknown.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checker::{Observed, Status};

/// Where an attempt stands in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// About to send the publish.
    Invoke,
    /// Acknowledged: applied or replayed.
    Ok,
    /// Refused (the outcome says why).
    Failed,
    /// Sent, no answer: it may or may not have happened.
    Unknown,
}

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The fenced resource.
    pub resource: String,
    /// The operation id.
    pub operation: String,
    /// The token presented.
    pub token: i64,
    /// Where the attempt stands.
    pub status: Step,
    /// The fence kit's outcome label (`stale`, ...), or empty.
    pub outcome: String,
}

/// Appends `line` to the history at `path` in one write.
pub fn append(path: &Path, line: &Line) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Every history in a directory, reduced to what the checker needs.
#[derive(Debug, Default)]
pub struct Histories {
    /// The last status of each (resource, operation).
    pub observed: Vec<Observed>,
    /// Attempts the resource refused as stale.
    pub stale_rejected: u64,
    /// Publish attempts (invocations).
    pub attempts: u64,
}

/// Reads every history file in `dir`. A line that does not parse is an
/// error: one write per line means a crash cannot cut one short.
pub fn read_dir(dir: &Path) -> std::io::Result<Histories> {
    let mut last: BTreeMap<(String, String), Observed> = BTreeMap::new();
    let mut out = Histories::default();
    let named = |path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    for entry in std::fs::read_dir(dir).map_err(|e| named(dir, e))? {
        let path = entry.map_err(|e| named(dir, e))?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| named(&path, e))?;
        for raw in text.lines() {
            let line: Line = serde_json::from_str(raw).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: unreadable history line {raw:?}: {e}", path.display()),
                )
            })?;
            let status = match line.status {
                Step::Invoke => {
                    out.attempts += 1;
                    Status::Unknown
                }
                Step::Ok => Status::Ok,
                Step::Failed => {
                    out.stale_rejected += u64::from(line.outcome == "stale");
                    Status::Failed
                }
                Step::Unknown => Status::Unknown,
            };
            let key = (line.resource.clone(), line.operation.clone());
            last.insert(
                key,
                Observed {
                    resource: line.resource,
                    operation: line.operation,
                    token: line.token,
                    status,
                },
            );
        }
    }
    out.observed = last.into_values().collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invoke_without_an_answer_reads_as_unknown_and_stale_refusals_are_counted() {
        let dir = std::env::temp_dir().join(format!("baton-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("w0.jsonl");
        let line = |op: &str, token, status, outcome: &str| Line {
            resource: "r".into(),
            operation: op.into(),
            token,
            status,
            outcome: outcome.into(),
        };
        append(&file, &line("a", 5, Step::Invoke, "")).unwrap();
        append(&file, &line("a", 5, Step::Failed, "stale")).unwrap();
        append(&file, &line("b", 6, Step::Invoke, "")).unwrap();
        let h = read_dir(&dir).unwrap();
        assert_eq!((h.attempts, h.stale_rejected), (2, 1));
        let statuses: Vec<_> = h
            .observed
            .iter()
            .map(|o| (o.operation.as_str(), o.status))
            .collect();
        assert_eq!(statuses, [("a", Status::Failed), ("b", Status::Unknown)]);
        std::fs::write(dir.join("w1.jsonl"), "{\"resource\":\n").unwrap();
        assert!(read_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("unreadable history line"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
