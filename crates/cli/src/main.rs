//! The `baton` command: clap parses the flags (`args.rs`), `run` dispatches
//! to one function per subcommand, which returns a result that `output.rs`
//! prints as text or JSON; an error is printed once, here.

mod admin;
mod args;
mod bench;
mod blockers;
mod cluster;
mod config_file;
mod docs;
mod elect;
mod error;
mod hold;
mod lease;
mod operator;
mod output;
mod run;
mod serve;
mod signals;
mod stdout;
mod tree;
mod watch;

use std::process::ExitCode;

use args::{Admin, ClusterCommand, Command};
use error::{CliError, Exit};
use output::emit;

/// glibc's allocator slows down as the heap fills with millions of small
/// lease entries (its free lists grow: `_int_malloc` was the top symbol at
/// 10M live leases); mimalloc's per-size pages keep a request's allocations
/// cheap whatever the table's size. Its 2.x line (the workspace's `v2`
/// feature): 3.x rounds the table's 48-byte allocations (a resource's state,
/// a short name) up to 64 bytes and B-tree leaves from 192 to 224, about 40
/// bytes a lease (docs/performance.md, 2026-12-07).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// `baton run ...`, or `baton elect ... -- COMMAND`: a command line whose
/// usage errors exit 125, as GNU `timeout` does for its own failures.
fn runs_a_command(args: &[std::ffi::OsString]) -> bool {
    match args.get(1).and_then(|a| a.to_str()) {
        Some("run") => true,
        Some("elect") => args
            .iter()
            .position(|a| a == "--")
            .is_some_and(|i| i + 1 < args.len()),
        _ => false,
    }
}

fn main() -> ExitCode {
    // `args_os`: an argument that is not UTF-8 is a usage error that clap
    // reports (exit 2), not a panic in `std::env::args`.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json_asked = args.iter().any(|a| a == "--json");
    if let Err(message) = config_file::apply(&args) {
        return CliError::usage(message.to_string())
            .report(json_asked)
            .into();
    }
    let cli = match args::parse_from(&args) {
        Ok(cli) => cli,
        // `run` and `elect -- COMMAND` keep 124-127 for their own
        // outcomes: a bad flag is 125 (`elect` without a command keeps 2).
        Err(e) if runs_a_command(&args) => {
            return usage_error(e, json_asked, Exit::RunNotStarted).into()
        }
        Err(e) => return usage_error(e, json_asked, Exit::Usage).into(),
    };
    if let Command::ExecChild {
        parent,
        control_fd,
        command,
    } = &cli.command
    {
        // Before any runtime or thread: this process guards the command.
        return ExitCode::from(tree::guard(*parent, *control_fd, command));
    }
    let json = wants_json(&cli.command);
    let _logs = client_logs(&cli.command);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return CliError::failure(format!("cannot start the runtime: {e}"))
                .report(json)
                .into()
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => e.report(json).into(),
    }
}

/// A client command's logs on stderr, only when `RUST_LOG` asks for them
/// (`RUST_LOG=info`: a session's stream broken and resumed, a keeper's
/// renewal failed or its lease lost): its output stays its own otherwise.
/// `serve` sets up its own, `info` by default.
fn client_logs(command: &Command) -> Option<baton_telemetry::Telemetry> {
    let asked = std::env::var_os("RUST_LOG").is_some_and(|filter| !filter.is_empty());
    if !asked || matches!(command, Command::Serve(_)) {
        return None;
    }
    baton_telemetry::init(&baton_telemetry::Settings {
        service: "baton",
        default_filter: "off",
        ansi: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        otlp_endpoint: None,
    })
    .ok()
}

