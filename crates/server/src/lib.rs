//! The Baton lease server.
//!
//! [`start`] binds the gRPC and HTTP listeners, recovers the lease state from
//! the store under the data directory and serves until
//! [`RunningServer::shutdown`] is called or the engine fails.
//!
//! I/O ordering (see ARCHITECTURE.md): a reply that carries a token, or that
//! follows a batch that issued one, is sent only after the batch's writes
//! were committed with fsync.
#![warn(missing_docs)]

mod audit;
mod auth;
mod cluster;
mod conn;
mod engine;
mod history;
mod http;
mod metrics;
mod penalty;
mod seat;
mod service;
mod tls;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_core::Limits;
use baton_proto::v1::leases_server::LeasesServer;
use baton_proto::REQUEST_LEN_BYTES_MAX;
use baton_store::{LeaseStore, RedbStore, StoreError};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tracing::{error, info};

pub use audit::{Audit, Record as AuditRecord};
pub use cluster::{ClusterConfig, LEADER_TTL_MS_DEFAULT, LEADER_TTL_MS_MIN};
pub use metrics::Metrics;
pub use seat::LEADER_METADATA;
pub use tls::TlsFiles;

use seat::Seat;

/// How long a shutdown waits for in-flight requests (waiting acquires included).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Everything `baton serve` can be told, validated by [`start`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The gRPC address.
    pub listen: SocketAddr,
    /// `/healthz`, `/readyz` and `/metrics`; `None` disables the HTTP port.
    pub http_listen: Option<SocketAddr>,
    /// Where [`start`] opens the embedded store (unused by [`start_with_store`]).
    pub data_dir: PathBuf,
    /// Bounds on names, TTLs, waits and waiters.
    pub limits: Limits,
    /// The TTL of an acquire that names none.
    pub default_ttl_ms: u64,
    /// Open connections; a request on one beyond it is `RESOURCE_EXHAUSTED`.
    pub connections_max: usize,
    /// A connection must send its first request within this long.
    pub handshake_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout_ms: u64,
    /// Serve both ports over TLS; `None`: plain TCP.
    pub tls: Option<TlsFiles>,
    /// Principals and their rules (reloaded on SIGHUP); `None`: auth off.
    pub auth_file: Option<PathBuf>,
    /// Refuse to start without `auth_file`.
    pub require_auth: bool,
    /// Also append audit lines to this file (JSON lines).
    pub audit_log: Option<PathBuf>,
}

/// Defaults for the connection rules (see `conn.rs`).
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// See [`HANDSHAKE_TIMEOUT_MS_DEFAULT`].
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 15 * 60_000;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7700".parse().expect("literal"),
            http_listen: Some("127.0.0.1:7701".parse().expect("literal")),
            data_dir: PathBuf::from("baton-data"),
            limits: Limits::default(),
            default_ttl_ms: 30_000,
            connections_max: 1_024,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            tls: None,
            auth_file: None,
            require_auth: false,
            audit_log: None,
        }
    }
}

impl ServerConfig {
    /// Loopback on an ephemeral port, no HTTP port, TTLs from 100 ms: for
    /// embedding the server in demos and tests.
    pub fn ephemeral(data_dir: PathBuf) -> Self {
        Self {
            listen: "127.0.0.1:0".parse().expect("literal"),
            http_listen: None,
            data_dir,
            limits: Limits {
                ttl_ms_min: 100,
                ..Limits::default()
            },
            default_ttl_ms: 30_000,
            connections_max: 256,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            tls: None,
            auth_file: None,
            require_auth: false,
            audit_log: None,
        }
    }
}

