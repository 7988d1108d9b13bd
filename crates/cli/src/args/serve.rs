//! `baton serve`'s flags, and the command line with their defaults taken
//! from the server's own configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton_client::flags::{parse_duration, parse_positive_duration};
use clap::{Args, CommandFactory, FromArgMatches};

use super::Cli;

/// The command line, with `serve`'s defaults taken from the server's own
/// (`ServerConfig::default`, which holds `Limits::default`, and the
/// cluster's leader TTL): one source for every default, which `--help`,
/// the man pages and a config file all see.
pub fn command() -> clap::Command {
    let d = baton_server::ServerConfig::default();
    let l = &d.limits;
    let ms = |v: u64| baton_client::flags::format_duration(Duration::from_millis(v));
    let defaults = [
        ("listen", d.listen.to_string()),
        (
            "http_listen",
            d.http_listen.map(|a| a.to_string()).unwrap_or_default(),
        ),
        ("data_dir", d.data_dir.display().to_string()),
        ("log_size_mib", (d.log_len_bytes >> 20).to_string()),
        ("default_ttl", ms(d.default_ttl_ms)),
        ("ttl_min", ms(l.ttl_ms_min)),
        ("ttl_max", ms(l.ttl_ms_max)),
        ("wait_max", ms(l.wait_ms_max)),
        (
            "max_waiters_per_resource",
            l.n_waiters_per_resource_max.to_string(),
        ),
        ("max_waiters", l.n_waiters_max.to_string()),
        ("max_sessions", l.n_sessions_max.to_string()),
        ("watch_history", d.watch_history_len.to_string()),
        ("max_connections", d.connections_max.to_string()),
        ("handshake_timeout", ms(d.handshake_timeout_ms)),
        ("idle_timeout", ms(d.idle_timeout_ms)),
        (
            "max_resources_per_request",
            l.n_resources_per_request_max.to_string(),
        ),
        ("leader_ttl", ms(baton_server::LEADER_TTL_MS_DEFAULT)),
    ];
    Cli::command().mut_subcommand("serve", |serve| {
        defaults.into_iter().fold(serve, |serve, (id, value)| {
            serve.mut_arg(id, |a| a.default_value(value).required(false))
        })
    })
}

/// Parses `args` against [`command`].
pub fn parse_from(args: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
    Cli::from_arg_matches(&command().try_get_matches_from(args)?)
}

