//! `baton admin`: backup of a running server, restore of a stopped one.

use std::path::Path;

use serde::Serialize;

use crate::args::{ClientOpts, RestoreArgs};
use crate::error::CliError;
use crate::lease::connect;
use crate::output::Rendered;
use baton_restore as restore;

/// What `admin backup` prints.
#[derive(Serialize)]
pub struct BackupOut {
    path: String,
    epoch: u32,
    counter: u64,
    n_leases: usize,
}

impl Rendered for BackupOut {
    fn text(&self) -> String {
        format!(
            "backup written to {}: epoch {} counter {} leases {}",
            self.path, self.epoch, self.counter, self.n_leases
        )
    }
}

/// Writes `bytes` to `out` durably: a temporary file, fsync, rename.
fn write_durably(out: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = out.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, out)
}

/// `baton admin backup`.
pub async fn backup(opts: &ClientOpts, out: &Path) -> Result<BackupOut, CliError> {
    use prost::Message;
    let mut client = connect(opts).await?;
    let snapshot = client.backup().await?;
    write_durably(out, &snapshot.encode_to_vec())
        .map_err(|e| CliError::failure(format!("cannot write {}: {e}", out.display())))?;
    Ok(BackupOut {
        path: out.display().to_string(),
        epoch: snapshot.epoch,
        counter: snapshot.counter,
        n_leases: snapshot.stored_leases.len(),
    })
}

/// What `admin restore` prints.
#[derive(Serialize)]
pub struct RestoreOut {
    backup_epoch: u32,
    resources_floor: u64,
    epoch: u32,
    first_token: u64,
    dropped_leases: usize,
    #[serde(skip)]
    data_dir: String,
}

impl Rendered for RestoreOut {
    fn text(&self) -> String {
        let floor = match self.resources_floor {
            0 => String::new(),
            t => format!("; resources recorded up to token {t}"),
        };
        let backup = match self.backup_epoch {
            0 => "no backup".to_string(),
            e => format!("backup epoch {e}"),
        };
        format!(
            "restored into {}: new epoch {} ({backup}{floor}); every new token is at least {}; {} leases were dropped (holders acquire again)",
            self.data_dir, self.epoch, self.first_token, self.dropped_leases
        )
    }
}

/// `baton admin restore`: reads the floors, then restores.
pub async fn restore(a: &RestoreArgs) -> Result<RestoreOut, CliError> {
    let to_cli = |e: restore::RestoreError| CliError {
        code: if e.is_usage() {
            crate::error::Exit::Usage
        } else {
            crate::error::Exit::Failure
        },
        message: e.to_string(),
    };
    let mut resources_floor = None;
    for url in &a.floor_from {
        resources_floor = resources_floor.max(restore::resources_floor(url).await.map_err(to_cli)?);
    }
    let now_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let r = match &a.store {
        Some(url) => {
            restore::restore_cluster(
                a.from.as_deref(),
                url,
                &a.cluster,
                a.min_epoch,
                resources_floor,
                now_unix_s,
            )
            .await
        }
        None => restore::restore(
            a.from.as_deref(),
            &a.data_dir,
            a.min_epoch,
            resources_floor,
            now_unix_s,
        ),
    }
    .map_err(to_cli);
    let target = match &a.store {
        Some(_) => format!("cluster {}", a.cluster),
        None => a.data_dir.display().to_string(),
    };
    audit_restore(a, &target, r.as_ref().ok().map(|r| r.first_token.get()))?;
    let r = r?;
    if let Some(e) = &r.unread_directory {
        eprintln!("warning: {e}; restoring above --min-epoch / --floor-from instead");
    }
    Ok(RestoreOut {
        backup_epoch: r.backup_epoch.map_or(0, |e| e.get()),
        resources_floor: r.resources_floor.map_or(0, |t| t.get()),
        epoch: r.epoch.get(),
        first_token: r.first_token.get(),
        dropped_leases: r.dropped_leases,
        data_dir: match &a.store {
            Some(_) => format!("cluster {} (PostgreSQL store)", a.cluster),
            None => a.data_dir.display().to_string(),
        },
    })
}

/// The restore's audit line: who (the operating-system user), what, the
/// first token of the new epoch, and whether it worked.
fn audit_restore(a: &RestoreArgs, target: &str, first_token: Option<u64>) -> Result<(), CliError> {
    let audit = match &a.audit_log {
        Some(path) => baton_server::Audit::to_file(path)
            .map_err(|e| CliError::usage(format!("--audit-log {}: {e}", path.display())))?,
        None => baton_server::Audit::log_only(),
    };
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    audit.record_to_stderr(&baton_server::AuditRecord {
        principal: &format!("os-user:{user}"),
        action: "restore",
        resource: target,
        token: first_token,
        outcome: if first_token.is_some() {
            "ok"
        } else {
            "failed"
        },
        peer: "local",
    });
    Ok(())
}
