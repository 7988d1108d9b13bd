//! `baton bench --event EVENT`: the worst moments of the lease path while
//! something heavy happens beside it (see `baton_bench::EventRun`).

use serde::Serialize;

use super::{failed, Args, BenchError, Endpoint, Event};
use crate::{Baton, EventReport, EventRun, Transport, Window};

/// Backups in a row for `--event backup`.
const BACKUPS: usize = 3;
/// Leases of the session that `--event session-end` closes.
const SESSION_LEASES: usize = 100_000;
/// Resources per acquire while that session fills (the server's limit).
const SESSION_LEASES_PER_REQUEST: usize = 64;

/// One window in `--json`.
#[derive(Serialize)]
struct WindowJson {
    window: &'static str,
    length_ms: u64,
    cycles_per_s: f64,
    acquire_max_us: u64,
    acquire_p999_us: u64,
    readyz_max_us: Option<u64>,
    errors: u64,
}

fn json_of(name: &'static str, w: &Window) -> WindowJson {
    WindowJson {
        window: name,
        length_ms: w.length.as_millis() as u64,
        cycles_per_s: w.cycles_per_s,
        acquire_max_us: w.acquire_max_us,
        acquire_p999_us: w.acquire_p999_us,
        readyz_max_us: w.readyz_max_us,
        errors: w.errors,
    }
}

fn line(name: &str, w: &Window) -> String {
    let ms = |us: u64| format!("{:.1}ms", us as f64 / 1000.0);
    format!(
        "{name:<8} {:>8.1}s {:>10.0} {:>10} {:>10} {:>11} {:>6}",
        w.length.as_secs_f64(),
        w.cycles_per_s,
        ms(w.acquire_max_us),
        ms(w.acquire_p999_us),
        w.readyz_max_us.map_or("-".to_string(), ms),
        w.errors
    )
}

/// `baton bench --event EVENT`.
pub(super) async fn stalls(
    a: &Args,
    to: &Endpoint,
    json: bool,
    event: Event,
) -> Result<(), BenchError> {
    let clients = a.cycle.clients.first();
    let target = Baton::new("baton session", to.server.clone(), a.cycle.ttl)
        .with_transport(Transport::SessionSharedConnection)
        .with_options(to.options.clone());
    let run = EventRun {
        target: &target,
        clients,
        settle: a.settle,
        http: a.http,
    };
    let run_id = std::process::id().to_string();
    let report = match event {
        Event::Backup => {
            let out = backup_file(&run_id);
            // `baton admin backup` as its own process, as an operator
            // runs it: its decoding and writing stay off this process's
            // clients.
            let backups = async {
                for _ in 0..BACKUPS {
                    let status = tokio::process::Command::new(&to.baton)
                        .args(["admin", "backup", "--server", &to.server])
                        .arg("--out")
                        .arg(&out)
                        .stdout(std::process::Stdio::null())
                        .status()
                        .await?;
                    if !status.success() {
                        return Err(std::io::Error::other(format!("admin backup: {status}")));
                    }
                }
                let _ = std::fs::remove_file(&out);
                Ok(())
            };
            let label = format!("{BACKUPS} backups in a row");
            run.around(&label, backups, &run_id).await
        }
        Event::SessionEnd => {
            // Set up before the clients start: one session holding
            // SESSION_LEASES leases, closed as the event.
            let session = big_session(to).await?;
            let close = close_and_drain(session, a.http);
            let label = format!("a session of {SESSION_LEASES} leases closes");
            run.around(&label, close, &run_id).await
        }
        // The baseline: the same windows with nothing in the middle.
        Event::None => {
            let quiet = async {
                tokio::time::sleep(a.settle).await;
                Ok::<(), std::convert::Infallible>(())
            };
            run.around("no event", quiet, &run_id).await
        }
    }
    .map_err(failed)?;
    print(&report, json, clients);
    Ok(())
}

fn print(report: &EventReport, json: bool, clients: usize) {
    let windows = [
        ("before", &report.before),
        ("during", &report.during),
        ("after", &report.after),
    ];
    if json {
        #[derive(Serialize)]
        struct Out<'a> {
            event: &'a str,
            clients: usize,
            windows: Vec<WindowJson>,
        }
        let out = Out {
            event: &report.event,
            clients,
            windows: windows.iter().map(|(n, w)| json_of(n, w)).collect(),
        };
        println!(
            "{}",
            serde_json::to_string(&out).expect("output types serialize")
        );
        return;
    }
    println!(
        "{}: C={clients} session clients cycling on distinct resources",
        report.event
    );
    println!(
        "{:<8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>6}",
        "window", "length", "cycles/s", "acq max", "acq p99.9", "readyz max", "errors"
    );
    for (name, w) in windows {
        println!("{}", line(name, w));
    }
}

/// Where the backups go: tmpfs where there is one, so that the figures
/// show the server's stalls, not the disk writing 50 MB files back while
/// the server's commits wait for the same disk.
fn backup_file(run_id: &str) -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("baton-bench-backup-{run_id}.json"))
}

/// Closes the big session; with the server's HTTP address, lasts until
/// the server has dropped the last of its leases (it answers the close
/// after the first batch).
async fn close_and_drain(
    session: baton_client::Session,
    http: Option<std::net::SocketAddr>,
) -> std::io::Result<()> {
    session
        .close()
        .await
        .map_err(|e| std::io::Error::other(format!("close: {e}")))?;
    match http {
        Some(addr) => crate::until_no_leases_ending(addr).await,
        None => Ok(()),
    }
}

/// A session on the server that holds [`SESSION_LEASES`] leases, on
/// resources of its own: the setup of `--event session-end`.
async fn big_session(to: &Endpoint) -> Result<baton_client::Session, BenchError> {
    let client = baton_client::Client::connect_with(&to.server, to.options.clone())
        .await?
        .with_rpc_timeout(to.rpc_timeout);
    let session = client
        .open_session(std::time::Duration::from_secs(60))
        .await?;
    let prefix = format!("bench:{}:session", std::process::id());
    let names: Vec<String> = (0..SESSION_LEASES)
        .map(|i| format!("{prefix}:{i:06}"))
        .collect();
    for chunk in names.chunks(SESSION_LEASES_PER_REQUEST) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        match session
            .acquire_all(&refs, std::time::Duration::ZERO)
            .await?
        {
            baton_client::AcquiredAll::Granted { .. } => {}
            other => {
                return Err(failed(format!(
                    "the session's leases: not granted: {other:?}"
                )))
            }
        }
    }
    Ok(session)
}
