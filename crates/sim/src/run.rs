//! One run: the world built from a seed, its event loop, and its report.

use std::collections::BTreeMap;

use baton_client::rng::Rng;
use baton_core::{restore_epoch, ResourceName, RestoreFloors};
use baton_store::Stored;

use crate::client::Client;
use crate::faults::{schedule, Fault};
use crate::node::{Node, Role};
use crate::resources::Resources;
use crate::shared::Shared;
use crate::world::{Addr, Answer, Clock, Ev, Ms, Msg, Queue, Request, Trace, DRIFT_PPM_MAX};
use crate::{Checker, Ctx, Variant};

/// The shape of a run.
#[derive(Clone, Debug)]
pub struct Config {
    pub run_ms: Ms,
    pub n_clients: usize,
    pub n_resources: u8,
    /// The mean time between two faults.
    pub fault_gap_ms: u64,
    /// Keep the readable trace.
    pub keep_trace: bool,
    pub variant: Option<Variant>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            run_ms: 60_000,
            n_clients: 12,
            n_resources: 6,
            fault_gap_ms: 1_500,
            keep_trace: false,
            variant: None,
        }
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub cluster: bool,
    /// The hash of the whole event trace: equal for equal seeds.
    pub trace_hash: u64,
    pub n_events: u64,
    pub n_ops: u64,
    pub n_indeterminate: u64,
    pub faults: BTreeMap<&'static str, u64>,
    pub n_claims: u64,
    pub n_writes_accepted: u64,
    pub n_stale_refused: u64,
    pub n_recoveries: u64,
    pub n_sessions_opened: u64,
    pub n_heartbeats: u64,
    pub n_session_claims: u64,
    /// The most permits of the semaphore certainly held at once.
    pub most_permits: usize,
    /// The most shared leases of the shared lock certainly held at once.
    pub most_readers: usize,
    pub n_dropped: u64,
    pub n_duplicated: u64,
    pub violations: Vec<String>,
    pub trace: Option<Vec<String>>,
}

struct World {
    ctx: Ctx,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    shared: Shared,
    resources: Resources,
    solo: bool,
    backup: Option<Stored>,
    operator: BTreeMap<u64, (u8, Ms)>,
    next_op: u64,
    faults: BTreeMap<&'static str, u64>,
}

/// Runs `seed` under `config`.
/// More events than this at one instant of true time is a livelock.
const EVENTS_AT_ONE_INSTANT_MAX: u32 = 100_000;

pub fn run(seed: u64, config: &Config) -> Report {
    #[cfg(feature = "known-bad")]
    baton_core::bad::set(config.variant);
    #[cfg(not(feature = "known-bad"))]
    assert!(
        config.variant.is_none(),
        "this build has no known-bad variants (build with --features known-bad)"
    );
    let mut w = World::new(seed, config);
    // A panic in the code under test (an assertion of the table, say) is
    // a finding like any other: the seed replays it.
    let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Events at one instant: a part that keeps waking itself without
        // the clock moving is a livelock, and a finding.
        let mut at_once = 0u32;
        while let Some((t, ev)) = w.ctx.queue.pop() {
            if t > config.run_ms {
                break;
            }
            at_once = if t == w.ctx.now { at_once + 1 } else { 0 };
            if at_once > EVENTS_AT_ONE_INSTANT_MAX {
                w.ctx.check.violations.push(format!(
                    "livelock at {t}: more than {EVENTS_AT_ONE_INSTANT_MAX} events without the clock moving"
                ));
                break;
            }
            w.ctx.now = t;
            w.dispatch(ev);
        }
    }));
    if let Err(payload) = stepped {
        let what = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        w.ctx
            .check
            .violations
            .push(format!("panicked at {}: {what}", w.ctx.now));
    }
    w.ctx.check.finish();
    #[cfg(feature = "known-bad")]
    baton_core::bad::set(None);
    let c = &w.ctx.check;
    Report {
        seed,
        cluster: !w.solo,
        trace_hash: w.ctx.trace.hash(),
        n_events: w.ctx.trace.n_events,
        n_ops: c.ops_started,
        n_indeterminate: c.ops_indeterminate,
        faults: w.faults,
        n_claims: c.claims,
        n_writes_accepted: c.writes_accepted,
        n_stale_refused: c.stale_refused,
        n_recoveries: c.recoveries,
        n_sessions_opened: c.sessions_opened,
        n_heartbeats: c.heartbeats,
        n_session_claims: c.session_claims,
        most_permits: c.most_permits,
        most_readers: c.most_readers,
        n_dropped: w.ctx.dropped,
        n_duplicated: w.ctx.duplicated,
        violations: std::mem::take(&mut w.ctx.check.violations),
        trace: w.ctx.trace.lines.take(),
    }
}

fn clock(rng: &mut Rng) -> Clock {
    Clock::new(rng.below(1_000_000), drift_ppm(rng))
}

/// A rate within the drift bound.
pub fn drift_ppm(rng: &mut Rng) -> i64 {
    rng.between(0, 2 * DRIFT_PPM_MAX as u64) as i64 - DRIFT_PPM_MAX
}

