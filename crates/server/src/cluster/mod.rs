//! Several servers on one PostgreSQL database: the election task.
//!
//! Every server runs this loop. As a follower it reads the leadership row
//! every `poll` interval, reports itself in the members table, and takes
//! over when the row has not changed for a full leadership TTL on its own
//! monotonic clock (`baton_store_pg::election`). As leader it loads the
//! leases into a new engine (each gets its full TTL again from the
//! takeover), seats it, and renews the row; the seat stops answering at
//! `renewal sent + ttl - margin` unless a later renewal succeeded. A lost
//! renewal, a refused or failed commit, or a deadline that passed ends the
//! term: the seat goes back to following, the engine is dropped, and the
//! loop starts over (PostgreSQL coming back is picked up by itself).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Bounds;
use baton_store::StoreError;
use baton_store_pg::election::{Timing, Verdict, Watch};
use baton_store_pg::{leader, PgError, PgLeaseStore};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::engine::{Command, Engine, EngineHandle};
pub(crate) mod seat;

use crate::config::ServerError;
use crate::metrics::Metrics;
use crate::observed::Observed;
use seat::Seat;

/// What `baton serve --store` is told.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The PostgreSQL connection string (URL or key=value; several hosts
    /// with `target_session_attrs=read-write` follow a database failover).
    pub store_url: String,
    /// The cluster's name; a database holds one cluster's state.
    pub cluster: String,
    /// The address clients should use for this server (`http://host:port`).
    pub advertise: String,
    /// How long the leadership row must go unchanged before a follower takes over.
    pub leader_ttl_ms: u64,
}

/// The shortest leadership TTL accepted (renewals every quarter of it).
pub const LEADER_TTL_MS_MIN: u64 = 400;
/// The default leadership TTL.
pub const LEADER_TTL_MS_DEFAULT: u64 = 4_000;

pub(crate) fn validate(c: &ClusterConfig) -> Result<(), ServerError> {
    if !(LEADER_TTL_MS_MIN..=600_000).contains(&c.leader_ttl_ms) {
        return Err(ServerError::Config(format!(
            "leader ttl {}ms is outside {LEADER_TTL_MS_MIN}ms..600s",
            c.leader_ttl_ms
        )));
    }
    let ok_scheme = c.advertise.starts_with("http://") || c.advertise.starts_with("https://");
    let printable = c.advertise.bytes().all(|b| b.is_ascii_graphic());
    if !ok_scheme || !printable || c.advertise.len() > 256 {
        return Err(ServerError::Config(format!(
            "advertise address {:?} must be an http:// or https:// address of at most 256 printable characters, as clients should dial it",
            c.advertise
        )));
    }
    Ok(())
}

/// Connects and creates or checks the schema: every problem a person must
/// fix (address, privileges, a newer schema, another cluster) fails here.
/// A database that cannot be reached yet is not one of them: the server
/// starts as a follower that says so, and checks the schema once it can.
pub(crate) async fn prepare(
    c: &ClusterConfig,
) -> Result<(baton_store_pg::PgTarget, Option<PgError>), ServerError> {
    let pg = baton_store_pg::parse_url(&c.store_url)?;
    match prepare_schema(&pg, &c.cluster).await {
        Ok(()) => Ok((pg, None)),
        Err(e) if e.is_transient() => {
            warn!(error = %e, "the store database is not reachable yet; serving as a follower until it is");
            Ok((pg, Some(e)))
        }
        Err(e) => Err(e.into()),
    }
}

/// What callers hear while the store cannot be reached.
pub(crate) fn unreachable(e: &PgError) -> String {
    format!("its PostgreSQL store is unreachable ({e}); retry shortly")
}

async fn prepare_schema(pg: &baton_store_pg::PgTarget, cluster: &str) -> Result<(), PgError> {
    let mut client = baton_store_pg::connect(pg).await?;
    let meta = baton_store_pg::schema::prepare(&mut client, cluster).await?;
    info!(cluster = %meta.cluster, store_id = %meta.store_id, "store schema ready");
    Ok(())
}