/// Why the server did not start or stopped.
#[allow(missing_docs)] // variant fields are named for what they hold; the messages explain them
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the lease store in {data_dir}: {source}{hint}")]
    StoreOpen {
        data_dir: String,
        source: Box<StoreError>,
        hint: String,
    },
    #[error("{0}")]
    Cluster(#[from] baton_store_pg::PgError),
    #[error("the lease engine stopped: {0}")]
    Engine(#[from] EngineFailure),
    #[error("transport error: {0}")]
    Transport(String),
}

/// Why the lease engine stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineFailure {
    /// A commit failed: its batch's callers heard "indeterminate", and the
    /// store is not trusted again (ARCHITECTURE.md).
    #[error("a store commit failed: {0}")]
    Store(#[from] StoreError),
    /// The engine thread panicked (a violated invariant).
    #[error("the engine thread panicked")]
    Panicked,
    /// The engine stopped while the server was still serving.
    #[error("the engine stopped unexpectedly")]
    Unexpected,
}

type EngineJoin = Result<std::thread::Result<Result<(), StoreError>>, tokio::task::JoinError>;

/// Flattens the engine thread's three layers of outcome into one.
fn engine_outcome(joined: EngineJoin) -> Result<(), EngineFailure> {
    match joined {
        Ok(Ok(stopped)) => Ok(stopped?),
        Ok(Err(_)) | Err(_) => Err(EngineFailure::Panicked),
    }
}

/// A started server; dropping it does not stop it, [`RunningServer::shutdown`] does.
pub struct RunningServer {
    /// The bound gRPC address (useful with port 0).
    pub grpc_addr: SocketAddr,
    /// The bound HTTP address, if the port is on.
    pub http_addr: Option<SocketAddr>,
    /// The server's counters and gauges.
    pub metrics: Arc<Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// Stops accepting, lets in-flight requests finish (bounded), flushes the store.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }

    /// Waits until the server stops by itself (engine failure) or is shut down.
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        (&mut self.task)
            .await
            .map_err(|_| ServerError::Engine(EngineFailure::Panicked))?
    }
}

fn validate(config: &ServerConfig) -> Result<(), ServerError> {
    let l = &config.limits;
    if l.ttl_ms_min == 0 || l.ttl_ms_min > l.ttl_ms_max {
        return Err(ServerError::Config(format!(
            "ttl bounds {}ms..{}ms are invalid: the minimum must be positive and not above the maximum",
            l.ttl_ms_min, l.ttl_ms_max
        )));
    }
    if config.default_ttl_ms < l.ttl_ms_min || config.default_ttl_ms > l.ttl_ms_max {
        return Err(ServerError::Config(format!(
            "default ttl {}ms is outside the bounds {}ms..{}ms",
            config.default_ttl_ms, l.ttl_ms_min, l.ttl_ms_max
        )));
    }
    if config.handshake_timeout_ms == 0 || config.idle_timeout_ms == 0 {
        return Err(ServerError::Config(
            "the handshake and idle timeouts must be positive".into(),
        ));
    }
    if config.connections_max == 0 || l.n_waiters_max == 0 || l.n_waiters_per_resource_max == 0 {
        return Err(ServerError::Config(
            "connection and waiter limits must be positive".into(),
        ));
    }
    if config.require_auth && config.auth_file.is_none() {
        return Err(ServerError::Config(
            "--require-auth is set but no --auth-file was given: refusing to serve without authentication".into(),
        ));
    }
    Ok(())
}

/// What guards the ports: TLS acceptors, the auth table and the audit sink.
struct Guards {
    grpc_tls: Option<tls::Tls>,
    http_tls: Option<tls::Tls>,
    auth: Arc<auth::Auth>,
    audit: Arc<audit::Audit>,
    /// Shared by both ports: a guesser is slowed wherever it guesses.
    penalties: Arc<penalty::Penalties>,
}

impl Guards {
    /// The server's one gatekeeper, for every entry point.
    fn gate(&self, metrics: &Arc<Metrics>) -> service::Gate {
        service::Gate::new(
            self.auth.clone(),
            self.audit.clone(),
            self.penalties.clone(),
            metrics.clone(),
        )
    }
}

