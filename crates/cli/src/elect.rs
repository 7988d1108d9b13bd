//! `baton elect NAME` and `baton observe NAME`: a fenced leader election
//! on one lease (see `baton_client::Election`). A candidate waits in line
//! for the election's resource on a session whose holder description is
//! its value; the leader is the holder, with a fencing token above every
//! earlier leader's. `elect -- COMMAND` runs the command while leading,
//! exactly as `run` does.

use std::time::Duration;

use baton_client::worker::{Keeper, KeeperConfig};
use baton_client::{Acquired, LeaderChange, Session};
use serde::Serialize;
use tokio::time::Instant;

use crate::args::{ClientOpts, ElectArgs, HolderOpt};
use crate::error::{CliError, Exit};
use crate::hold::{close_after_loss, close_bounded, first_lost, loss_message};
use crate::lease::{connect, holder_text};
use crate::output::{emit, Rendered};
use crate::signals::Stop;

/// One wait in line, below every server's default `--wait-max`; a
/// campaign with no bound waits again after each.
const CAMPAIGN_CHUNK: Duration = Duration::from_secs(60);

/// What `elect` prints once elected.
#[derive(Serialize)]
struct Elected {
    elected: bool,
    resource: String,
    token: u64,
    value: String,
}

impl Rendered for Elected {
    fn text(&self) -> String {
        format!(
            "leading {} token={} value={:?}",
            self.resource, self.token, self.value
        )
    }
}

/// How a campaign ended without leadership.
enum Campaign {
    Elected(Keeper),
    TimedOut,
    Interrupted,
}

/// Waits in line on `session` until elected, `wait` runs out, or SIGINT
/// or SIGTERM arrives.
async fn campaign(
    session: &Session,
    name: &str,
    wait: Option<Duration>,
    stop: &mut Stop,
) -> Result<Campaign, CliError> {
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        let chunk = match deadline {
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Campaign::TimedOut);
                }
                left.min(CAMPAIGN_CHUNK)
            }
            None => CAMPAIGN_CHUNK,
        };
        tokio::select! {
            _ = stop.received() => return Ok(Campaign::Interrupted),
            out = session.acquire(name, chunk) => match out? {
                Acquired::Granted(lease) => {
                    let keeper = Keeper::start(session.clone(), lease, KeeperConfig::default());
                    return Ok(Campaign::Elected(keeper));
                }
                Acquired::NotAcquired(_) => continue,
            },
        }
    }
}

/// `baton elect`: the exit code.
pub async fn elect(a: &ElectArgs) -> Result<u8, CliError> {
    let with_command = !a.command.is_empty();
    let not_started = |e: CliError| {
        if with_command {
            CliError {
                code: Exit::RunNotStarted,
                message: e.message,
            }
        } else {
            e
        }
    };
    let value = HolderOpt {
        holder: a.value.clone(),
    }
    .resolve();
    let client = connect(&a.client)
        .await
        .map_err(not_started)?
        .with_holder(value.clone());
    // Checked before anything is sent: the name is a resource name.
    client
        .election(&a.name)
        .map_err(|e| not_started(CliError::usage(e.to_string())))?;
    let session = client
        .open_session(a.ttl.unwrap_or_default())
        .await
        .map_err(|e| not_started(e.into()))?;
    // From the campaign on, a stop asked for between two tries is kept.
    let mut stop = Stop::on_interrupt_or_term().map_err(not_started)?;
    let keeper = match campaign(&session, &a.name, a.wait, &mut stop).await {
        Ok(Campaign::Elected(keeper)) => keeper,
        Ok(ended) => {
            close_bounded(&session).await;
            return not_elected(&ended, with_command);
        }
        Err(e) => {
            close_bounded(&session).await;
            return Err(not_started(e));
        }
    };
    let elected = Elected {
        elected: true,
        resource: keeper.lease().resource.clone(),
        token: keeper.lease().token.get(),
        value: value.to_string(),
    };
    let keepers = [keeper];
    if with_command {
        // stdout is the command's; the leadership goes to stderr, and to
        // stdout only with --json (as `run` prints its grant).
        if a.client.json {
            crate::stdout::line(&serde_json::to_string(&elected).expect("serializes"));
        }
        eprintln!("baton elect: {}", elected.text());
        return crate::run::run_held(
            "baton elect",
            &client.current_server(),
            &session,
            &keepers,
            &a.command,
            a.kill_after,
            a.verbose,
        )
        .await;
    }
    emit(a.client.json, &elected);
    lead(&session, &keepers, a.client.json, &mut stop).await
}

