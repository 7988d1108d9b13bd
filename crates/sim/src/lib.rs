//! Baton under one seed: engines, clients, network, disks and clocks in
//! one process, stepped by one event queue, so that a run is a function
//! of its seed and any failure replays exactly (`baton-sim --seed N`).
//!
//! What runs real code and what is modelled is listed in
//! docs/simulator.md; in short, the lease table, its recovery, the log's
//! record format and reader, the cluster's election rules, the client's
//! deadline rule, the fence kit's rule and the fault suite's grant
//! checker are the project's own code; the engine shell, the disk, the
//! shared store, the network and the clocks are models.
#![allow(missing_docs)]

mod check;
mod client;
mod disk;
mod engine;
mod faults;
mod node;
mod resources;
mod run;
mod shared;
mod world;

/// The resource held as a semaphore: workers take it as one of
/// [`SEMAPHORE_PERMITS`] permits and write under their permit's slot.
pub const SEMAPHORE: u8 = 1;
/// Its number of permits.
pub const SEMAPHORE_PERMITS: u32 = 2;
/// The resource held as a shared lock: most workers take it shared and
/// write their own output on the fence kit's shared side, the others take
/// it exclusive and write on the exclusive side.
pub const SHARED_LOCK: u8 = 2;

use std::collections::BTreeMap;
use std::ops::{Add, Sub};
use std::time::Duration;

use baton_client::rng::Rng;
use baton_core::ResourceName;

pub use baton_core::bad::Variant;
pub use run::{run, Config, Report};

use check::Checker;
use world::{Addr, Ev, Ms, Msg, Queue, Trace};

/// A reading of a simulated monotonic clock, for the client's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SimMs(pub u64);

impl Add<Duration> for SimMs {
    type Output = SimMs;
    fn add(self, d: Duration) -> SimMs {
        SimMs(self.0 + d.as_millis() as u64)
    }
}

impl Sub<Duration> for SimMs {
    type Output = SimMs;
    fn sub(self, d: Duration) -> SimMs {
        SimMs(self.0.saturating_sub(d.as_millis() as u64))
    }
}

/// What every part of the world shares: the time, the queue, the seeded
/// generator, the network's state, the trace and the checker.
pub(crate) struct Ctx {
    pub now: Ms,
    pub queue: Queue,
    pub rng: Rng,
    pub trace: Trace,
    pub check: Checker,
    pub names: Vec<ResourceName>,
    pub n_nodes: usize,
    /// The shared store's current term (a cluster's authoritative leader).
    pub store_term: u64,
    /// The wall clock's jump from true time, in seconds.
    pub wall_offset_s: i64,
    isolated: BTreeMap<Addr, Ms>,
    /// Stopped processes (SIGSTOP), until then: what reaches them waits.
    pub paused: BTreeMap<Addr, Ms>,
    /// Nodes to stop right after their next call to the store, for so long.
    pub pause_after_store_call: BTreeMap<usize, u64>,
    slow: (Ms, u64),
    /// Messages to an address delayed by up to this much more, until then.
    slow_to: BTreeMap<Addr, (Ms, u64)>,
    /// An isolation that starts only at this time (a brownout's end).
    cut_from: Option<(Addr, Ms)>,
    lossy: (Ms, u64),
    pub dropped: u64,
    pub duplicated: u64,
}

impl Ctx {
    /// Sends `msg`: lost, delayed, duplicated or cut off as the network
    /// is at this moment.
    pub fn send(&mut self, from: Addr, to: Addr, msg: Msg) {
        if let (Addr::Node(n), Addr::Store) = (from, to) {
            if let Some(for_ms) = self.pause_after_store_call.remove(&n) {
                self.paused.insert(from, self.now + for_ms);
            }
        }
        let starts = |a: &Addr| match self.cut_from {
            Some((who, from)) if who == *a => from,
            _ => 0,
        };
        let cut = |a: &Addr| {
            self.isolated
                .get(a)
                .is_some_and(|until| self.now >= starts(a) && self.now < *until)
        };
        let loss_per_mille = if self.now < self.lossy.0 {
            self.lossy.1
        } else {
            5
        };
        if cut(&from) || cut(&to) || self.rng.below(1_000) < loss_per_mille {
            self.dropped += 1;
            return;
        }
        // Retries duplicate requests between clients and servers; the
        // store's connections (TCP, one transaction per call) do not.
        let store = matches!(from, Addr::Store) || matches!(to, Addr::Store);
        let copies = if !store && self.rng.below(200) == 0 {
            2
        } else {
            1
        };
        self.duplicated += copies - 1;
        for _ in 0..copies {
            let mut delay = self.rng.between(1, 5);
            if self.now < self.slow.0 {
                delay += self.rng.below(self.slow.1);
            }
            if let Some((until, extra)) = self.slow_to.get(&to).copied() {
                if self.now < until {
                    delay += self.rng.below(extra);
                }
            }
            if self.rng.below(300) == 0 {
                delay += self.rng.between(100, 1_000);
            }
            let ev = Ev::Deliver {
                from,
                to,
                msg: msg.clone(),
            };
            self.queue.push(self.now + delay, ev);
        }
    }

    /// How long a sync of the disk takes: mostly a millisecond or three,
    /// now and then much longer.
    pub fn disk_latency_ms(&mut self) -> u64 {
        if self.rng.below(50) == 0 {
            self.rng.between(20, 200)
        } else {
            self.rng.between(1, 3)
        }
    }

    /// The wall clock in Unix seconds: near the epoch floor's origin, so
    /// that the ten-minute floor does not hide an epoch that fails to move.
    pub fn wall_unix_s(&self) -> u64 {
        let t = baton_core::EPOCH_FLOOR_ORIGIN_UNIX_S as i64 + 60 + (self.now / 1_000) as i64;
        (t + self.wall_offset_s).max(0) as u64
    }
}
