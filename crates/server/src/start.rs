//! One start-and-shutdown path for every server: the embedded one
//! ([`start`], [`start_with_store`]) and a cluster member
//! ([`start_cluster`]) differ only in their [`Role`], what runs beside the
//! ports (the engine thread, or the election that seats an engine per term).
//!
//! Order at start: the configuration is checked and the guards loaded
//! (every problem a person must fix fails here, before a port is bound),
//! then the ports are bound, SIGHUP is handled, the role starts, and the
//! gRPC port serves. Order at shutdown: the role steps down (a leader gives
//! up its term), the gRPC port stops and lets its requests finish (bounded
//! by [`SHUTDOWN_GRACE`]), then the role finishes (the engine flushes its
//! lazy writes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::server::leases_server::LeasesServer;
use baton_proto::REQUEST_LEN_BYTES_MAX;
use baton_store::{LeaseStore, RedbStore, StoreError};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::access::{guards, reload_on_sighup, Guards};
use crate::cluster::seat::Seat;
use crate::cluster::{self, ClusterConfig};
use crate::config::{validate, EngineFailure, ServerConfig, ServerError};
use crate::engine::{self, EngineHandle};
use crate::metrics::Metrics;
use crate::net::conn;
use crate::observed::Observed;
use crate::quota::Quotas;
use crate::{http, service};

/// How long a shutdown waits for in-flight requests (waiting acquires included).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

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

fn open_store(data_dir: &std::path::Path, log_len_bytes: u64) -> Result<RedbStore, ServerError> {
    RedbStore::open_with_log(data_dir, log_len_bytes).map_err(|source| ServerError::StoreOpen {
        data_dir: data_dir.display().to_string(),
        hint: recovery_hint(data_dir, &source),
        source: Box::new(source),
    })
}

/// Opens the embedded store under `config.data_dir` and starts serving.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    validate(&config)?;
    let store = open_store(&config.data_dir, config.log_len_bytes)?;
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
    let seat = Arc::new(Seat::single());
    let data_dir = config.data_dir.display().to_string();
    serve(
        config,
        guards,
        seat,
        move |config, (metrics, observed, quotas), seat| {
            let bounds = engine::Bounds {
                limits: config.limits.clone(),
                quotas: quotas.clone(),
                watch_history_len: config.watch_history_len,
            };
            let (engine, thread) =
                engine::Engine::start(store, bounds, metrics.clone(), observed.clone())?;
            seat.lead(engine.clone(), 0, u64::MAX);
            metrics.is_leader.set(1);
            observed
                .ready
                .store(true, std::sync::atomic::Ordering::Release);
            info!(%data_dir, "the embedded store is open");
            let join = tokio::task::spawn_blocking(move || thread.join());
            Ok(Role::Single { engine, join })
        },
    )
    .await
}

/// Starts one server of a cluster on PostgreSQL: checks the store (every
/// problem a person must fix fails here), binds the listeners and serves as
/// a follower until it wins leadership (see `cluster/`). It keeps running
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
    let seat = Arc::new(Seat::follower(
        baton_store_pg::random_id(),
        cluster.cluster.clone(),
    ));
    if let Some(e) = &unprepared {
        // Named from the first answer, not only after the first retry.
        seat.trouble(cluster::unreachable(e));
    }
    serve(config, guards, seat, move |config, (metrics, observed, quotas), seat| {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        info!(cluster = %cluster.cluster, node = %seat.node, advertise = %cluster.advertise, "serving as a cluster member");
        let election = cluster::Election::new(
            seat.clone(),
            (metrics.clone(), observed.clone()),
            engine::Bounds {
                limits: config.limits.clone(),
                quotas: quotas.clone(),
                watch_history_len: config.watch_history_len,
            },
            pg,
            cluster,
            unprepared.is_none(),
        );
        let election = tokio::spawn(election.run(stop_rx));
        Ok(Role::Member { stop, election })
    })
    .await
}

/// What runs beside the ports and decides who answers.
enum Role {
    /// The embedded server: one engine for the process's life.
    Single {
        engine: EngineHandle,
        join: JoinHandle<std::thread::Result<Result<(), StoreError>>>,
    },
    /// A cluster member: the election seats an engine per term.
    Member {
        stop: tokio::sync::watch::Sender<bool>,
        election: JoinHandle<Result<(), baton_store_pg::PgError>>,
    },
}