impl World {
    fn new(seed: u64, config: &Config) -> Self {
        let mut rng = Rng::new(seed);
        let solo = seed.is_multiple_of(2);
        let n_nodes = if solo { 1 } else { 3 };
        let names = (0..config.n_resources)
            .map(|i| ResourceName::parse(&crate::check::resource_name(i)).expect("valid"))
            .collect();
        let mut ctx = Ctx {
            now: 0,
            queue: Queue::default(),
            rng: Rng::new(rng.next_u64()),
            trace: Trace::new(config.keep_trace),
            check: Checker::default(),
            names,
            n_nodes,
            store_term: 0,
            wall_offset_s: 0,
            isolated: BTreeMap::new(),
            paused: BTreeMap::new(),
            pause_after_store_call: BTreeMap::new(),
            slow: (0, 0),
            slow_to: BTreeMap::new(),
            cut_from: None,
            lossy: (0, 0),
            dropped: 0,
            duplicated: 0,
        };
        let mut nodes: Vec<Node> = (0..n_nodes)
            .map(|i| Node::new(i, clock(&mut rng), solo))
            .collect();
        for n in &mut nodes {
            n.start(&mut ctx, solo);
        }
        let mut clients: Vec<Client> = (0..config.n_clients)
            .map(|i| Client::new(i, clock(&mut rng), rng.next_u64()))
            .collect();
        for c in &mut clients {
            c.schedule(&mut ctx);
        }
        for (t, f) in schedule(
            &mut rng,
            config.run_ms,
            config.fault_gap_ms,
            n_nodes,
            config.n_clients,
            config.n_resources,
            solo,
        ) {
            ctx.queue.push(t, Ev::Fault(f));
        }
        Self {
            ctx,
            nodes,
            clients,
            shared: Shared::new(),
            resources: Resources::default(),
            solo,
            backup: None,
            operator: BTreeMap::new(),
            next_op: 0,
            faults: BTreeMap::new(),
        }
    }