#[derive(Args)]
pub struct ServeArgs {
    /// A TOML file of these flags (keys like data_dir, default_ttl); a flag
    /// on the command line wins, then its BATON_* variable, then the file.
    #[arg(long, env = "BATON_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// gRPC address.
    #[arg(long, env = "BATON_LISTEN")]
    pub listen: SocketAddr,
    /// HTTP address for /healthz, /readyz, /metrics and the operator page.
    #[arg(long, env = "BATON_HTTP_LISTEN")]
    pub http_listen: SocketAddr,
    /// Another name the operator page and its API answer to (the Host a
    /// browser sends), besides the --http-listen address, the loopback
    /// names on loopback and the --advertise host; repeat it, or separate
    /// names with commas. Probes and /metrics answer any name.
    #[arg(long, env = "BATON_HTTP_ALLOW_HOST", value_delimiter = ',', value_parser = parse_allowed_host, value_name = "NAME")]
    pub http_allow_host: Vec<String>,
    /// Export OpenTelemetry traces (spans for acquire, grant, renew and
    /// release, joined to the client's trace) to this OTLP/HTTP collector,
    /// like http://127.0.0.1:4318. Off when not given.
    #[arg(long, env = "BATON_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Where the embedded store keeps its file.
    #[arg(long, env = "BATON_DATA_DIR")]
    pub data_dir: PathBuf,
    /// The least size of each of the embedded store's two write-ahead logs,
    /// in MiB (1 to 4096; a log already bigger keeps its size). Bigger logs
    /// take a bigger burst of writes, such as a million leases expiring
    /// after a restart, without a commit waiting for a fold; they cost
    /// twice this on disk, preallocated for new logs.
    #[arg(long, env = "BATON_LOG_SIZE_MIB", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub log_size_mib: u64,
    /// Lease duration when a client names none.
    #[arg(long, env = "BATON_DEFAULT_TTL", value_parser = parse_positive_duration)]
    pub default_ttl: Duration,
    /// Shortest lease duration accepted.
    #[arg(long, env = "BATON_TTL_MIN", value_parser = parse_positive_duration)]
    pub ttl_min: Duration,
    /// Longest lease duration accepted.
    #[arg(long, env = "BATON_TTL_MAX", value_parser = parse_positive_duration)]
    pub ttl_max: Duration,
    /// Longest time an acquire may wait in line.
    #[arg(long, env = "BATON_WAIT_MAX", value_parser = parse_duration)]
    pub wait_max: Duration,
    /// Most requests waiting on one resource; beyond, RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_MAX_WAITERS_PER_RESOURCE")]
    pub max_waiters_per_resource: usize,
    /// Most requests waiting in all.
    #[arg(long, env = "BATON_MAX_WAITERS")]
    pub max_waiters: usize,
    /// Most open sessions; beyond, opening one gets RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_MAX_SESSIONS")]
    pub max_sessions: usize,
    /// Holder changes kept for watchers that resume (`after_seq`), at most
    /// 1000000; a restart and a new leader keep them too. A watch resuming
    /// from an older number is told to take a new snapshot.
    #[arg(long, env = "BATON_WATCH_HISTORY", value_name = "CHANGES",
          value_parser = clap::value_parser!(u32).range(0..=baton_core::HISTORY_LEN_MAX as i64))]
    pub watch_history: u32,
    /// Most open client connections (a newcomer first evicts one that sent nothing).
    #[arg(long, env = "BATON_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// A new connection must send its first request within this long.
    #[arg(long, env = "BATON_HANDSHAKE_TIMEOUT", value_parser = parse_positive_duration)]
    pub handshake_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    #[arg(long, env = "BATON_IDLE_TIMEOUT", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,
    /// Most resources in one all-or-nothing acquire.
    #[arg(long, env = "BATON_MAX_RESOURCES_PER_REQUEST")]
    pub max_resources_per_request: usize,
    /// Keep the lease state in PostgreSQL instead of the data directory and
    /// serve as one server of a cluster (postgres://USER@HOST:PORT/DB, or
    /// key=value pairs; list several hosts with target_session_attrs=read-write
    /// to follow a database failover). Servers given the same database and
    /// --cluster elect one leader.
    #[arg(long, env = "BATON_STORE")]
    pub store: Option<String>,
    /// The cluster's name; a database holds the state of one cluster only.
    #[arg(
        long,
        env = "BATON_CLUSTER",
        default_value = "baton",
        requires = "store"
    )]
    pub cluster: String,
    /// The address clients should dial for this server, told to them by
    /// followers [default: http:// and --listen, if that is not 0.0.0.0 or ::].
    #[arg(long, env = "BATON_ADVERTISE", requires = "store")]
    pub advertise: Option<String>,
    /// A follower takes over when the leader has not renewed for this long;
    /// failover takes about this plus loading the leases.
    #[arg(long, env = "BATON_LEADER_TTL", value_parser = parse_positive_duration, requires = "store")]
    pub leader_ttl: Duration,
    /// Serve gRPC and HTTP over TLS with this certificate chain (PEM, leaf first).
    #[arg(long, env = "BATON_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "BATON_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM) on every gRPC
    /// connection; with --auth-file its common name names the principal.
    #[arg(long, env = "BATON_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Principals and their permissions per name prefix (TOML; reloaded on
    /// SIGHUP). Without it every caller may do everything.
    #[arg(long, env = "BATON_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// Quotas per name prefix (leases, waiters, watches, request rates)
    /// and per principal (sessions), in TOML; reloaded on SIGHUP. See
    /// docs/security.md.
    #[arg(long, env = "BATON_QUOTA_FILE")]
    pub quota_file: Option<PathBuf>,
    /// Refuse to start without --auth-file.
    #[arg(long, env = "BATON_REQUIRE_AUTH")]
    pub require_auth: bool,
    /// Also append the audit lines (fences, backups, refused calls) to this
    /// file, one JSON object per line.
    #[arg(long, env = "BATON_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
}

fn parse_allowed_host(raw: &str) -> Result<String, baton_server::BadHostName> {
    baton_server::check_allowed_name(raw)
}
