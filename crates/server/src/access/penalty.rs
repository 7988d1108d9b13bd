//! Slowing down token guessing: once a peer address has failed to
//! authenticate many times in a row, each further refusal to it is
//! answered after a delay that doubles per failure, up to a second.
//!
//! Only refusals wait (a request that authenticates is never delayed, so a
//! correct client sharing an address with an attacker is not slowed), and
//! waiting costs the server a timer, not CPU: a guessing loop gets a
//! handful of tries per second per request in flight instead of tens of
//! thousands. A peer is forgotten after a quiet minute.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures a peer may have before its refusals wait (a misconfigured
/// fleet behind one address, a test matrix).
pub const FREE_FAILURES: u32 = 64;
/// The longest wait before a refusal.
pub const DELAY_MAX: Duration = Duration::from_secs(1);
/// A peer with no failure for this long starts again from zero.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Peers remembered at most; beyond, the quiet ones are forgotten first and
/// a newcomer that finds no room waits the longest.
const PEERS_MAX: usize = 65_536;

#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    last: Instant,
}

/// The wait before answering the `failures`-th refusal in a row.
pub fn delay_for(failures: u32) -> Duration {
    match failures.checked_sub(FREE_FAILURES) {
        None | Some(0) => Duration::ZERO,
        Some(over) => Duration::from_millis(1u64 << over.min(10)).min(DELAY_MAX),
    }
}

/// What one more failure of a peer costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Penalty {
    /// The wait before its refusal.
    pub wait: Duration,
    /// This failure is the first one that waits (worth one log line).
    pub starts: bool,
}

/// Failures by peer address.
#[derive(Debug, Default)]
pub struct Penalties {
    peers: Mutex<HashMap<IpAddr, Record>>,
}

impl Penalties {
    /// Counts a failure of `peer` at `now`; what its refusal costs.
    pub fn failed(&self, peer: IpAddr, now: Instant) -> Penalty {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.len() >= PEERS_MAX && !peers.contains_key(&peer) {
            peers.retain(|_, r| now.duration_since(r.last) < FORGET_AFTER);
            if peers.len() >= PEERS_MAX {
                return Penalty {
                    wait: DELAY_MAX,
                    starts: false,
                };
            }
        }
        let r = peers.entry(peer).or_insert(Record {
            failures: 0,
            last: now,
        });
        if now.duration_since(r.last) >= FORGET_AFTER {
            r.failures = 0;
        }
        r.failures = r.failures.saturating_add(1);
        r.last = now;
        Penalty {
            wait: delay_for(r.failures),
            starts: r.failures == FREE_FAILURES + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_start_late_double_and_stop_at_a_second() {
        assert_eq!(delay_for(1), Duration::ZERO);
        assert_eq!(delay_for(FREE_FAILURES), Duration::ZERO);
        assert_eq!(delay_for(FREE_FAILURES + 1), Duration::from_millis(2));
        assert_eq!(delay_for(FREE_FAILURES + 5), Duration::from_millis(32));
        assert_eq!(delay_for(FREE_FAILURES + 30), DELAY_MAX);
        assert_eq!(delay_for(u32::MAX), DELAY_MAX);
    }

    #[test]
    fn peers_are_counted_apart_and_forgotten_after_a_quiet_minute() {
        let p = Penalties::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(p.failed(a, t0).wait, Duration::ZERO);
        }
        let first = p.failed(a, t0);
        assert!(first.wait > Duration::ZERO && first.starts);
        assert!(!p.failed(a, t0).starts, "said once");
        assert_eq!(
            p.failed(b, t0).wait,
            Duration::ZERO,
            "another peer starts at zero"
        );
        assert_eq!(
            p.failed(a, t0 + FORGET_AFTER + Duration::from_secs(1)).wait,
            Duration::ZERO
        );
    }
}