/// Loads the certificates, the auth file and the audit log, or names the
/// file and the rule that stop the server from starting.
fn guards(config: &ServerConfig) -> Result<Guards, ServerError> {
    let (grpc_tls, http_tls) = match &config.tls {
        None => (None, None),
        Some(files) => {
            let grpc = tls::server_tls(files, &[b"h2"], true).map_err(ServerError::Config)?;
            let http =
                tls::server_tls(files, &[b"http/1.1"], false).map_err(ServerError::Config)?;
            (Some(grpc), Some(http))
        }
    };
    let auth = match &config.auth_file {
        Some(path) => {
            let auth = auth::Auth::load(path).map_err(|e| ServerError::Config(e.to_string()))?;
            warn_about_auth_file(path, &auth);
            auth
        }
        None => auth::Auth::off(),
    };
    let audit = match &config.audit_log {
        Some(path) => audit::Audit::to_file(path)
            .map_err(|e| ServerError::Config(format!("--audit-log {}: {e}", path.display())))?,
        None => audit::Audit::log_only(),
    };
    for (port, addr) in [("gRPC", Some(config.listen)), ("HTTP", config.http_listen)] {
        if let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) {
            if config.tls.is_none() {
                tracing::warn!(%addr, "the {port} port listens beyond loopback without TLS: tokens, acquisition ids and session ids cross the network in clear text (--tls-cert, --tls-key)");
            }
        }
    }
    if config.auth_file.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(addr = %config.listen, "auth is off: anyone who reaches the gRPC port may acquire, fence and back up any resource (--auth-file, --require-auth)");
    }
    Ok(Guards {
        grpc_tls,
        http_tls,
        auth: Arc::new(auth),
        audit: Arc::new(audit),
        penalties: Arc::default(),
    })
}

/// Says loudly what is wrong with the auth file in force: it grants
/// nothing to anybody (every call will be refused), or others may read or
/// write it.
fn warn_about_auth_file(path: &std::path::Path, auth: &auth::Auth) {
    if auth.table().is_some_and(|t| !t.grants_anything()) {
        tracing::warn!(path = %path.display(), "the auth file grants nothing to anybody: every call will be refused until it is fixed and reloaded (SIGHUP)");
    }
    if let Some(warning) = auth::file_mode_warning(path) {
        tracing::warn!("{warning}");
    }
}

/// Reloads the auth file and the TLS certificate, key and client CA on
/// every SIGHUP; a file that does not parse (or a key that does not match)
/// leaves what is in force unchanged, and the log says why. Connections
/// already accepted keep the certificate they were accepted with. The
/// handler is installed even with nothing to reload, so that a reload
/// never ends the server.
fn reload_on_sighup(guards: &Guards, config: &ServerConfig) -> Result<(), ServerError> {
    let auth_path = config.auth_file.clone();
    let ports: Vec<(&'static str, tls::Tls)> =
        [("gRPC", &guards.grpc_tls), ("HTTP", &guards.http_tls)]
            .into_iter()
            .filter_map(|(port, t)| t.clone().map(|t| (port, t)))
            .collect();
    // Installed even with nothing to reload: SIGHUP's default action ends
    // the process, and `systemctl reload` sends it.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| ServerError::Config(format!("cannot install the SIGHUP handler: {e}")))?;
    let auth = guards.auth.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if auth_path.is_none() && ports.is_empty() {
                info!("SIGHUP: nothing to reload (no auth file, no TLS)");
            }
            if let Some(path) = &auth_path {
                match auth.reload() {
                    Ok(n) => {
                        info!(path = %path.display(), principals = n, "auth file reloaded");
                        warn_about_auth_file(path, &auth);
                    }
                    Err(e) => {
                        error!(error = %e, "auth file not reloaded; the previous rules stay in force")
                    }
                }
            }
            for (port, tls) in &ports {
                match tls.reload() {
                    Ok(()) => info!(
                        port,
                        "TLS certificate, key and client CA reloaded; new connections use them"
                    ),
                    Err(e) => {
                        error!(port, error = %e, "TLS material not reloaded; the previous certificate stays in force")
                    }
                }
            }
        }
    });
    Ok(())
}

/// How to get out of a store that cannot be opened, if there is a way.
fn recovery_hint(data_dir: &std::path::Path, e: &StoreError) -> String {
    match e {
        StoreError::InUse { .. } | StoreError::Io { .. } => String::new(),
        _ => format!(
            "\nto recover: with no server running on it, `baton admin restore --data-dir {dir} --from BACKUP` \
             (or `--empty` if there is no backup; add `--floor-from DATABASE_URL` to start above every token \
             your resources recorded): the restore starts a new token epoch above every token this directory issued",
            dir = data_dir.display()
        ),
    }
}

