//! Simulated time, addresses, messages and the event queue.
//!
//! Time is one integer of true milliseconds, known only to the world.
//! Every node and client reads its own [`Clock`], which runs at a rate
//! within [`DRIFT_PPM_MAX`] of true time. Events at the same millisecond
//! run in the order they were scheduled, so a run is a function of its
//! seed alone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{Hash, Hasher};

use baton_core::{AcquisitionId, FencingToken, SessionDigest, Shape};

/// True simulated milliseconds.
pub type Ms = u64;

/// The most a clock's rate differs from true time, in parts per million
/// (1%). The client's margin (5% of the TTL) and the leader's (20%) are
/// both above twice this, as they must be.
pub const DRIFT_PPM_MAX: i64 = 10_000;

/// A monotonic clock that runs fast or slow by `ppm` since true time
/// `since`, when it read `reading_then`. Its rate may change within a
/// run ([`Clock::rerate`]); it never goes back.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    since: Ms,
    reading_then: u64,
    ppm: i64,
}

impl Clock {
    /// A clock reading `offset_ms` at true time 0.
    pub fn new(offset_ms: u64, ppm: i64) -> Self {
        assert!(ppm.abs() <= DRIFT_PPM_MAX, "a clock within the drift bound");
        Self {
            since: 0,
            reading_then: offset_ms,
            ppm,
        }
    }

    /// From true time `t` on, the clock runs at `ppm` (it reads on from
    /// where it was: no jump).
    pub fn rerate(&mut self, t: Ms, ppm: i64) {
        *self = Self {
            since: t,
            reading_then: self.local(t),
            ppm,
        };
        assert!(ppm.abs() <= DRIFT_PPM_MAX, "a clock within the drift bound");
    }

    /// The reading at true time `t` (not before the last rate change).
    pub fn local(self, t: Ms) -> u64 {
        let t = i128::from(t.max(self.since) - self.since);
        let skew = (t * i128::from(self.ppm)) / 1_000_000;
        (i128::from(self.reading_then) + t + skew) as u64
    }

    /// The earliest true time at which the clock reads `reading` or more
    /// (at its present rate).
    pub fn true_at(self, reading: u64) -> Ms {
        if reading <= self.reading_then {
            return self.since;
        }
        let span = i128::from(reading - self.reading_then);
        let mut t = self.since + (span * 1_000_000 / (1_000_000 + i128::from(self.ppm))) as u64;
        while self.local(t) < reading {
            t += 1;
        }
        while t > self.since && self.local(t - 1) >= reading {
            t -= 1;
        }
        t
    }
}

/// Who a message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Addr {
    Node(usize),
    Client(usize),
    /// The cluster's shared store (the PostgreSQL of a cluster).
    Store,
    /// The fenced resources (the fence kit's tables).
    Resources,
    /// The operator: fences and cancellations.
    Operator,
}

/// A request to a server.
#[derive(Clone, Debug, Hash)]
pub enum Request {
    Acquire {
        resource: u8,
        id: AcquisitionId,
        ttl_ms: u64,
        wait_ms: u64,
        /// The lease lives as long as this session (`ttl_ms` is ignored).
        session: Option<SessionDigest>,
        /// Exclusive, or a permit of the semaphore (`crate::SEMAPHORE`).
        shape: Shape,
    },
    Renew {
        resource: u8,
        id: AcquisitionId,
    },
    Release {
        resource: u8,
        id: AcquisitionId,
    },
    Fence {
        resource: u8,
    },
    OpenSession {
        digest: SessionDigest,
        ttl_ms: u64,
    },
    /// A session's heartbeat.
    KeepAlive {
        digest: SessionDigest,
    },
    CloseSession {
        digest: SessionDigest,
    },
}