pub(crate) struct Election {
    pub seat: Arc<Seat>,
    pub metrics: Arc<Metrics>,
    /// The page's history (its engines record there) and readiness.
    pub observed: Arc<Observed>,
    /// The limits, quotas and history every engine of this server has.
    pub bounds: Bounds,
    pub pg: baton_store_pg::PgTarget,
    pub config: ClusterConfig,
    client: Option<tokio_postgres::Client>,
    timing: Timing,
    watch: Watch,
    /// Whether the last attempt to reach the database failed (log once per outage).
    outage: bool,
    /// The highest token position this process saw committed in the store.
    /// A takeover that finds the store below it (the database lost
    /// acknowledged commits: an asynchronous standby promoted, a restore
    /// from an older dump) refuses to serve.
    floor: u64,
    /// Whether the schema was created or checked (at start, or once the
    /// database could be reached).
    prepared: bool,
    /// Set once such a rollback was seen: this server does not lead until
    /// the store's position is back at the floor (after a restore).
    rolled_back: Option<String>,
}

impl Election {
    pub fn new(
        seat: Arc<Seat>,
        (metrics, observed): (Arc<Metrics>, Arc<Observed>),
        bounds: Bounds,
        pg: baton_store_pg::PgTarget,
        config: ClusterConfig,
        prepared: bool,
    ) -> Self {
        let timing = Timing {
            ttl_ms: config.leader_ttl_ms,
        };
        let watch = Watch::new(timing, &seat.node);
        Self {
            seat,
            metrics,
            observed,
            bounds,
            pg,
            config,
            client: None,
            timing,
            watch,
            outage: false,
            floor: 0,
            prepared,
            rolled_back: None,
        }
    }

