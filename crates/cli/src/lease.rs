//! The lease commands: acquire, renew, release, status, list, fence. Each
//! calls the client once and returns a [`Rendered`] result.

use std::time::Duration;

use baton_client::{AcquiredAll, Client, Release, Renewal};

use crate::blockers::{BlockedBy, BlockerOut};
use baton_core::{AcquisitionId, Shape};
use serde::Serialize;

use crate::args::{ClientOpts, HolderOpt};
use crate::error::{CliError, Exit};
use crate::output::Rendered;

/// Connects to `--server`, over TLS and with a token if the flags say so.
pub async fn connect(opts: &ClientOpts) -> Result<Client, CliError> {
    Ok(Client::connect_with(&opts.server, connect_options(opts)?)
        .await?
        .with_rpc_timeout(opts.timeout))
}

/// The TLS and token settings of the client flags. A token file that
/// others may read draws a warning (it is a bearer secret).
pub fn connect_options(opts: &ClientOpts) -> Result<baton_client::ConnectOptions, CliError> {
    if let Some(path) = &opts.token_file {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode() & 0o777);
        if mode & 0o077 != 0 {
            eprintln!(
                "warning: token file {} is readable or writable by other users (mode {mode:03o}): anyone who reads it can act as you; chmod 600 it",
                path.display()
            );
        }
    }
    Ok(baton_client::ConnectOptions::from_files(
        opts.tls_ca.as_deref(),
        opts.tls_cert.as_deref(),
        opts.tls_key.as_deref(),
        opts.token_file.as_deref(),
    )?
    .dial_timeout(opts.dial_timeout)?)
}

fn parse_id(hex: &str) -> Result<AcquisitionId, CliError> {
    AcquisitionId::from_hex(hex).ok_or_else(|| {
        CliError::usage(format!(
            "acquisition id {hex:?} must be exactly 32 hex digits"
        ))
    })
}

/// One granted lease. `valid_for_ms` is what is left of
/// `Lease::valid_until` (counted from the acquire's send time, plus the
/// server's wait in line), as this process measured it; 0 means expired.
#[derive(Serialize)]
pub struct LeaseOut {
    resource: String,
    acquisition_id: String,
    token: u64,
    ttl_ms: u64,
    valid_for_ms: u64,
    /// A shared holder's or a permit's slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<u32>,
}

impl From<&baton_client::Lease> for LeaseOut {
    fn from(l: &baton_client::Lease) -> Self {
        Self {
            resource: l.resource.clone(),
            acquisition_id: l.acquisition_id.to_hex(),
            token: l.token.get(),
            ttl_ms: l.ttl.as_millis() as u64,
            valid_for_ms: l.valid_for().as_millis() as u64,
            slot: l.slot,
        }
    }
}

/// Why an acquire did not end with usable leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotAcquiredReason {
    /// A try-once request found a resource held or with waiters.
    Held,
    /// The wait ran out.
    TimedOut,
    /// Granted, but the reply arrived after the TTL counted from the send
    /// time: another client may hold the resource already.
    ExpiredOnArrival,
    /// The answer to the first attempt was lost, and the request sent
    /// again found its lease already ended (or the leader could not tell
    /// it from ended): nothing is held, nothing was granted again.
    Ended,
}

/// What `acquire` and `hold` print: one shape for one name or several, for
/// a grant and a refusal alike (every key is always there).
#[derive(Serialize)]
pub struct AcquireOut {
    acquired: bool,
    reason: Option<NotAcquiredReason>,
    after_wait: bool,
    leases: Vec<LeaseOut>,
    blocked_by: Option<BlockedBy>,
    blockers: Vec<BlockerOut>,
    #[serde(skip)]
    wait_ms: u128,
}