impl Role {
    /// Ends when the role stops by itself, which stops the server.
    async fn ended(&mut self) -> ServerError {
        match self {
            Role::Single { join, .. } => {
                let failure = engine_outcome(join.await)
                    .err()
                    .unwrap_or(EngineFailure::Unexpected);
                error!(%failure, "lease engine stopped; the server stops");
                failure.into()
            }
            Role::Member { election, .. } => match election.await {
                Ok(Err(e)) => ServerError::Cluster(e),
                _ => ServerError::Engine(EngineFailure::Unexpected),
            },
        }
    }

    /// Before the gRPC port stops: a leader gives up its term.
    async fn step_down(&mut self) {
        if let Role::Member { stop, election } = self {
            let _ = stop.send(true);
            let _ = election.await;
        }
    }

    /// After the last request: the engine flushes its lazy writes and stops.
    async fn finish(self) -> Result<(), ServerError> {
        match self {
            Role::Single { engine, join } => {
                engine.send(engine::Command::Shutdown);
                Ok(engine_outcome(join.await)?)
            }
            Role::Member { stop, .. } => {
                let _ = stop.send(true);
                Ok(())
            }
        }
    }
}

/// The path every server takes: metrics, ports and reloads, then `role`,
/// then the task that serves until a shutdown or until the role ends.
async fn serve(
    config: ServerConfig,
    guards: Guards,
    seat: Arc<Seat>,
    role: impl FnOnce(
        &ServerConfig,
        (&Arc<Metrics>, &Arc<Observed>, &Arc<Quotas>),
        &Arc<Seat>,
    ) -> Result<Role, ServerError>,
) -> Result<RunningServer, ServerError> {
    let metrics = Arc::new(Metrics::default());
    let observed = Arc::new(Observed::default());
    let (grpc, grpc_addr) = bind(config.listen).await?;
    let http_addr = serve_http(&config, (&metrics, &observed), &seat, &guards).await?;
    reload_on_sighup(&guards, &config)?;
    let quotas = guards.quotas.clone();
    metrics.watch_quotas(quotas.clone());
    let mut role = role(&config, (&metrics, &observed, &quotas), &seat)?;
    let (shutdown_tx, mut shutdown_rx) = oneshot::channel::<()>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serve = grpc_server(&config, seat, metrics.clone(), grpc, stop_rx, guards);
    info!(%grpc_addr, http_addr = %http_addr.map(|a| a.to_string()).unwrap_or_else(|| "off".into()), "baton serving");
    let task = tokio::spawn(async move {
        let mut serve = Box::pin(serve);
        let shutting_down = tokio::select! {
            r = &mut serve => Err(r),
            _ = &mut shutdown_rx => Ok(()),
            failure = role.ended() => return Err(failure),
        };
        let outcome = match shutting_down {
            Err(served) => served.map_err(|e| ServerError::Transport(e.to_string())),
            Ok(()) => {
                info!("shutting down");
                role.step_down().await;
                let _ = stop_tx.send(());
                finish_serving(&mut serve).await
            }
        };
        drop(serve);
        role.finish().await?;
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
    (metrics, observed): (&Arc<Metrics>, &Arc<Observed>),
    seat: &Arc<Seat>,
    guards: &Guards,
) -> Result<Option<SocketAddr>, ServerError> {
    let Some(addr) = config.http_listen else {
        return Ok(None);
    };
    let (listener, bound) = bind(addr).await?;
    let gate = guards.gate(metrics);
    let service = service::LeaseService::new(seat.clone(), metrics.clone(), config.default_ttl_ms)
        .guarded_by(gate.clone())
        .with_quotas(guards.quotas.clone());
    let state = http::HttpState {
        metrics: metrics.clone(),
        observed: observed.clone(),
        seat: seat.clone(),
        gate,
        service,
    };
    tokio::spawn(http::serve(
        listener,
        state,
        guards.http_tls.clone(),
        http::AllowedHosts::new(bound, &config.http_allowed_hosts),
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
        .guarded_by(guards.gate(&metrics))
        .with_quotas(guards.quotas.clone());
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

/// Binds `addr`, naming it in the error.
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    Ok((listener, bound))
}
