//! The lease commands: acquire, renew, release, status, list, fence. Each
//! calls the client once and returns a [`Rendered`] result.

use std::time::Duration;

use baton_client::{AcquiredAll, Client, Release, Renewal};
use baton_core::AcquisitionId;
use serde::Serialize;

use crate::args::ClientOpts;
use crate::error::{CliError, Exit};
use crate::output::Rendered;

/// Connects to `--server`, over TLS and with a token if the flags say so.
pub async fn connect(opts: &ClientOpts) -> Result<Client, CliError> {
    Ok(Client::connect_with(&opts.server, connect_options(opts)?).await?)
}

/// The TLS and token settings of the client flags.
pub fn connect_options(opts: &ClientOpts) -> Result<baton_client::ConnectOptions, CliError> {
    Ok(baton_client::ConnectOptions::from_files(
        opts.tls_ca.as_deref(),
        opts.tls_cert.as_deref(),
        opts.tls_key.as_deref(),
        opts.token_file.as_deref(),
    )?)
}

fn parse_id(hex: &str) -> Result<AcquisitionId, CliError> {
    AcquisitionId::from_hex(hex).ok_or_else(|| {
        CliError::usage(format!(
            "acquisition id {hex:?} must be exactly 32 hex digits"
        ))
    })
}

/// One granted lease.
#[derive(Serialize)]
pub struct LeaseOut {
    resource: String,
    acquisition_id: String,
    token: u64,
    ttl_ms: u64,
}

impl From<&baton_client::Lease> for LeaseOut {
    fn from(l: &baton_client::Lease) -> Self {
        Self {
            resource: l.resource.clone(),
            acquisition_id: l.acquisition_id.to_hex(),
            token: l.token.get(),
            ttl_ms: l.ttl.as_millis() as u64,
        }
    }
}

/// What `acquire` prints: one lease flat, several in a list, or why not.
#[derive(Serialize)]
#[serde(untagged)]
pub enum AcquireOut {
    One {
        #[serde(flatten)]
        lease: LeaseOut,
        after_wait: bool,
    },
    Many {
        leases: Vec<LeaseOut>,
        after_wait: bool,
    },
    NotAcquired {
        acquired: bool,
        reason: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        resource: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        holder_token: Option<u64>,
        #[serde(skip)]
        wait_ms: u128,
    },
}

impl Rendered for AcquireOut {
    fn text(&self) -> String {
        let line = |l: &LeaseOut| {
            format!(
                "acquired {} token={} acquisition_id={} ttl={}ms",
                l.resource, l.token, l.acquisition_id, l.ttl_ms
            )
        };
        match self {
            AcquireOut::One { lease, .. } => line(lease),
            AcquireOut::Many { leases, .. } => {
                leases.iter().map(line).collect::<Vec<_>>().join("\n")
            }
            AcquireOut::NotAcquired {
                reason: "timed_out",
                wait_ms,
                ..
            } => format!("not acquired: the wait of {wait_ms}ms ran out"),
            AcquireOut::NotAcquired {
                resource,
                holder_token,
                ..
            } => {
                let holder = holder_token.map_or("waiters ahead".to_string(), |t| {
                    format!("held by token {t}")
                });
                format!(
                    "not acquired: {} is {holder}",
                    resource.as_deref().unwrap_or_default()
                )
            }
        }
    }

    fn exit(&self) -> Exit {
        match self {
            AcquireOut::NotAcquired { .. } => Exit::NotAcquired,
            _ => Exit::Ok,
        }
    }
}

/// `baton acquire`.
pub async fn acquire(
    opts: &ClientOpts,
    names: &[String],
    ttl: Duration,
    wait: Duration,
) -> Result<AcquireOut, CliError> {
    let mut client = connect(opts).await?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(acquire_out(
        client.acquire_all(&refs, ttl, wait).await?,
        wait,
    ))
}

fn acquire_out(all: AcquiredAll, wait: Duration) -> AcquireOut {
    match all {
        AcquiredAll::Granted { leases, after_wait } => match leases.as_slice() {
            [one] => AcquireOut::One {
                lease: one.into(),
                after_wait,
            },
            many => AcquireOut::Many {
                leases: many.iter().map(LeaseOut::from).collect(),
                after_wait,
            },
        },
        AcquiredAll::NotAcquired(n) => AcquireOut::NotAcquired {
            acquired: false,
            reason: if n.timed_out { "timed_out" } else { "held" },
            resource: n.resource,
            holder_token: n.holder_token.map(|t| t.get()),
            wait_ms: wait.as_millis(),
        },
    }
}

