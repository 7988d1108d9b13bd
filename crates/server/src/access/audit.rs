//! The audit log: one structured line per fence, backup and refused call
//! (and per restore, written by `baton admin restore`), so an incident can
//! answer "who fenced this?".
//!
//! Lines go to the tracing target `baton::audit` (filter it with
//! `RUST_LOG`), and, with `--audit-log FILE`, also to that file as JSON
//! lines, appended and flushed one by one. Tokens never appear: only the
//! principal's name.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use tracing::{info, warn};

/// One audited event.
#[derive(Debug, serde::Serialize)]
pub struct Record<'a> {
    /// The principal's name, `anonymous` with auth off, `unauthenticated`
    /// when no principal was proven.
    pub principal: &'a str,
    /// The call, as `Action::as_str` names it: `acquire`, `fence`, ...
    pub action: &'a str,
    /// The resource (or prefix) the call named, if any.
    pub resource: &'a str,
    /// The fencing token the call issued or revoked, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// `ok`, `permission_denied`, `unauthenticated` or `failed`.
    pub outcome: &'a str,
    /// The peer's address.
    pub peer: &'a str,
}

/// Where audit lines go.
#[derive(Debug, Default)]
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
}

impl Audit {
    /// Audit lines to the log only.
    pub fn log_only() -> Self {
        Self::default()
    }

    /// Audit lines to the log and appended to `path`.
    pub fn to_file(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Some(Mutex::new(file)),
        })
    }

    /// Writes one record as a JSON line to stderr (and the file), for
    /// commands that run without the server's log (`baton admin restore`).
    pub fn record_to_stderr(&self, r: &Record<'_>) {
        eprintln!("audit: {}", serde_json::to_string(r).unwrap_or_default());
        self.append(r);
    }

    fn append(&self, r: &Record<'_>) {
        if let Some(file) = &self.file {
            let mut line = serde_json::to_vec(r).unwrap_or_default();
            line.push(b'\n');
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = f.write_all(&line) {
                warn!(error = %e, "cannot write the audit log");
            }
        }
    }

    /// Writes one record.
    pub fn record(&self, r: &Record<'_>) {
        info!(
            target: "baton::audit",
            principal = r.principal,
            action = r.action,
            resource = r.resource,
            token = r.token,
            outcome = r.outcome,
            peer = r.peer,
            "audit"
        );
        self.append(r);
    }
}