    /// The process an event runs in, if any (a paused one runs it later).
    fn owner(ev: &Ev) -> Option<Addr> {
        match ev {
            Ev::Deliver { to, .. } => Some(*to),
            Ev::Wake { who, .. } => Some(*who),
            Ev::Synced { node, .. } => Some(Addr::Node(*node)),
            Ev::Fault(_) => None,
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        if let Some(until) = Self::owner(&ev)
            .and_then(|a| self.ctx.paused.get(&a))
            .copied()
        {
            if self.ctx.now < until {
                self.ctx.queue.push(until, ev);
                return;
            }
        }
        match ev {
            Ev::Deliver { from, to, msg } => {
                self.ctx.trace.record(self.ctx.now, &(from, to, &msg), || {
                    format!("{from:?} -> {to:?} {msg:?}")
                });
                self.deliver(from, to, msg);
            }
            Ev::Wake { who, gen } => match who {
                Addr::Node(i) => self.nodes[i].on_wake(&mut self.ctx, gen),
                Addr::Client(i) => self.clients[i].on_wake(&mut self.ctx, gen),
                _ => {}
            },
            Ev::Synced {
                node,
                incarnation,
                seq,
            } => self.nodes[node].on_synced(&mut self.ctx, incarnation, seq),
            Ev::Fault(f) => {
                self.ctx
                    .trace
                    .record(self.ctx.now, &f, || format!("fault {f:?}"));
                self.fault(f);
            }
        }
    }

    fn deliver(&mut self, from: Addr, to: Addr, msg: Msg) {
        let ctx = &mut self.ctx;
        match (to, msg) {
            (Addr::Node(i), Msg::Call { op, request }) => {
                self.nodes[i].on_call(ctx, from, op, request)
            }
            (
                Addr::Node(i),
                Msg::FromStore {
                    node_incarnation,
                    ans,
                },
            ) => self.nodes[i].on_store(ctx, node_incarnation, ans),
            (Addr::Client(i), Msg::Reply { op, answer }) => {
                self.clients[i].on_reply(ctx, op, answer)
            }
            (Addr::Operator, Msg::Reply { op, answer }) => self.fenced(op, answer),
            (
                Addr::Resources,
                Msg::Write {
                    op,
                    resource,
                    slot,
                    token,
                },
            ) => self.resources.write(ctx, op, (resource, slot), token),
            (Addr::Resources, Msg::Cancel { resource, at }) => {
                self.resources.cancel(ctx, resource, at)
            }
            (
                Addr::Store,
                Msg::ToStore {
                    node_incarnation,
                    req,
                },
            ) => {
                let Addr::Node(node) = from else { return };
                let ans = self.shared.handle(node, req);
                ctx.store_term = self.shared.row.term;
                if let Some(ans) = ans {
                    ctx.send(
                        Addr::Store,
                        from,
                        Msg::FromStore {
                            node_incarnation,
                            ans,
                        },
                    );
                }
            }
            _ => {}
        }
    }

    fn fault(&mut self, f: Fault) {
        let now = self.ctx.now;
        let name = match &f {
            Fault::Isolate { who, for_ms } => {
                self.ctx.isolated.insert(*who, now + for_ms);
                "isolate"
            }
            Fault::Slow { extra_ms, for_ms } => {
                self.ctx.slow = (now + for_ms, *extra_ms);
                "slow"
            }
            Fault::Brownout {
                client,
                extra_ms,
                for_ms,
            } => {
                let who = Addr::Client(*client);
                self.ctx.slow_to.insert(who, (now + for_ms, *extra_ms));
                self.ctx.isolated.insert(who, now + for_ms + 3_000);
                self.ctx.cut_from = Some((who, now + for_ms));
                "brownout"
            }
            Fault::Lossy { per_mille, for_ms } => {
                self.ctx.lossy = (now + for_ms, *per_mille);
                "lossy"
            }
            Fault::Pause { who, for_ms } => {
                self.ctx.paused.insert(*who, now + for_ms);
                "pause"
            }
            Fault::PauseMidCall { node, for_ms } => {
                self.ctx.pause_after_store_call.insert(*node, *for_ms);
                "pause-mid-call"
            }
            Fault::Crash { node, down_ms } => {
                if self.nodes[*node].role == Role::Down {
                    return;
                }
                self.nodes[*node].crash(&mut self.ctx);
                self.ctx
                    .queue
                    .push(now + down_ms, Ev::Fault(Fault::Restart { node: *node }));
                "crash"
            }
            Fault::Restart { node } => {
                if self.nodes[*node].role != Role::Down {
                    return;
                }
                self.nodes[*node].start(&mut self.ctx, self.solo);
                "restart"
            }
            Fault::Fence { resource } => self.fence(*resource),
            Fault::Backup => self.take_backup(),
            Fault::Restore => self.restore(),
            Fault::WallJump { by_s } => {
                self.ctx.wall_offset_s += by_s;
                "wall-jump"
            }
            Fault::ClockRate { who, ppm } => {
                let clock = match *who {
                    Addr::Node(n) => &mut self.nodes[n].clock,
                    Addr::Client(c) => &mut self.clients[c].clock,
                    _ => return,
                };
                clock.rerate(now, *ppm);
                "clock-rate"
            }
        };
        *self.faults.entry(name).or_default() += 1;
    }

    fn fence(&mut self, resource: u8) -> &'static str {
        let leader = self
            .nodes
            .iter()
            .find(|n| matches!(n.role, Role::Solo | Role::Leader { .. }));
        let Some(leader) = leader.map(|n| n.id) else {
            return "fence-no-leader";
        };
        self.next_op += 1;
        let op = u64::MAX - self.next_op;
        self.operator.insert(op, (resource, self.ctx.now));
        self.ctx.send(
            Addr::Operator,
            Addr::Node(leader),
            Msg::Call {
                op,
                request: Request::Fence { resource },
            },
        );
        "fence"
    }

    fn fenced(&mut self, op: u64, answer: Answer) {
        let Some((resource, invoked)) = self.operator.remove(&op) else {
            return;
        };
        if let Answer::Fenced { token, revoked } = answer {
            self.ctx
                .check
                .fenced(resource, token, revoked, invoked, self.ctx.now);
            if let Some(at) = revoked {
                self.ctx.send(
                    Addr::Operator,
                    Addr::Resources,
                    Msg::Cancel { resource, at },
                );
            }
        }
    }

    fn take_backup(&mut self) -> &'static str {
        if self.nodes[0].role == Role::Down {
            return "backup-refused";
        }
        self.backup = Some(self.nodes[0].disk.backup());
        "backup"
    }

    /// `baton admin restore`: the server is stopped, the directory starts
    /// over in an epoch above the backup's and the replaced store's, and
    /// the server starts on it.
    fn restore(&mut self) -> &'static str {
        let Some(backup) = self.backup.clone() else {
            return "restore-no-backup";
        };
        let node = &mut self.nodes[0];
        if node.role != Role::Down {
            node.crash(&mut self.ctx);
        }
        let replaced = node.disk.load().epoch;
        let floors = RestoreFloors {
            backup: Some(backup.epoch),
            replaced: Some(replaced),
            min_epoch: None,
            resources: None,
            now_unix_s: self.ctx.wall_unix_s(),
        };
        let Ok(epoch) = restore_epoch(&floors) else {
            return "restore-refused";
        };
        // As `baton admin restore` does: a fresh store in the new epoch;
        // the backup's leases are dropped (their holders are fenced by
        // the higher tokens that follow).
        node.disk.restore(Stored {
            epoch,
            counter: 0,
            leases: Vec::new(),
            sessions: Vec::new(),
        });
        self.ctx.check.restored(self.ctx.now, epoch);
        self.ctx.trace.record(self.ctx.now, &epoch.get(), || {
            format!("restored into epoch {}", epoch.get())
        });
        node.start(&mut self.ctx, true);
        "restore"
    }
}