/// `baton hold`: acquires on a session, prints the leases like `acquire`,
/// and keeps them by the session's heartbeat until SIGINT or SIGTERM, then
/// closes the session (releasing them). If the session ends first (the
/// server was out of reach for a whole TTL), says so and exits 4.
pub async fn hold(
    opts: &ClientOpts,
    names: &[String],
    ttl: Duration,
    wait: Duration,
) -> Result<Exit, CliError> {
    let client = connect(opts).await?;
    let session = client.open_session(ttl).await?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let out = acquire_out(session.acquire_all(&refs, wait).await?, wait);
    let exit = crate::output::emit(opts.json, &out);
    if exit != Exit::Ok {
        session.close().await?;
        return Ok(exit);
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::failure(format!("cannot install SIGTERM handler: {e}")))?;
    let mut state = session.watch();
    let ended = async {
        while state.borrow_and_update().health != baton_client::Health::Ended {
            if state.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = ended => {
            return Err(CliError {
                code: Exit::NotOwner,
                message: "the session ended (the server was out of reach for a whole TTL, or fenced it): the leases are lost".into(),
            });
        }
    }
    session.close().await?;
    Ok(Exit::Ok)
}

/// What `renew` prints.
#[derive(Serialize)]
pub struct RenewOut {
    renewed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip)]
    name: String,
}

impl Rendered for RenewOut {
    fn text(&self) -> String {
        match (self.token, self.remaining_ms) {
            (Some(token), Some(ms)) => {
                format!("renewed {} token={token} remaining={ms}ms", self.name)
            }
            _ => format!(
                "not owner: the lease on {} expired, was released, fenced or replaced",
                self.name
            ),
        }
    }

    fn exit(&self) -> Exit {
        if self.renewed {
            Exit::Ok
        } else {
            Exit::NotOwner
        }
    }
}

/// `baton renew`.
pub async fn renew(opts: &ClientOpts, name: &str, hex: &str) -> Result<RenewOut, CliError> {
    let id = parse_id(hex)?;
    let mut client = connect(opts).await?;
    let out = match client.renew(name, &id).await? {
        Renewal::Renewed { token, remaining } => RenewOut {
            renewed: true,
            token: Some(token.get()),
            remaining_ms: Some(remaining.as_millis() as u64),
            reason: None,
            name: name.into(),
        },
        Renewal::NotOwner => RenewOut {
            renewed: false,
            token: None,
            remaining_ms: None,
            reason: Some("not_owner"),
            name: name.into(),
        },
    };
    Ok(out)
}

/// What `release` prints. Releasing what is not held changes nothing: exit 0.
#[derive(Serialize)]
pub struct ReleaseOut {
    released: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
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
    held: bool,
    holder_token: Option<u64>,
    remaining_ms: u64,
    ttl_ms: u64,
    n_waiters: u64,
}

impl From<&baton_client::Status> for StatusOut {
    fn from(s: &baton_client::Status) -> Self {
        Self {
            resource: s.resource.clone(),
            held: s.holder_token.is_some(),
            holder_token: s.holder_token.map(|t| t.get()),
            remaining_ms: s.remaining.as_millis() as u64,
            ttl_ms: s.ttl.as_millis() as u64,
            n_waiters: s.n_waiters,
        }
    }
}

impl Rendered for StatusOut {
    fn text(&self) -> String {
        match self.holder_token {
            Some(t) => format!(
                "{} held token={t} remaining={}ms waiters={}",
                self.resource, self.remaining_ms, self.n_waiters
            ),
            None => format!("{} free waiters={}", self.resource, self.n_waiters),
        }
    }
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

/// What `fence` prints.
#[derive(Serialize)]
pub struct FenceOut {
    resource: String,
    token: u64,
    revoked_token: Option<u64>,
}

impl Rendered for FenceOut {
    fn text(&self) -> String {
        let revoked = self
            .revoked_token
            .map_or("no lease was held".to_string(), |t| {
                format!("revoked token {t}")
            });
        format!("fenced {} token={} ({revoked})", self.resource, self.token)
    }
}

/// `baton fence`.
pub async fn fence(opts: &ClientOpts, name: &str) -> Result<FenceOut, CliError> {
    let mut client = connect(opts).await?;
    let f = client.fence(name).await?;
    Ok(FenceOut {
        resource: name.into(),
        token: f.token.get(),
        revoked_token: f.revoked.map(|t| t.get()),
    })
}
