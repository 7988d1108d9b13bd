//! `statements`: the statement publication service of the seed, end to end,
//! on Baton's public APIs. See `statements demo`.

mod args;
#[cfg(feature = "chaos")]
mod chaos_effects;
#[cfg(feature = "chaos")]
mod chaos_service;
mod console;
mod deliveries;
mod demo;
mod dispatch;
mod events;
mod inspect;
mod metrics_port;
mod store;
mod worker;

use std::process::ExitCode;

use args::{Cli, Command, Paths};
use baton_fence::resource_name;
use clap::Parser;

/// A show or cancel of a job that does not exist (exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NoSuchJob(pub(crate) String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (service, otlp_endpoint) = match &cli.command {
        Command::Worker(w) => ("statements", w.otlp_endpoint.clone()),
        // A lease server in this process: its spans are the server's.
        Command::ServeBaton { otlp_endpoint, .. } => ("baton serve", otlp_endpoint.clone()),
        _ => ("statements", None),
    };
    let telemetry = baton_telemetry::init(&baton_telemetry::Settings {
        service,
        default_filter: "warn",
        ansi: false,
        otlp_endpoint: otlp_endpoint.as_deref(),
    });
    let _telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` prints the context chain on one line: "seeding x: cannot connect ...".
            eprintln!("error: {e:#}");
            if e.downcast_ref::<NoSuchJob>().is_some() {
                ExitCode::from(3)
            } else if e.downcast_ref::<worker::LeftToOthers>().is_some() {
                ExitCode::from(4)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Seed {
            paths,
            account,
            date,
            balance_cents,
        } => {
            let db = store::open(&paths.target()).await?;
            let version = db.seed(&account, &date, balance_cents).await?;
            println!("seeded {account} {date}: input version {version}, job queued");
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker(args) => {
            if let Some(listen) = args.metrics_listen {
                let bound = metrics_port::serve(listen, "statements worker").await?;
                eprintln!("metrics on http://{bound}/metrics");
            }
            worker::run(args.into()).await?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "chaos")]
        Command::Chaos(args) => {
            let service =
                std::sync::Arc::new(chaos_service::StatementsService::new(args.objects.clone())?);
            baton_chaos::run(args.into(), service).await
        }
        #[cfg(feature = "chaos")]
        Command::Check {
            paths,
            history,
            accounts,
            json,
        } => check(&paths, &history, &accounts, json).await,
        Command::ServeBaton {
            data_dir, listen, ..
        } => serve_baton(data_dir, listen).await,
        Command::Show {
            paths,
            account,
            date,
            json,
        } => {
            let shown = inspect::gather(&paths, &account, &date, None).await?;
            print_inspection(&shown, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect {
            paths,
            server,
            account,
            date,
            json,
        } => {
            let shown = inspect::gather(&paths, &account, &date, Some(&server)).await?;
            print_inspection(&shown, json);
            Ok(if shown.verdict.recovery_mismatch {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Console {
            paths,
            server,
            listen,
        } => {
            console::serve(paths, server, listen).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel {
            paths,
            server,
            account,
            date,
        } => {
            let at = cancel(&paths, &server, &account, &date).await?;
            println!("cancelled {account} {date}: every token at or below {at} is refused at the resource");
            Ok(ExitCode::SUCCESS)
        }
        Command::Dispatch(args) => {
            if let Some(listen) = args.metrics_listen {
                let bound = metrics_port::serve(listen, "statements dispatch").await?;
                eprintln!("metrics on http://{bound}/metrics");
            }
            dispatch::run(args.try_into()?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Deliveries { command } => deliveries::run(command).await,
        #[cfg(feature = "chaos")]
        Command::WebhookReceiver(args) => {
            baton_testkit::webhook::run(args)
                .await
                .map_err(|e| anyhow::anyhow!(e).context("webhook receiver"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            json,
            dir,
            database_url,
        } => demo::run(json, dir, database_url).await,
    }
}

/// The hidden `serve-baton`: a lease server in this process, for demos
/// and tests, until killed.
async fn serve_baton(
    data_dir: std::path::PathBuf,
    listen: std::net::SocketAddr,
) -> anyhow::Result<ExitCode> {
    let mut config = baton_server::ServerConfig::ephemeral(data_dir);
    config.listen = listen;
    let server = baton_server::start(config).await?;
    println!("listening on {}", server.grpc_addr);
    // Runs until killed: that is what it is for.
    std::future::pending::<()>().await;
    Ok(ExitCode::SUCCESS)
}

/// `statements check`: a chaos run's history against the resources; the
/// exit code says whether the verdict is clean.
#[cfg(feature = "chaos")]
async fn check(
    paths: &Paths,
    history: &std::path::Path,
    accounts: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let db = store::open(&paths.target()).await?;
    let db = chaos_service::StatementsDb(db);
    let checked = baton_chaos::check(&db, history, accounts).await?;
    let figures = checked.figures();
    if json {
        println!(
            "{}",
            serde_json::to_string(&figures).expect("figures serialize")
        );
    } else if let serde_json::Value::Object(fields) =
        serde_json::to_value(&figures).expect("figures serialize")
    {
        for (k, v) in fields {
            let v = v.as_str().map_or(v.to_string(), str::to_string);
            println!("{k:<36} {v}");
        }
    }
    Ok(if checked.verdict.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Durable cancellation, in this order: the job becomes `cancelled` (workers
/// that pick it up skip it); Baton fences the lease (revoking it: the holder's
/// keeper sees "not owner" on its next renewal) and returns a token above
/// every token issued; the fence kit refuses every token at or below it.
async fn cancel(paths: &Paths, server: &str, account: &str, date: &str) -> anyhow::Result<u64> {
    let mut db = store::open(&paths.target()).await?;
    let resource = worker::resource(account, date);
    if !db
        .cancel_job(account, date, &resource_name(&resource)?)
        .await?
    {
        return Err(NoSuchJob(format!("no job for {account} {date}")).into());
    }
    let mut client = baton_client::Client::connect(server).await?;
    let fenced = client.fence(&resource).await?;
    let at = fenced.token;
    let key = resource_name(&resource)?;
    db.fence_cancel(&key, at).await?;
    Ok(at.get())
}

fn print_inspection(shown: &inspect::Inspection, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string(shown).expect("an inspection serializes")
        );
    } else {
        println!("{}", shown.text());
    }
}