fn open_store(data_dir: &std::path::Path) -> Result<RedbStore, ServerError> {
    RedbStore::open(data_dir).map_err(|source| ServerError::StoreOpen {
        data_dir: data_dir.display().to_string(),
        hint: recovery_hint(data_dir, &source),
        source: Box::new(source),
    })
}

/// Opens the embedded store under `config.data_dir` and starts serving.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    validate(&config)?;
    let store = open_store(&config.data_dir)?;
    start_with_store(config, Box::new(store)).await
}

/// Starts serving on any [`LeaseStore`]: binds the listeners, recovers the
/// lease state from `store`, and serves until shut down or until a commit
/// fails (then [`RunningServer::wait`] returns the engine's error).
pub async fn start_with_store(
    config: ServerConfig,
    store: Box<dyn LeaseStore>,
) -> Result<RunningServer, ServerError> {
    validate(&config)?;
    let guards = guards(&config)?;
    let metrics = Arc::new(Metrics::default());
    let (grpc, grpc_addr) = bind(config.listen).await?;
    let seat = Arc::new(Seat::single());
    let http_addr = serve_http(&config, &metrics, &seat, &guards).await?;
    reload_on_sighup(&guards, &config)?;
    let (engine, engine_thread) =
        engine::Engine::start(store, config.limits.clone(), metrics.clone())?;
    let engine_stop = engine.clone();
    seat.lead(engine, 0, u64::MAX);
    metrics.is_leader.set(1);
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serve = grpc_server(&config, seat, metrics.clone(), grpc, stop_rx, guards);
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    info!(%grpc_addr, http_addr = %http_addr.map(|a| a.to_string()).unwrap_or_else(|| "off".into()), data_dir = %config.data_dir.display(), "baton serving");
    let task = tokio::spawn(async move {
        let mut engine_join = tokio::task::spawn_blocking(move || engine_thread.join());
        let mut serve = Box::pin(serve);
        let mut shutdown_rx = shutdown_rx;
        let outcome = tokio::select! {
            r = &mut serve => r.map_err(|e| ServerError::Transport(e.to_string())),
            _ = &mut shutdown_rx => {
                info!("shutting down");
                let _ = stop_tx.send(());
                finish_serving(&mut serve).await
            }
            joined = &mut engine_join => {
                let failure = engine_outcome(joined).err().unwrap_or(EngineFailure::Unexpected);
                error!(%failure, "lease engine stopped; the server stops");
                return Err(failure.into());
            }
        };
        drop(serve);
        engine_stop.send(engine::Command::Shutdown);
        engine_outcome(engine_join.await)?;
        outcome
    });
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        metrics,
        shutdown: Some(shutdown_tx),
        task,
    })
}

