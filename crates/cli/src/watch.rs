//! `baton watch PREFIX`: the snapshot's number, the holders now, then every
//! change, one line each, resumed across restarts and failovers.

use baton_client::{WatchEvent, WatchHolder, WatchUpdate};
use serde::Serialize;

use crate::args::ClientOpts;
use crate::error::{CliError, Exit};
use crate::lease::connect;
use crate::output::{emit, Rendered};

/// One line: a holder of the snapshot (`held`) or a change.
#[derive(Serialize)]
pub struct WatchLine {
    seq: u64,
    kind: &'static str,
    resource: String,
    token: u64,
    revoked_token: Option<u64>,
    holder: Option<String>,
}

impl Rendered for WatchLine {
    fn text(&self) -> String {
        let revoked = self
            .revoked_token
            .map_or(String::new(), |t| format!(" revoked_token={t}"));
        format!(
            "{} {} {} token={}{revoked}{}",
            self.seq,
            self.kind,
            self.resource,
            self.token,
            crate::lease::holder_text(self.holder.as_deref())
        )
    }
}

fn held(seq: u64, h: &WatchHolder) -> WatchLine {
    WatchLine {
        seq,
        kind: "held",
        resource: h.resource.clone(),
        token: h.token.get(),
        revoked_token: None,
        holder: h.holder.clone(),
    }
}

fn changed(e: WatchEvent) -> WatchLine {
    WatchLine {
        seq: e.seq,
        kind: e.kind.as_str(),
        resource: e.resource,
        token: e.token.get(),
        revoked_token: e.revoked.map(|t| t.get()),
        holder: e.holder,
    }
}

/// The line before a snapshot's holders, with its number, so that a
/// script can resume (`--after-seq`) from a snapshot with no holder too.
#[derive(Serialize)]
struct SnapshotLine {
    seq: u64,
    kind: &'static str,
    prefix: String,
    n_holders: usize,
}

impl Rendered for SnapshotLine {
    fn text(&self) -> String {
        let (noun, verb) = match self.n_holders {
            1 => ("holder", "follows"),
            _ => ("holders", "follow"),
        };
        format!(
            "{} snapshot {:?}: {} {noun} {verb}",
            self.seq, self.prefix, self.n_holders
        )
    }
}

/// The line before a new snapshot's holders: the watch resumed after the
/// server had dropped the changes since its last line.
#[derive(Serialize)]
struct ResnapshotLine {
    seq: u64,
    kind: &'static str,
    prefix: String,
}

impl Rendered for ResnapshotLine {
    fn text(&self) -> String {
        format!(
            "{} resnapshot {:?}: away longer than the server keeps changes; the holders now follow (what changed in between is not known)",
            self.seq, self.prefix
        )
    }
}

/// Prints until SIGINT (exit 0), resuming after the last number printed;
/// with `once`, until the end of the stream (exit 1, saying why).
pub async fn watch(
    opts: &ClientOpts,
    prefix: &str,
    (after_seq, once): (Option<u64>, bool),
) -> Result<Exit, CliError> {
    let client = connect(opts).await?;
    let mut watch = match after_seq {
        Some(after) => client.watch_after(prefix, after).await?,
        None => client.watch(prefix).await?,
    };
    if once {
        watch = watch.once();
    }
    // Before the first line: a script that reads it may interrupt at once.
    let mut stop = crate::signals::Stop::on_interrupt()?;
    if after_seq.is_none() {
        let line = SnapshotLine {
            seq: watch.seq,
            kind: "snapshot",
            prefix: prefix.to_string(),
            n_holders: watch.holders.len(),
        };
        emit(opts.json, &line);
    }
    for h in &watch.holders {
        emit(opts.json, &held(watch.seq, h));
    }
    loop {
        tokio::select! {
            _ = stop.received() => return Ok(Exit::Ok),
            next = watch.next() => match next {
                Ok(WatchUpdate::Changed(event)) => {
                    emit(opts.json, &changed(event));
                }
                Ok(WatchUpdate::Resnapshot { seq, holders }) => {
                    let line = ResnapshotLine { seq, kind: "resnapshot", prefix: prefix.to_string() };
                    emit(opts.json, &line);
                    for h in &holders {
                        emit(opts.json, &held(seq, h));
                    }
                }
                Ok(_) => {}
                Err(baton_client::ClientError::WatchEnded(why)) => {
                    return Err(CliError::failure(format!("the server ended the watch: {why}")))
                }
                Err(e) => return Err(e.into()),
            },
        }
    }
}