impl Rendered for AcquireOut {
    fn text(&self) -> String {
        let line = |l: &LeaseOut| {
            let slot = l.slot.map_or(String::new(), |k| format!(" slot={k}"));
            format!(
                "acquired {} token={} acquisition_id={} ttl={}ms valid_for={}ms{slot}",
                l.resource, l.token, l.acquisition_id, l.ttl_ms, l.valid_for_ms
            )
        };
        match self.reason {
            None => self.leases.iter().map(line).collect::<Vec<_>>().join("\n"),
            Some(NotAcquiredReason::TimedOut) => {
                let why = self.blockers_clause().map_or(String::new(), |c| format!("; {c}"));
                format!("not acquired: the wait of {}ms ran out{why}", self.wait_ms)
            }
            Some(NotAcquiredReason::Ended) => "not acquired: the answer to the first attempt was lost, and the request sent again found its lease already ended (nothing is held; acquire again)".to_string(),
            Some(NotAcquiredReason::Held) => match self.blockers_clause() {
                Some(clause) => format!("not acquired: {clause}"),
                // A server before 2026-12-05 names one blocker only.
                None => format!(
                    "not acquired: {}",
                    self.blocked_by.as_ref().map_or(String::new(), BlockedBy::clause)
                ),
            },
            Some(NotAcquiredReason::ExpiredOnArrival) => {
                let (names, tokens): (Vec<_>, Vec<_>) = self
                    .leases
                    .iter()
                    .map(|l| (l.resource.as_str(), l.token.to_string()))
                    .unzip();
                format!(
                    "expired on arrival: the grant of {} (token {}) came back later than its TTL of {}ms counted from when the request was sent; another client may hold it now, so it is not yours (released, best effort)",
                    names.join(", "),
                    tokens.join(", "),
                    self.leases.first().map_or(0, |l| l.ttl_ms)
                )
            }
        }
    }

    fn exit(&self) -> Exit {
        match self.reason {
            None => Exit::Ok,
            Some(NotAcquiredReason::ExpiredOnArrival) => Exit::ExpiredOnArrival,
            Some(_) => Exit::NotAcquired,
        }
    }
}

