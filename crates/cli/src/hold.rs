//! `baton hold`: leases on a session, kept by one keeper each, until a
//! signal, or until a keeper loses its lease (a fence, the session's end,
//! or its safe-until passing on this machine's clock, server reachable or
//! not); `run` shares the loss handling.

use std::time::Duration;

use baton_client::worker::{Keeper, KeeperConfig, LossReason};
use baton_client::{AcquiredAll, Health};

use crate::args::{ClientOpts, HolderOpt};
use crate::error::{CliError, Exit};
use crate::lease::{connect, AcquireOut, GIVE_BACK_TIMEOUT};

/// `baton hold`: acquires on a session, prints the leases like `acquire`,
/// and keeps them with the worker runtime's keeper until SIGINT or SIGTERM,
/// then closes the session (releasing them). Ownership ends, on this
/// process's monotonic clock, at the keeper's safe-until whether or not the
/// server can be reached, or at once when a heartbeat reports a fence or the
/// session's end: `hold` says so at that moment and exits 4 at once (the
/// session's close is sent, its answer not waited for).
pub async fn hold(
    opts: &ClientOpts,
    holder: &HolderOpt,
    claims: &[(String, baton_core::Shape)],
    ttl: Duration,
    wait: Duration,
) -> Result<Exit, CliError> {
    let client = connect(opts).await?.with_holder(holder.resolve());
    let session = client.open_session(ttl).await?;
    let claims: Vec<(&str, baton_core::Shape)> =
        claims.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let all = session.acquire_shaped(&claims, None, wait).await?;
    // Before the grant is printed: a script that reads it may stop us at
    // once, and the leases are then released, not left to their TTL.
    let mut stop = crate::signals::Stop::on_interrupt_or_term()?;
    let out = AcquireOut::new(&all, wait);
    let exit = crate::output::emit(opts.json, &out);
    let leases = match all {
        AcquiredAll::Granted { leases, .. } if exit == Exit::Ok => leases,
        _ => {
            close_bounded(&session).await;
            return Ok(exit);
        }
    };
    let keepers: Vec<Keeper> = leases
        .into_iter()
        .map(|l| Keeper::start(session.clone(), l, KeeperConfig::default()))
        .collect();
    let lost = first_lost(&keepers);
    tokio::select! {
        _ = stop.received() => {}
        keeper = lost => {
            // Said the moment it is known, and the exit follows at once: a
            // script may take it as the end of ownership. The close is sent,
            // its answer never waited for.
            let code = CliError {
                code: Exit::NotOwner,
                message: loss_message(keeper, &session),
            }
            .report(opts.json);
            close_after_loss(&session).await;
            return Ok(code);
        }
    }
    session.close().await?;
    Ok(Exit::Ok)
}

/// The first keeper whose lease is lost.
pub(crate) async fn first_lost(keepers: &[Keeper]) -> &Keeper {
    let cancelled = keepers.iter().map(|k| {
        let token = k.cancellation();
        Box::pin(async move {
            token.cancelled().await;
            k
        })
    });
    futures_util::future::select_all(cancelled).await.0
}

/// One sentence on a lost lease: which, and why, in the user's terms.
pub(crate) fn loss_message(keeper: &Keeper, session: &baton_client::Session) -> String {
    let lease = keeper.lease();
    let state = session.state();
    let why = if state.revoked.iter().any(|(_, t)| *t == lease.token) {
        "an operator fenced it (baton fence)".to_string()
    } else if state.health == Health::Ended {
        "the session ended (the server expired or closed it)".to_string()
    } else {
        match keeper.loss_reason() {
            Some(LossReason::DeadlinePassed) | None => format!(
                "no heartbeat was acknowledged within its TTL of {}ms (server unreachable, stopped or slow), so the server may already have given it to someone else",
                session.ttl().as_millis()
            ),
            Some(other) => other.to_string(),
        }
    };
    format!(
        "lost the lease on {} (token {}): {why}",
        lease.resource, lease.token
    )
}

/// After a loss: the session's close is handed to its task (which gets one
/// turn to send it) and never waited for; the leases end with the session
/// anyway.
pub(crate) async fn close_after_loss(session: &baton_client::Session) {
    session.close_without_waiting();
    tokio::task::yield_now().await;
}

/// Closes the session, best effort and bounded: the server may be out of
/// reach, and the leases end with the session anyway.
pub(crate) async fn close_bounded(session: &baton_client::Session) {
    if tokio::time::timeout(GIVE_BACK_TIMEOUT, session.close())
        .await
        .is_err()
    {
        session.abandon();
    }
}
