//! `baton watch PREFIX`: the holders now, then every change, one line each.

use baton_client::{WatchEvent, WatchHolder};
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

/// Prints until SIGINT (exit 0) or the end of the stream (exit 1, saying
/// why: watch again).
pub async fn watch(opts: &ClientOpts, prefix: &str) -> Result<Exit, CliError> {
    let client = connect(opts).await?;
    let mut watch = client.watch(prefix).await?;
    // Before the first line: a script that reads it may interrupt at once.
    let mut stop = crate::signals::Stop::on_interrupt()?;
    for h in &watch.holders {
        emit(opts.json, &held(watch.seq, h));
    }
    loop {
        tokio::select! {
            _ = stop.received() => return Ok(Exit::Ok),
            next = watch.next() => match next? {
                Some(event) => {
                    emit(opts.json, &changed(event));
                }
                None => return Err(CliError::failure("the server ended the watch")),
            },
        }
    }
}