/// Starts one server of a cluster on PostgreSQL: checks the store (every
/// problem a person must fix fails here), binds the listeners and serves as
/// a follower until it wins leadership (see `cluster.rs`). It keeps running
/// through database outages and lost terms; only [`RunningServer::shutdown`]
/// stops it, stepping down first if it leads.
pub async fn start_cluster(
    config: ServerConfig,
    cluster: ClusterConfig,
) -> Result<RunningServer, ServerError> {
    validate(&config)?;
    cluster::validate(&cluster)?;
    let guards = guards(&config)?;
    let (pg, unprepared) = cluster::prepare(&cluster).await?;
    let metrics = Arc::new(Metrics::default());
    let (grpc, grpc_addr) = bind(config.listen).await?;
    let seat = Arc::new(Seat::follower(
        baton_store_pg::random_id(),
        cluster.cluster.clone(),
    ));
    if let Some(e) = &unprepared {
        // Named from the first answer, not only after the first retry.
        seat.trouble(cluster::unreachable(e));
    }
    let http_addr = serve_http(&config, &metrics, &seat, &guards).await?;
    reload_on_sighup(&guards, &config)?;
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serve = grpc_server(
        &config,
        seat.clone(),
        metrics.clone(),
        grpc,
        stop_rx,
        guards,
    );
    let (election_stop, election_stop_rx) = tokio::sync::watch::channel(false);
    let node = seat.node.clone();
    let election = cluster::Election::new(
        seat,
        metrics.clone(),
        config.limits.clone(),
        pg,
        cluster.clone(),
        unprepared.is_none(),
    );
    let mut election = tokio::spawn(election.run(election_stop_rx));
    info!(%grpc_addr, http_addr = %http_addr.map(|a| a.to_string()).unwrap_or_else(|| "off".into()), cluster = %cluster.cluster, %node, advertise = %cluster.advertise, "baton serving as a cluster member");
    let task = tokio::spawn(async move {
        let mut serve = Box::pin(serve);
        let mut shutdown_rx = shutdown_rx;
        let outcome = tokio::select! {
            r = &mut serve => r.map_err(|e| ServerError::Transport(e.to_string())),
            _ = &mut shutdown_rx => {
                info!("shutting down");
                let _ = election_stop.send(true);
                let _ = (&mut election).await;
                let _ = stop_tx.send(());
                finish_serving(&mut serve).await
            }
            ended = &mut election => match ended {
                Ok(Err(e)) => Err(ServerError::Cluster(e)),
                _ => Err(ServerError::Engine(EngineFailure::Unexpected)),
            },
        };
        let _ = election_stop.send(true);
        outcome
    });
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        metrics,
        shutdown: Some(shutdown_tx),
        task,
    })
}

/// Binds the HTTP port, if configured, and serves it for the process's life.
async fn serve_http(
    config: &ServerConfig,
    metrics: &Arc<Metrics>,
    seat: &Arc<Seat>,
    guards: &Guards,
) -> Result<Option<SocketAddr>, ServerError> {
    let Some(addr) = config.http_listen else {
        return Ok(None);
    };
    let (listener, bound) = bind(addr).await?;
    let gate = guards.gate(metrics);
    let service = service::LeaseService::new(seat.clone(), metrics.clone(), config.default_ttl_ms)
        .guarded_by(gate.clone());
    tokio::spawn(http::serve(
        listener,
        metrics.clone(),
        seat.clone(),
        guards.http_tls.clone(),
        gate,
        service,
    ));
    Ok(Some(bound))
}

/// Lets the gRPC server (already told to stop) finish its in-flight
/// requests, for at most the shutdown grace.
async fn finish_serving(
    serve: &mut (impl std::future::Future<Output = Result<(), tonic::transport::Error>> + Unpin),
) -> Result<(), ServerError> {
    match tokio::time::timeout(SHUTDOWN_GRACE, serve).await {
        Ok(r) => r.map_err(|e| ServerError::Transport(e.to_string())),
        Err(_) => Ok(()),
    }
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    Ok((listener, bound))
}

/// The gRPC service behind the connection rules, served until `stop`.
fn grpc_server(
    config: &ServerConfig,
    seat: Arc<Seat>,
    metrics: Arc<Metrics>,
    grpc: TcpListener,
    stop: oneshot::Receiver<()>,
    guards: Guards,
) -> impl std::future::Future<Output = Result<(), tonic::transport::Error>> {
    // Session streams never end by themselves: on shutdown they are told
    // to go (their sessions live on, to be resumed elsewhere or after a
    // restart) instead of holding the shutdown for its whole grace.
    let closing = tokio_util::sync::CancellationToken::new();
    let service = service::LeaseService::new(seat, metrics.clone(), config.default_ttl_ms)
        .closing_on(closing.clone())
        .guarded_by(guards.gate(&metrics));
    let grpc_service = conn::Tracked {
        inner: tonic::service::interceptor::InterceptedService::new(
            LeasesServer::new(service).max_decoding_message_size(REQUEST_LEN_BYTES_MAX),
            conn::check,
        ),
    };
    let registry = conn::Registry::new(
        conn::ConnLimits {
            connections_max: config.connections_max,
            handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms),
        },
        metrics,
    );
    let incoming = conn::incoming(grpc, registry, guards.grpc_tls);
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(grpc_service)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.await;
            closing.cancel();
        })
}
