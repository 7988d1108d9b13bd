//! `statements deliveries`: what the outbox holds, and an operator's decisions.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use baton_fence::outbox::{Delivery, Filter, ReceiverKind, Resolution, StepOutcome};

use crate::args::{DeliveriesCommand, Paths};
use crate::store;

/// One line per delivery.
pub fn line(d: &Delivery) -> String {
    let mut l = format!(
        "{:>6}  {:<15} {:<12} attempts {:<2} {:<28} {}",
        d.id, d.state, d.receiver_kind, d.attempts, d.recipient, d.operation
    );
    if let Some(e) = &d.evidence {
        l.push_str(&format!("\n        evidence: {e}"));
    }
    if let (Some(by), Some(how)) = (&d.resolved_by, &d.resolution) {
        l.push_str(&format!(
            "\n        resolved: {how} by {by} at {} ({})",
            d.resolved_at.as_deref().unwrap_or("?"),
            d.resolution_reason.as_deref().unwrap_or("")
        ));
    }
    l
}

pub async fn run(command: DeliveriesCommand) -> anyhow::Result<ExitCode> {
    match command {
        DeliveriesCommand::List { paths, state, json } => {
            let mut db = store::open_existing(&paths.target()).await?;
            let filter = Filter {
                state,
                ..Filter::default()
            };
            let rows = db.outbox().list(&filter).await?;
            for d in &rows {
                if json {
                    println!("{}", serde_json::to_string(d)?);
                } else {
                    println!("{}", line(d));
                }
            }
            if !json && rows.is_empty() {
                println!("no deliveries");
            }
            Ok(ExitCode::SUCCESS)
        }
        DeliveriesCommand::Show { paths, id, json } => show(&paths, id, json).await,
        DeliveriesCommand::Resolve {
            paths,
            id,
            delivered,
            resend,
            abandon: _,
            reason,
            by,
            yes,
        } => {
            let resolution = if delivered {
                Resolution::Delivered
            } else if resend {
                Resolution::Resend
            } else {
                Resolution::Abandon
            };
            let by = by
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_default();
            resolve(&paths, id, resolution, &by, &reason, yes).await
        }
    }
}

async fn show(paths: &Paths, id: i64, json: bool) -> anyhow::Result<ExitCode> {
    let mut db = store::open_existing(&paths.target()).await?;
    let Some(d) = db.outbox().get(id).await? else {
        return Err(crate::NoSuchJob(format!("no delivery {id}")).into());
    };
    let events = db.outbox().events(id).await?;
    if json {
        println!("{}", serde_json::json!({"delivery": d, "events": events}));
    } else {
        println!("{}", line(&d));
        for e in events {
            println!(
                "        {}  {:<22} token {:<6} {:<14} {}",
                e.at,
                e.event,
                e.token.map_or("-".to_string(), |t| t.to_string()),
                e.actor.unwrap_or_default(),
                e.detail.unwrap_or_default()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn resolve(
    paths: &Paths,
    id: i64,
    resolution: Resolution,
    by: &str,
    reason: &str,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    if by.trim().is_empty() {
        anyhow::bail!("say who resolves it: --by NAME (or set USER)");
    }
    if reason.trim().is_empty() {
        anyhow::bail!("say why: --reason TEXT is kept with the decision");
    }
    let mut db = store::open(&paths.target()).await?;
    let Some(d) = db.outbox().get(id).await? else {
        return Err(crate::NoSuchJob(format!("no delivery {id}")).into());
    };
    let unrepeatable = ReceiverKind::parse(&d.receiver_kind) == Some(ReceiverKind::Unrepeatable);
    if resolution == Resolution::Resend && unrepeatable && !yes {
        let warning = format!(
            "delivery {id} goes to {} ({}), a receiver that can neither deduplicate nor be asked: if the earlier attempt arrived, resending delivers a second copy.",
            d.recipient, d.receiver_kind
        );
        if !std::io::stdin().is_terminal() {
            anyhow::bail!("{warning} Pass --yes to resend anyway (stdin is not a terminal, so nobody can be asked)");
        }
        eprint!("{warning}\nType 'resend' to send it again: ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if answer.trim() != "resend" {
            eprintln!("not resent");
            return Ok(ExitCode::FAILURE);
        }
    }
    let step = db.outbox().resolve(id, resolution, by, reason).await?;
    match step.outcome {
        StepOutcome::Resolved => {
            println!(
                "delivery {id}: {} by {by} ({reason}); now {}",
                resolution.label(),
                step.state.map_or("?", |s| s.as_str())
            );
            Ok(ExitCode::SUCCESS)
        }
        _ => anyhow::bail!(
            "delivery {id} was not resolved: {}",
            step.detail
                .unwrap_or_else(|| step.outcome.label().to_string())
        ),
    }
}