/// A server's answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    Granted {
        token: FencingToken,
        ttl_ms: u64,
        /// A permit's slot.
        slot: Option<u32>,
    },
    NotAcquired,
    Renewed {
        remaining_ms: u64,
    },
    NotOwner,
    Released,
    Fenced {
        token: FencingToken,
        revoked: Option<FencingToken>,
    },
    /// The session is open and durable.
    Opened,
    /// The session's heartbeat: its TTL counted again, and the leases
    /// fenced since the last one.
    Kept {
        ttl_ms: u64,
        revoked: Vec<(u8, FencingToken)>,
    },
    /// The session is not open (it expired, or was never opened here).
    NotOpen,
    Closed,
    /// Not the leader; `hint` names the leader if known.
    NotLeader {
        hint: Option<usize>,
    },
    /// The outcome is unknown (the server stopped, its term ended).
    Indeterminate,
}

/// What travels between addresses.
#[derive(Clone, Debug, Hash)]
pub enum Msg {
    Call {
        op: u64,
        request: Request,
    },
    Reply {
        op: u64,
        answer: Answer,
    },
    /// A write to a fenced resource under `token`: a permit writes under
    /// its slot's resource.
    Write {
        op: u64,
        resource: u8,
        slot: Option<u32>,
        token: FencingToken,
    },
    /// The operator cancels every write at or below `at`.
    Cancel {
        resource: u8,
        at: FencingToken,
    },
    ToStore {
        node_incarnation: u64,
        req: crate::shared::StoreReq,
    },
    FromStore {
        node_incarnation: u64,
        ans: crate::shared::StoreAns,
    },
}

/// Something that happens at a true time.
#[derive(Debug)]
pub enum Ev {
    Deliver {
        from: Addr,
        to: Addr,
        msg: Msg,
    },
    /// A node's or client's own wake-up; stale if `gen` moved on.
    Wake {
        who: Addr,
        gen: u64,
    },
    /// A node's disk finished syncing commit `seq` of `incarnation`.
    Synced {
        node: usize,
        incarnation: u64,
        seq: u64,
    },
    Fault(crate::faults::Fault),
}

struct Queued {
    at: Ms,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The event queue: earliest first, ties in scheduling order.
#[derive(Default)]
pub struct Queue {
    heap: BinaryHeap<Reverse<Queued>>,
    seq: u64,
}

impl Queue {
    pub fn push(&mut self, at: Ms, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse(Queued {
            at,
            seq: self.seq,
            ev,
        }));
    }

    pub fn pop(&mut self) -> Option<(Ms, Ev)> {
        self.heap.pop().map(|Reverse(q)| (q.at, q.ev))
    }
}

/// The run's trace: every event that ran, hashed in order, and kept as
/// text when asked for (`baton-sim --seed N`).
pub struct Trace {
    hasher: Fnv,
    pub lines: Option<Vec<String>>,
    pub n_events: u64,
}

impl Trace {
    pub fn new(keep: bool) -> Self {
        Self {
            hasher: Fnv(0xcbf2_9ce4_8422_2325),
            lines: keep.then(Vec::new),
            n_events: 0,
        }
    }

    /// Records `what` at `t`; the text is built only when kept.
    pub fn record(&mut self, t: Ms, what: &impl Hash, text: impl FnOnce() -> String) {
        self.n_events += 1;
        t.hash(&mut self.hasher);
        what.hash(&mut self.hasher);
        if let Some(lines) = &mut self.lines {
            lines.push(format!("{t:>7} {}", text()));
        }
    }

    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }
}

/// FNV-1a: fixed, seedless and the same in every process (the standard
/// library's hashers promise neither across versions nor across builds).
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_rerated_reads_on_without_a_jump_and_finds_its_readings() {
        let mut c = Clock::new(500, 10_000);
        assert_eq!(c.local(1_000), 500 + 1_010);
        c.rerate(1_000, -10_000);
        assert_eq!(c.local(1_000), 1_510, "no jump at the change");
        assert_eq!(c.local(2_000), 1_510 + 990, "the new rate from then on");
        for reading in [1_510, 1_700, 2_500, 9_999] {
            let t = c.true_at(reading);
            assert!(c.local(t) >= reading && (t == 1_000 || c.local(t - 1) < reading));
        }
        assert_eq!(c.true_at(3), 1_000, "a reading already passed is due now");
    }
}
