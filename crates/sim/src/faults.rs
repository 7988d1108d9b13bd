//! The faults of one run, drawn from its seed before it starts: network
//! partitions, delay spikes, loss, paused processes, crashes with torn
//! writes, operator fences and cancellations, backups and restores,
//! wall-clock jumps, and monotonic clocks whose rate changes.

use baton_client::rng::Rng;

use crate::world::{Addr, Ms};

/// One fault.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Fault {
    /// `who` can neither send nor receive for `for_ms`.
    Isolate {
        who: Addr,
        for_ms: u64,
    },
    /// Every message is delayed by up to `extra_ms` more for `for_ms`.
    Slow {
        extra_ms: u64,
        for_ms: u64,
    },
    /// Answers to a client are slow (up to `extra_ms` more) for `for_ms`,
    /// then the client is cut off for three seconds: a link that degrades
    /// before it fails.
    Brownout {
        client: usize,
        extra_ms: u64,
        for_ms: u64,
    },
    /// Messages are lost with probability `per_mille`/1000 for `for_ms`.
    Lossy {
        per_mille: u64,
        for_ms: u64,
    },
    /// `who` is stopped (SIGSTOP) for `for_ms`; its clock runs on.
    Pause {
        who: Addr,
        for_ms: u64,
    },
    /// `node` is stopped for `for_ms` right after its next call to the
    /// shared store: a pause in the middle of a call, so the store acts
    /// on it and the answer waits (a beat, a commit, or a takeover).
    PauseMidCall {
        node: usize,
        for_ms: u64,
    },
    /// A node is killed and starts again `down_ms` later.
    Crash {
        node: usize,
        down_ms: u64,
    },
    Restart {
        node: usize,
    },
    /// The operator fences a resource, then cancels the revoked token.
    Fence {
        resource: u8,
    },
    /// A backup of the single server is taken.
    Backup,
    /// The single server is restored from the last backup.
    Restore,
    /// The wall clock jumps by `by_s` seconds (either way).
    WallJump {
        by_s: i64,
    },
    /// `who`'s monotonic clock runs at `ppm` from now on (within the
    /// drift bound: a host's crystal warming up, or NTP slewing).
    ClockRate {
        who: Addr,
        ppm: i64,
    },
}

/// The schedule: about one fault every `mean_gap_ms`, over `run_ms`.
pub fn schedule(
    rng: &mut Rng,
    run_ms: Ms,
    mean_gap_ms: u64,
    n_nodes: usize,
    n_clients: usize,
    n_resources: u8,
    solo: bool,
) -> Vec<(Ms, Fault)> {
    let mut out = Vec::new();
    let mut t = rng.between(200, mean_gap_ms * 2);
    while t < run_ms {
        let node = rng.below(n_nodes as u64) as usize;
        let anyone = if rng.below(2) == 0 {
            Addr::Node(node)
        } else {
            Addr::Client(rng.below(n_clients as u64) as usize)
        };
        let fault = match rng.below(12) {
            10 => Fault::ClockRate {
                who: anyone,
                ppm: crate::run::drift_ppm(rng),
            },
            9 => Fault::Brownout {
                client: rng.below(n_clients as u64) as usize,
                extra_ms: rng.between(50, 400),
                for_ms: rng.between(500, 3_000),
            },
            0 => Fault::Isolate {
                who: anyone,
                for_ms: rng.between(100, 4_000),
            },
            1 => Fault::Slow {
                extra_ms: rng.between(50, 1_500),
                for_ms: rng.between(200, 3_000),
            },
            2 => Fault::Lossy {
                per_mille: rng.between(50, 500),
                for_ms: rng.between(200, 3_000),
            },
            // Past the leadership TTL (2 s), so that another node takes over.
            3 if !solo && rng.below(2) == 0 => Fault::PauseMidCall {
                node,
                for_ms: rng.between(2_000, 6_000),
            },
            3 => Fault::Pause {
                who: anyone,
                for_ms: rng.between(100, 8_000),
            },
            4 | 5 => Fault::Crash {
                node,
                down_ms: rng.between(10, 2_000),
            },
            6 => Fault::Fence {
                resource: rng.below(u64::from(n_resources)) as u8,
            },
            7 if solo => Fault::Backup,
            8 if solo => Fault::Restore,
            _ => Fault::WallJump {
                by_s: rng.between(0, 1_200) as i64 - 600,
            },
        };
        out.push((t, fault));
        t += rng.between(1, mean_gap_ms * 2);
    }
    out
}