/// The exit of a campaign that ended without leadership: 3, or 125 (and
/// one line on stderr) when a command was to run.
fn not_elected(ended: &Campaign, with_command: bool) -> Result<u8, CliError> {
    let why = match ended {
        Campaign::TimedOut => "the wait ran out",
        _ => "interrupted while campaigning",
    };
    let message = format!("not elected: {why}");
    if with_command {
        eprintln!("baton elect: not started: {message}");
        return Ok(Exit::RunNotStarted as u8);
    }
    Err(CliError {
        code: Exit::NotAcquired,
        message,
    })
}

/// Holds the leadership until SIGINT or SIGTERM (resign: exit 0) or until
/// it is lost (exit 4, said at once).
async fn lead(
    session: &Session,
    keepers: &[Keeper],
    json: bool,
    stop: &mut Stop,
) -> Result<u8, CliError> {
    tokio::select! {
        _ = stop.received() => {}
        keeper = first_lost(keepers) => {
            let code = CliError {
                code: Exit::NotOwner,
                message: format!("no longer leading: {}", loss_message(keeper, session)),
            }
            .report(json);
            close_after_loss(session).await;
            return Ok(code as u8);
        }
    }
    // Resign: the next candidate leads at once.
    session.close().await?;
    Ok(Exit::Ok as u8)
}

/// One line of `observe`: the leader now (kind `current`), then each
/// change (`granted`, `handed_off`, `released`, `expired`, `fenced`).
#[derive(Serialize)]
struct ObserveLine {
    seq: u64,
    kind: &'static str,
    resource: String,
    leader: bool,
    token: Option<u64>,
    value: Option<String>,
    /// For a vacancy: the token of the leadership that ended.
    ended_token: Option<u64>,
}

impl Rendered for ObserveLine {
    fn text(&self) -> String {
        match self.token {
            Some(t) if self.leader => format!(
                "{} {} {} leader token={t}{}",
                self.seq,
                self.kind,
                self.resource,
                holder_text(self.value.as_deref()).replace(" holder=", " value=")
            ),
            _ => format!(
                "{} {} {} vacant{}",
                self.seq,
                self.kind,
                self.resource,
                self.ended_token
                    .map_or(String::new(), |t| format!(" ended_token={t}"))
            ),
        }
    }
}

fn change_line(name: &str, c: LeaderChange) -> ObserveLine {
    ObserveLine {
        seq: c.seq,
        kind: c.kind.map_or("current", |k| k.as_str()),
        resource: name.to_string(),
        leader: c.leader.is_some(),
        token: c.leader.as_ref().map(|l| l.token.get()),
        value: c.leader.and_then(|l| l.value),
        ended_token: c.ended.map(|t| t.get()),
    }
}

/// `baton observe`: prints until SIGINT (exit 0), resuming across
/// restarts and failovers; with `once`, until the end of the stream (exit
/// 1: observe again).
pub async fn observe(opts: &ClientOpts, name: &str, once: bool) -> Result<Exit, CliError> {
    let client = connect(opts).await?;
    let election = client
        .election(name)
        .map_err(|e| CliError::usage(e.to_string()))?;
    let mut observer = election.observe().await?;
    if once {
        observer = observer.once();
    }
    // Before the first line: a script that reads it may interrupt at once.
    let mut stop = Stop::on_interrupt()?;
    let now = match observer.current() {
        Some(l) => ObserveLine {
            seq: observer.seq(),
            kind: "current",
            resource: name.to_string(),
            leader: true,
            token: Some(l.token.get()),
            value: l.value.clone(),
            ended_token: None,
        },
        None => ObserveLine {
            seq: observer.seq(),
            kind: "current",
            resource: name.to_string(),
            leader: false,
            token: None,
            value: None,
            ended_token: None,
        },
    };
    emit(opts.json, &now);
    loop {
        tokio::select! {
            _ = stop.received() => return Ok(Exit::Ok),
            next = observer.next() => match next {
                Ok(change) => {
                    emit(opts.json, &change_line(election.name(), change));
                }
                Err(baton_client::ClientError::WatchEnded(why)) => {
                    return Err(CliError::failure(format!("the server ended the observation: {why}")))
                }
                Err(e) => return Err(e.into()),
            },
        }
    }
}
