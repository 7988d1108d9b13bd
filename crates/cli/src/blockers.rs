//! What the command line says about a refused acquire's blockers: every
//! requested resource in the way, one clause each in text (in `status`'s
//! style), and `blocked_by` and `blockers` with `--json`.

use baton_client::{Blocker, NotAcquired};
use serde::Serialize;

/// What blocked a refused acquire, when the server said: the first
/// blocker in request order, its first holder's details flattened in.
#[derive(Serialize)]
pub struct BlockedBy {
    resource: Option<String>,
    holder_token: Option<u64>,
    holder: Option<String>,
    held_s: Option<u64>,
    held_since_recovery: bool,
    remaining_ms: Option<u64>,
    session_bound: bool,
    n_holders: u64,
    n_waiters_ahead: u64,
    readable: bool,
}

impl BlockedBy {
    /// What a server before 2026-12-05 lets us say: one blocker, by token.
    pub(crate) fn clause(&self) -> String {
        let holder = self.holder_token.map_or("waiters ahead".to_string(), |t| {
            format!("held by token {t}")
        });
        format!("{} is {holder}", self.resource.clone().unwrap_or_default())
    }

    pub(crate) fn new(n: &NotAcquired) -> Self {
        let first = n.blockers.first();
        let holder = first.and_then(|b| b.holders.first());
        Self {
            resource: n.resource.clone(),
            holder_token: n.holder_token.map(|t| t.get()),
            holder: holder.and_then(|h| h.holder.clone()),
            held_s: holder.and_then(|h| h.held_for).map(|d| d.as_secs()),
            held_since_recovery: holder.is_some_and(|h| h.held_since_recovery),
            remaining_ms: holder
                .and_then(|h| h.remaining)
                .map(|d| d.as_millis() as u64),
            session_bound: holder.is_some_and(|h| h.session_bound),
            n_holders: first.map_or(0, |b| b.n_holders),
            n_waiters_ahead: first.map_or(0, |b| b.n_waiters_ahead),
            readable: first.is_some_and(|b| b.readable),
        }
    }
}

/// One requested resource that blocked a refused acquire.
#[derive(Serialize)]
pub struct BlockerOut {
    resource: String,
    readable: bool,
    holders: Vec<HolderOut>,
    n_holders: u64,
    n_waiters_ahead: u64,
}

/// One holder of a blocking resource (details only where readable).
#[derive(Serialize)]
pub struct HolderOut {
    token: u64,
    holder: Option<String>,
    held_s: Option<u64>,
    held_since_recovery: bool,
    remaining_ms: Option<u64>,
    session_bound: bool,
}

impl From<&Blocker> for BlockerOut {
    fn from(b: &Blocker) -> Self {
        Self {
            resource: b.resource.clone(),
            readable: b.readable,
            holders: b
                .holders
                .iter()
                .map(|h| HolderOut {
                    token: h.token.get(),
                    holder: h.holder.clone(),
                    held_s: h.held_for.map(|d| d.as_secs()),
                    held_since_recovery: h.held_since_recovery,
                    remaining_ms: h.remaining.map(|d| d.as_millis() as u64),
                    session_bound: h.session_bound,
                })
                .collect(),
            n_holders: b.n_holders,
            n_waiters_ahead: b.n_waiters_ahead,
        }
    }
}

impl BlockerOut {
    /// One clause, in `status`'s style: `NAME held token=T holder="D"
    /// for=12s remaining=3000ms waiters_ahead=2` (`for>=` when held since a
    /// restart or takeover, `remaining=session` when tied to a session;
    /// only the token where the caller may not read).
    pub(crate) fn clause(&self) -> String {
        let mut out = self.resource.clone();
        if !self.holders.is_empty() {
            out.push_str(" held ");
            let holders: Vec<String> = self.holders.iter().map(HolderOut::clause).collect();
            out.push_str(&holders.join(", "));
            let more = self.n_holders.saturating_sub(self.holders.len() as u64);
            if more > 0 {
                out.push_str(&format!(" (and {more} more)"));
            }
        }
        out.push_str(&format!(" waiters_ahead={}", self.n_waiters_ahead));
        out
    }
}

impl HolderOut {
    fn clause(&self) -> String {
        let mut out = format!("token={}", self.token);
        if let Some(h) = &self.holder {
            out.push_str(&format!(" holder={h:?}"));
        }
        if let Some(s) = self.held_s {
            let at_least = if self.held_since_recovery { ">" } else { "" };
            out.push_str(&format!(" for{at_least}={s}s"));
        }
        match (self.remaining_ms, self.session_bound) {
            (Some(ms), _) => out.push_str(&format!(" remaining={ms}ms")),
            (None, true) => out.push_str(" remaining=session"),
            (None, false) => {}
        }
        out
    }
}
