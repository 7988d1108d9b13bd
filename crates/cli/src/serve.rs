//! `baton serve`: flags into a validated server configuration, then run
//! until SIGTERM, Ctrl-C or an engine failure.

use std::time::Duration;

use baton_core::Limits;

use crate::args::ServeArgs;
use crate::error::{CliError, Exit};

/// Logs on stderr (`RUST_LOG`, `info` by default) and, with
/// `--otlp-endpoint`, traces; the guard flushes the traces when dropped.
fn init_telemetry(args: &ServeArgs) -> Result<baton_telemetry::Telemetry, CliError> {
    baton_telemetry::init(&baton_telemetry::Settings {
        service: "baton serve",
        default_filter: "info",
        ansi: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        otlp_endpoint: args.otlp_endpoint.as_deref(),
    })
    .map_err(|e| CliError::usage(e.to_string()))
}

/// The cluster configuration, if `--store` was given.
fn cluster_config(args: &ServeArgs) -> Result<Option<baton_server::ClusterConfig>, CliError> {
    let Some(store_url) = args.store.clone() else {
        return Ok(None);
    };
    let advertise = match &args.advertise {
        Some(a) => a.clone(),
        None if args.listen.ip().is_unspecified() => {
            return Err(CliError::usage(format!(
                "--advertise is required with --store when --listen is {}: followers must tell clients an address they can dial",
                args.listen
            )))
        }
        None if args.tls_cert.is_some() => format!("https://{}", args.listen),
        None => format!("http://{}", args.listen),
    };
    Ok(Some(baton_server::ClusterConfig {
        store_url,
        cluster: args.cluster.clone(),
        advertise,
        leader_ttl_ms: args.leader_ttl.as_millis() as u64,
    }))
}

/// The server configuration the flags describe.
pub fn config(args: ServeArgs) -> baton_server::ServerConfig {
    let ms = |d: Duration| d.as_millis() as u64;
    let mut http_allowed_hosts = args.http_allow_host;
    http_allowed_hosts.extend(args.advertise.as_deref().and_then(advertised_host));
    baton_server::ServerConfig {
        listen: args.listen,
        http_listen: Some(args.http_listen),
        http_allowed_hosts,
        data_dir: args.data_dir,
        log_len_bytes: args.log_size_mib << 20,
        limits: Limits {
            ttl_ms_min: ms(args.ttl_min),
            ttl_ms_max: ms(args.ttl_max),
            wait_ms_max: ms(args.wait_max),
            n_resources_per_request_max: args.max_resources_per_request,
            n_waiters_per_resource_max: args.max_waiters_per_resource,
            n_waiters_max: args.max_waiters,
            n_sessions_max: args.max_sessions,
        },
        watch_history_len: args.watch_history as usize,
        default_ttl_ms: ms(args.default_ttl),
        connections_max: args.max_connections,
        handshake_timeout_ms: ms(args.handshake_timeout),
        idle_timeout_ms: ms(args.idle_timeout),
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(baton_server::TlsFiles {
                cert,
                key,
                client_ca: args.tls_client_ca,
            }),
            _ => None,
        },
        auth_file: args.auth_file,
        quota_file: args.quota_file,
        require_auth: args.require_auth,
        audit_log: args.audit_log,
    }
}

/// The host of an `--advertise` address (`http://HOST:PORT`, `HOST:PORT`,
/// `[V6]:PORT`), as the page compares names; `None` if it has none.
fn advertised_host(advertise: &str) -> Option<String> {
    let rest = advertise.split_once("://").map_or(advertise, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next()?),
        None => authority.split(':').next()?.to_string(),
    };
    baton_server::check_allowed_name(&host).ok()
}

/// `baton serve`. Prints one "baton listening" line once it serves.
pub async fn serve(args: ServeArgs) -> Result<Exit, CliError> {
    let _telemetry = init_telemetry(&args)?;
    no_transparent_huge_pages();
    let cluster = cluster_config(&args)?;
    let started = match cluster {
        Some(cluster) => {
            if args.listen.port() == 0 && args.advertise.is_none() {
                return Err(CliError::usage(
                    "--advertise is required with --store when --listen has port 0",
                ));
            }
            baton_server::start_cluster(config(args), cluster).await
        }
        None => baton_server::start(config(args)).await,
    };
    let mut server = started.map_err(|e| match e {
        baton_server::ServerError::Config(_) => CliError::usage(e.to_string()),
        other => CliError::failure(other.to_string()),
    })?;
    let http = server.http_addr.map(|a| a.to_string()).unwrap_or_default();
    println!("baton listening grpc={} http={http}", server.grpc_addr);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::failure(format!("cannot install SIGTERM handler: {e}")))?;
    let stopped = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        r = server.wait() => Some(r),
    };
    let result = match stopped {
        Some(r) => r,
        None => server.shutdown().await,
    };
    result.map_err(|e| CliError::failure(e.to_string()))?;
    Ok(Exit::Ok)
}

/// Turns transparent huge pages off for this process. The allocator asks
/// the kernel for them, and the first touch of one zeroes 2 MiB inside the
/// page fault: a thread that faults while it holds the lease table (or
/// answers a caller) waits for that, and for its turn on a busy core
/// after it. With a million leases expiring after a restart, threads
/// waited 20-50 ms in such faults (`perf sched timehist`, in
/// docs/performance.md); with 4 KiB pages the same zeroing comes in
/// small pieces. Redis and most databases advise the same.
fn no_transparent_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off; page faults may stall callers");
    }
}