    async fn client(&mut self) -> Result<&tokio_postgres::Client, PgError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = Some(baton_store_pg::connect(&self.pg).await?);
        }
        Ok(self.client.as_ref().expect("just connected"))
    }

    fn trouble(&mut self, what: &str, e: &PgError) {
        self.client = None;
        if !self.outage {
            warn!(error = %e, "{what}; retrying until the database answers");
        }
        self.outage = true;
        if !self.seat.is_leader() {
            self.seat.trouble(format!(
                "its PostgreSQL store is unreachable ({e}); retry shortly"
            ));
        }
    }

    /// Runs until `stop` turns true (then steps down if leading), or until
    /// the schema, checked late, turns out to need a person.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), PgError> {
        let poll = Duration::from_millis(self.timing.poll_interval_ms());
        while !*stop.borrow() {
            if !self.prepared {
                match prepare_schema(&self.pg, &self.config.cluster).await {
                    Ok(()) => self.prepared = true,
                    Err(e) if e.is_transient() => {
                        self.trouble("cannot prepare the store schema", &e);
                        tokio::select! {
                            _ = tokio::time::sleep(poll) => {}
                            _ = stop.changed() => {}
                        }
                        continue;
                    }
                    Err(e) => {
                        error!(error = %e, "the store cannot be used; stopping");
                        return Err(e);
                    }
                }
            }
            match self.follow_once().await {
                Ok(Some((term, sent_ms))) => {
                    if self.lead(term, sent_ms, &mut stop).await {
                        return Ok(());
                    }
                    continue;
                }
                Ok(None) => {
                    if self.outage {
                        info!("store database reachable again");
                    }
                    self.outage = false;
                }
                Err(e) => self.trouble("cannot read the leadership row", &e),
            }
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = stop.changed() => {}
            }
        }
        Ok(())
    }

    /// One follower round: read, report, maybe take over. The new term and
    /// the instant (seat ms) its takeover was sent.
    async fn follow_once(&mut self) -> Result<Option<(u64, u64)>, PgError> {
        let node = self.seat.node.clone();
        let advertise = self.config.advertise.clone();
        let client = self.client().await?;
        let row = leader::read(client).await?;
        let position = leader::position(client).await?;
        leader::report(client, &node, &advertise).await?;
        let members = leader::members(client).await?;
        let known = row.holder.is_some() && row.holder.as_deref() != Some(node.as_str());
        let leader_addr = if known { row.advertise.clone() } else { None };
        self.seat.follow(leader_addr.clone());
        self.metrics.leader_term.set(row.term as i64);
        self.seat.set_view(|v| {
            v.term = row.term;
            v.leader_node = row.holder.clone();
            v.leader = leader_addr;
            v.members = members
                .iter()
                .map(|m| (m.node.clone(), m.advertise.clone(), m.seen_ms_ago))
                .collect();
        });
        if let Some(why) = self.rolled_back.clone() {
            if position < self.floor {
                self.seat.trouble(why);
                return Ok(None);
            }
            info!(
                position,
                "the store's token position is back above what this server saw; it may lead again"
            );
            self.rolled_back = None;
        }
        self.floor = self.floor.max(position);
        if self.watch.observe(self.seat.now_ms(), &row) == Verdict::Wait {
            return Ok(None);
        }
        let sent_ms = self.seat.now_ms();
        let client = self.client.as_mut().expect("connected above");
        let Some(won) = leader::take_over(client, &row, &node, &advertise).await? else {
            return Ok(None);
        };
        if won.position < self.floor {
            let why = format!(
                "the store's token position {} is below {} which this server saw committed: the database lost acknowledged commits (an asynchronous standby promoted, or a restore from an older copy); run `baton admin restore --store ...` to start a new epoch",
                won.position, self.floor
            );
            error!(term = won.term, "{why}; refusing to lead");
            self.rolled_back = Some(why.clone());
            self.watch.ended_own_term(won.term);
            let _ = leader::step_down(client, won.term, &node).await;
            self.seat.trouble(why);
            return Ok(None);
        }
        Ok(Some((won.term, sent_ms)))
    }

    /// Leads `term` until it ends. True if the server is stopping.
    async fn lead(&mut self, term: u64, sent_ms: u64, stop: &mut watch::Receiver<bool>) -> bool {
        let deadline_ms = self.timing.deadline_ms(sent_ms);
        self.metrics.leader_changes.inc();
        self.metrics.leader_term.set(term as i64);
        info!(term, "won leadership; loading leases");
        let started = Instant::now();
        let (engine, thread) = match self.load(term).await {
            Ok(e) => e,
            Err(e) => {
                error!(term, error = %e, "cannot load the leases; giving up the term");
                self.end_term(term, true).await;
                return false;
            }
        };
        if !Timing::answers(self.seat.now_ms(), deadline_ms) {
            warn!(
                term,
                "loading outlasted the leadership deadline; giving up the term"
            );
            engine.send(Command::Shutdown);
            self.end_term(term, true).await;
            return false;
        }
        self.take_seat(term, &engine, deadline_ms);
        info!(
            term,
            load_ms = started.elapsed().as_millis() as u64,
            "leading"
        );
        let mut joined = tokio::task::spawn_blocking(move || thread.join());
        let stopping = self
            .keep_leading(term, deadline_ms, &mut joined, stop)
            .await;
        engine.send(Command::Shutdown);
        if stopping {
            // Flush the lazy writes under this term before stepping down.
            self.seat.follow(None);
            let _ = tokio::time::timeout(Duration::from_secs(3), joined).await;
        }
        self.end_term(term, stopping).await;
        stopping
    }

    /// Loads the leases under `term` into a new engine.
    async fn load(&self, term: u64) -> Result<(EngineHandle, EngineThread), LoadError> {
        let commit_timeout = Duration::from_millis(self.timing.ttl_ms);
        let store = PgLeaseStore::open(&self.pg, term, commit_timeout).await?;
        let bounds = self.bounds.clone();
        let (metrics, observed) = (self.metrics.clone(), self.observed.clone());
        let started = tokio::task::spawn_blocking(move || {
            Engine::start(Box::new(store), bounds, metrics, observed)
        })
        .await
        .map_err(|_| LoadError::Panicked)?;
        Ok(started?)
    }

    /// Seats `engine` for `term` and says so: the view, the gauges, ready.
    fn take_seat(&self, term: u64, engine: &EngineHandle, deadline_ms: u64) {
        let node = self.seat.node.clone();
        self.seat.lead(engine.clone(), term, deadline_ms);
        self.seat.set_view(|v| {
            v.term = term;
            v.leader_node = Some(node);
            v.leader = Some(self.config.advertise.clone());
        });
        self.metrics.is_leader.set(1);
        self.observed.ready.store(true, Ordering::Release);
    }

    /// Renews the term until it is lost, its engine stops, or `stop` says
    /// to step down (then `true`).
    async fn keep_leading(
        &mut self,
        term: u64,
        mut deadline_ms: u64,
        joined: &mut tokio::task::JoinHandle<std::thread::Result<Result<(), StoreError>>>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let node = self.seat.node.clone();
        let renew_every = Duration::from_millis(self.timing.renew_interval_ms());
        loop {
            tokio::select! {
                _ = tokio::time::sleep(renew_every) => {}
                r = &mut *joined => {
                    let why = match r {
                        Ok(Ok(Err(e))) => e.to_string(),
                        Ok(Ok(Ok(()))) => "the engine stopped".into(),
                        _ => "the engine panicked".into(),
                    };
                    error!(term, error = %why, "the leader's engine stopped; stepping down");
                    return false;
                }
                _ = stop.changed() => return true,
            }
            let sent_ms = self.seat.now_ms();
            let renewed = match self.client().await {
                Ok(client) => tokio::time::timeout(renew_every, leader::renew(client, term, &node))
                    .await
                    .unwrap_or_else(|_| Err(PgError::Db("leadership renewal timed out".into()))),
                Err(e) => Err(e),
            };
            match renewed {
                Ok(true) => {
                    deadline_ms = self.timing.deadline_ms(sent_ms);
                    self.seat.extend(term, deadline_ms);
                    self.outage = false;
                    self.refresh_members().await;
                }
                Ok(false) => {
                    warn!(term, "another server took over; stepping down");
                    return false;
                }
                Err(e) => self.trouble("cannot renew leadership", &e),
            }
            if !Timing::answers(self.seat.now_ms(), deadline_ms) {
                warn!(
                    term,
                    "leadership deadline passed without a renewal; stepping down"
                );
                return false;
            }
        }
    }

    /// Reports this leader in the members table and refreshes the view
    /// (best effort: `cluster status` only).
    async fn refresh_members(&mut self) {
        let node = self.seat.node.clone();
        let advertise = self.config.advertise.clone();
        let Ok(client) = self.client().await else {
            return;
        };
        if leader::report(client, &node, &advertise).await.is_err() {
            return;
        }
        let position = leader::position(client).await.ok();
        let members = leader::members(client).await;
        if let Some(position) = position {
            self.floor = self.floor.max(position);
        }
        if let Ok(members) = members {
            self.seat.set_view(|v| {
                v.members = members
                    .into_iter()
                    .map(|m| (m.node, m.advertise, m.seen_ms_ago))
                    .collect();
            });
        }
    }

    /// Stops answering for `term`; if `release`, clears the row so a
    /// follower can take over without waiting.
    async fn end_term(&mut self, term: u64, release: bool) {
        self.seat.follow(None);
        self.metrics.is_leader.set(0);
        self.observed.ready.store(false, Ordering::Release);
        self.watch.ended_own_term(term);
        if release {
            let node = self.seat.node.clone();
            if let Ok(client) = self.client().await {
                match leader::step_down(client, term, &node).await {
                    Ok(true) => info!(term, "stepped down"),
                    Ok(false) => {}
                    Err(e) => warn!(term, error = %e, "could not clear the leadership row"),
                }
            }
        }
    }
}

type EngineThread = std::thread::JoinHandle<Result<(), StoreError>>;

/// Why a new leader could not load the leases (it gives up the term).
#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the engine panicked while loading")]
    Panicked,
}