impl AcquireOut {
    /// Every blocker, in one line: `a is held by ...; b has 2 waiting ahead`.
    fn blockers_clause(&self) -> Option<String> {
        (!self.blockers.is_empty()).then(|| {
            self.blockers
                .iter()
                .map(BlockerOut::clause)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// The answer as the user sees it. Read at once on arrival: a grant
    /// whose validity (from the send time) has run out is not reported as
    /// acquired.
    pub(crate) fn new(all: &AcquiredAll, wait: Duration) -> Self {
        match all {
            AcquiredAll::Granted { leases, after_wait } => {
                // One reading of the clock per lease: what is printed is
                // what decides.
                let leases: Vec<LeaseOut> = leases.iter().map(LeaseOut::from).collect();
                let expired = leases.iter().any(|l| l.valid_for_ms == 0);
                AcquireOut {
                    acquired: !expired,
                    reason: expired.then_some(NotAcquiredReason::ExpiredOnArrival),
                    after_wait: *after_wait,
                    leases,
                    blocked_by: None,
                    blockers: Vec::new(),
                    wait_ms: wait.as_millis(),
                }
            }
            AcquiredAll::NotAcquired(n) => AcquireOut {
                acquired: false,
                reason: Some(if n.timed_out {
                    NotAcquiredReason::TimedOut
                } else if n.ended {
                    NotAcquiredReason::Ended
                } else {
                    NotAcquiredReason::Held
                }),
                after_wait: false,
                leases: Vec::new(),
                blocked_by: (n.resource.is_some() || n.holder_token.is_some())
                    .then(|| BlockedBy::new(n)),
                blockers: n.blockers.iter().map(BlockerOut::from).collect(),
                wait_ms: wait.as_millis(),
            },
        }
    }
}

/// How long a best-effort release of a lease that is no use may take.
pub(crate) const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(1);

/// `baton acquire`.
pub async fn acquire(
    opts: &ClientOpts,
    holder: &HolderOpt,
    claims: &[(String, Shape)],
    ttl: Option<Duration>,
    wait: Duration,
) -> Result<AcquireOut, CliError> {
    let mut client = connect(opts).await?.with_holder(holder.resolve());
    let claims: Vec<(&str, Shape)> = claims.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let all = client.acquire_shaped(&claims, ttl, wait).await?;
    let out = AcquireOut::new(&all, wait);
    if let (Some(NotAcquiredReason::ExpiredOnArrival), AcquiredAll::Granted { leases, .. }) =
        (out.reason, &all)
    {
        for l in leases {
            let give_back = client.release(&l.resource, &l.acquisition_id);
            let _ = tokio::time::timeout(GIVE_BACK_TIMEOUT, give_back).await;
        }
    }
    Ok(out)
}

/// What `renew` prints (every key always there). `valid_for_ms` counts
/// from the renewal's send time.
#[derive(Serialize)]
pub struct RenewOut {
    renewed: bool,
    token: Option<u64>,
    remaining_ms: Option<u64>,
    valid_for_ms: Option<u64>,
    reason: Option<&'static str>,
    #[serde(skip)]
    name: String,
}

impl Rendered for RenewOut {
    fn text(&self) -> String {
        match (self.reason, self.token, self.valid_for_ms) {
            (None, Some(token), Some(ms)) => {
                format!("renewed {} token={token} valid_for={ms}ms", self.name)
            }
            (Some("expired_on_arrival"), _, _) => format!(
                "expired on arrival: the renewal of {} came back later than the lease's remaining time counted from when it was sent; the lease may be gone",
                self.name
            ),
            _ => format!(
                "not owner: the lease on {} expired, was released, fenced or replaced",
                self.name
            ),
        }
    }

    fn exit(&self) -> Exit {
        match self.reason {
            None => Exit::Ok,
            Some("expired_on_arrival") => Exit::ExpiredOnArrival,
            Some(_) => Exit::NotOwner,
        }
    }
}

/// `baton renew`.
pub async fn renew(opts: &ClientOpts, name: &str, hex: &str) -> Result<RenewOut, CliError> {
    let id = parse_id(hex)?;
    let mut client = connect(opts).await?;
    let out = match client.renew(name, &id).await? {
        Renewal::Renewed {
            token,
            remaining,
            valid_until,
        } => {
            let valid_for = valid_until.saturating_duration_since(tokio::time::Instant::now());
            RenewOut {
                renewed: !valid_for.is_zero(),
                token: Some(token.get()),
                remaining_ms: Some(remaining.as_millis() as u64),
                valid_for_ms: Some(valid_for.as_millis() as u64),
                reason: valid_for.is_zero().then_some("expired_on_arrival"),
                name: name.into(),
            }
        }
        Renewal::NotOwner => RenewOut {
            renewed: false,
            token: None,
            remaining_ms: None,
            valid_for_ms: None,
            reason: Some("not_owner"),
            name: name.into(),
        },
    };
    Ok(out)
}

/// What `release` prints (every key always there). Releasing what is not
/// held changes nothing: exit 0.
#[derive(Serialize)]
pub struct ReleaseOut {
    released: bool,
    token: Option<u64>,
    reason: Option<&'static str>,
    #[serde(skip)]
    name: String,
}

impl Rendered for ReleaseOut {
    fn text(&self) -> String {
        match self.token {
            Some(token) => format!("released {} token={token}", self.name),
            None => format!(
                "not held: {} was already released, expired, fenced or held by another acquisition; nothing changed",
                self.name
            ),
        }
    }
}

/// `baton release`.
pub async fn release(opts: &ClientOpts, name: &str, hex: &str) -> Result<ReleaseOut, CliError> {
    let id = parse_id(hex)?;
    let mut client = connect(opts).await?;
    let (released, token, reason) = match client.release(name, &id).await? {
        Release::Released { token } => (true, Some(token.get()), None),
        Release::NotHeld => (false, None, Some("not_held")),
    };
    Ok(ReleaseOut {
        released,
        token,
        reason,
        name: name.into(),
    })
}

/// A resource's status; never its acquisition id.
#[derive(Serialize)]
pub struct StatusOut {
    resource: String,
    /// Held by anyone: exclusively, shared or by permits.
    held: bool,
    holder_token: Option<u64>,
    remaining_ms: u64,
    ttl_ms: u64,
    n_waiters: u64,
    holder: Option<String>,
    /// A semaphore's number of permits (absent for a lock).
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    /// Its shared holders or permits, by slot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slots: Vec<SlotOut>,
}

/// A shared holder or a permit, as `status` prints it.
#[derive(Serialize)]
pub struct SlotOut {
    slot: u32,
    token: u64,
    remaining_ms: u64,
    ttl_ms: u64,
    holder: Option<String>,
}

impl From<&baton_client::Status> for StatusOut {
    fn from(s: &baton_client::Status) -> Self {
        Self {
            resource: s.resource.clone(),
            held: s.holder_token.is_some() || !s.slots.is_empty(),
            holder_token: s.holder_token.map(|t| t.get()),
            remaining_ms: s.remaining.as_millis() as u64,
            ttl_ms: s.ttl.as_millis() as u64,
            n_waiters: s.n_waiters,
            holder: s.holder.clone(),
            permits: s.permits,
            slots: s
                .slots
                .iter()
                .map(|x| SlotOut {
                    slot: x.slot,
                    token: x.token.get(),
                    remaining_ms: x.remaining.as_millis() as u64,
                    ttl_ms: x.ttl.as_millis() as u64,
                    holder: x.holder.clone(),
                })
                .collect(),
        }
    }
}

impl Rendered for StatusOut {
    fn text(&self) -> String {
        if !self.slots.is_empty() || self.permits.is_some() {
            // A semaphore, or a lock held shared: a line, then a line per
            // holder.
            let what = self.permits.map_or_else(
                || format!("held shared by {}", self.slots.len()),
                |n| format!("{} of {n} permits held", self.slots.len()),
            );
            let mut lines = vec![format!(
                "{} {what} waiters={}",
                self.resource, self.n_waiters
            )];
            lines.extend(self.slots.iter().map(|x| {
                format!(
                    "  slot={} token={} remaining={}ms{}",
                    x.slot,
                    x.token,
                    x.remaining_ms,
                    holder_text(x.holder.as_deref())
                )
            }));
            return lines.join("\n");
        }
        match self.holder_token {
            Some(t) => format!(
                "{} held token={t} remaining={}ms waiters={}{}",
                self.resource,
                self.remaining_ms,
                self.n_waiters,
                holder_text(self.holder.as_deref())
            ),
            None => format!("{} free waiters={}", self.resource, self.n_waiters),
        }
    }
}

/// ` holder="…"` for a text line (quoted: it may hold spaces), or nothing.
pub fn holder_text(holder: Option<&str>) -> String {
    holder.map_or(String::new(), |h| format!(" holder={h:?}"))
}

/// `baton status`.
pub async fn status(opts: &ClientOpts, name: &str) -> Result<StatusOut, CliError> {
    let mut client = connect(opts).await?;
    Ok((&client.status(name).await?).into())
}

/// What `list` prints.
#[derive(Serialize)]
pub struct ListOut {
    entries: Vec<StatusOut>,
}

impl Rendered for ListOut {
    fn text(&self) -> String {
        self.entries
            .iter()
            .map(Rendered::text)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `baton list`.
pub async fn list(
    opts: &ClientOpts,
    prefix: &str,
    start_after: Option<&str>,
    limit: u32,
) -> Result<ListOut, CliError> {
    let mut client = connect(opts).await?;
    let entries = client.list(prefix, start_after, limit).await?;
    Ok(ListOut {
        entries: entries.iter().map(StatusOut::from).collect(),
    })
}