/// A flag clap refused: its own rendering on stderr (help and version go
/// to stdout with exit 0), and with `--json` also one error object.
fn usage_error(e: clap::Error, json: bool, code: Exit) -> Exit {
    if e.exit_code() == 0 {
        // --help or --version: not an error, always text.
        let _ = e.print();
        return Exit::Ok;
    }
    let rendered = e.render().to_string();
    if json {
        // The error's own lines, before the usage hint.
        let message: Vec<&str> = rendered
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .map(str::trim)
            .collect();
        let message = message.join(" ");
        error::print_json(message.trim_start_matches("error: "), code);
    }
    eprint!("{rendered}");
    code
}

fn wants_json(command: &Command) -> bool {
    match command {
        Command::Serve(_)
        | Command::ExecChild { .. }
        | Command::Completions { .. }
        | Command::Man { .. } => false,
        Command::Run(a) => a.client.json,
        Command::Elect(a) => a.client.json,
        Command::Observe { client, .. } => client.json,
        Command::Acquire { client, .. }
        | Command::Hold { client, .. }
        | Command::Renew { client, .. }
        | Command::Release { client, .. }
        | Command::Status { client, .. }
        | Command::List { client, .. }
        | Command::Fence { client, .. }
        | Command::Permits { client, .. }
        | Command::Watch { client, .. }
        | Command::Admin(Admin::Backup { client, .. }) => client.json,
        Command::Admin(Admin::Restore(a)) => a.json,
        Command::Bench(a) => a.client.json,
        Command::Cluster {
            command: ClusterCommand::Status { client },
        } => client.json,
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, CliError> {
    Ok(match command {
        Command::Run(args) => return Ok(ExitCode::from(run::run(&args).await?)),
        Command::Elect(args) => return Ok(ExitCode::from(elect::elect(&args).await?)),
        Command::Observe { name, once, client } => elect::observe(&client, &name, once).await?,
        Command::ExecChild {
            parent,
            control_fd,
            command,
        } => return Ok(ExitCode::from(tree::guard(parent, control_fd, &command))),
        Command::Serve(args) => serve::serve(args).await?,
        Command::Completions { shell } => {
            docs::completions(shell);
            Exit::Ok
        }
        Command::Man { dir } => {
            docs::man_pages(&dir)?;
            Exit::Ok
        }
        Command::Acquire {
            names,
            ttl,
            wait,
            shape,
            holder,
            client,
        } => emit(
            client.json,
            &lease::acquire(&client, &holder, &shape.claims(&names)?, ttl, wait).await?,
        ),
        Command::Hold {
            names,
            ttl,
            wait,
            shape,
            holder,
            client,
        } => {
            let claims = shape.claims(&names)?;
            hold::hold(&client, &holder, &claims, ttl.unwrap_or_default(), wait).await?
        }
        Command::Renew {
            name,
            acquisition,
            client,
        } => emit(
            client.json,
            &lease::renew(&client, &name, &acquisition).await?,
        ),
        Command::Release {
            name,
            acquisition,
            client,
        } => emit(
            client.json,
            &lease::release(&client, &name, &acquisition).await?,
        ),
        Command::Status { name, client } => {
            emit(client.json, &lease::status(&client, &name).await?)
        }
        Command::List {
            prefix,
            start_after,
            limit,
            client,
        } => emit(
            client.json,
            &lease::list(&client, &prefix, start_after.as_deref(), limit).await?,
        ),
        Command::Fence { name, client } => {
            emit(client.json, &operator::fence(&client, &name).await?)
        }
        Command::Permits {
            name,
            permits,
            client,
        } => emit(
            client.json,
            &operator::set_permits(&client, &name, permits).await?,
        ),
        Command::Watch {
            prefix,
            after_seq,
            once,
            client,
        } => watch::watch(&client, &prefix, (after_seq, once)).await?,
        Command::Admin(Admin::Backup { out, client }) => {
            emit(client.json, &admin::backup(&client, &out).await?)
        }
        Command::Admin(Admin::Restore(a)) => emit(a.json, &admin::restore(&a).await?),
        Command::Bench(a) => bench::bench(a).await?,
        Command::Cluster {
            command: ClusterCommand::Status { client },
        } => emit(client.json, &cluster::status(&client).await?),
    }
    .into())
}
