//! Until when a lease or a session is held, from what the server
//! acknowledged: a pure value (the clock's readings are passed in), tested
//! like the cluster's election timing, and the one rule behind both
//! keepers (the session driver's and [`crate::worker::Keeper`]'s) and the
//! simulator's clients.
//!
//! The server extends a lease or a session when it receives the request,
//! by the TTL. The client cannot know when that was, only that it was no
//! earlier than when it sent the request. So the earliest instant the
//! server could end it is the send time of the last acknowledged request
//! plus the TTL ([`Deadline::server_deadline`]), and the client stops
//! claiming it a margin before that ([`Deadline::safe_until`]), on its own
//! monotonic clock, whether or not the server ever answers again.
//!
//! The instant type is a parameter: `tokio::time::Instant` in the client,
//! simulated milliseconds in `baton-sim`.

use std::ops::{Add, Sub};
use std::time::Duration;

use baton_core::bad::{self, Variant};
use tokio::time::Instant;

/// A reading of a monotonic clock: what [`Deadline`] computes with.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> + Sub<Duration, Output = Self> {}

impl<T: Copy + Ord + Add<Duration, Output = T> + Sub<Duration, Output = T>> Moment for T {}

/// The deadlines: they only move forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline<I = Instant> {
    server_deadline: I,
    safe_until: I,
    margin: Duration,
}

impl<I: Moment> Deadline<I> {
    /// The margin kept before the server's deadline: 5% of the TTL, at
    /// least 10 ms (a clock tick, a scheduling delay), at most the TTL.
    pub fn margin(ttl: Duration) -> Duration {
        (ttl / 20).max(Duration::from_millis(10)).min(ttl)
    }

    /// Opened (or granted) by a request sent at `sent`, for `ttl`. The
    /// margin is fixed here, from the TTL it was opened with.
    pub fn opened(sent: I, ttl: Duration) -> Self {
        Self::opened_with_margin(sent, ttl, Self::margin(ttl))
    }

    /// Like [`Deadline::opened`], with a margin of the caller's choice
    /// (at most the TTL).
    pub fn opened_with_margin(sent: I, ttl: Duration, margin: Duration) -> Self {
        let margin = margin.min(ttl);
        Self {
            server_deadline: sent + ttl,
            safe_until: sent + ttl - margin,
            margin,
        }
    }

    /// A renewal, heartbeat or resume sent at `sent` and answered at
    /// `answered` was acknowledged with `ttl` remaining. `true` if that
    /// moved the deadlines; an answer to an older request (answers can
    /// arrive after later ones) never moves them back. Nothing of
    /// `answered` enters the deadline: however late the answer came, the
    /// server may have counted from the send.
    pub fn acknowledged(&mut self, sent: I, answered: I, ttl: Duration) -> bool {
        debug_assert!(answered >= sent, "answered before it was sent");
        let from = if bad::on(Variant::KeeperReceiveTime) {
            answered
        } else {
            sent
        };
        let deadline = from + ttl;
        if deadline <= self.server_deadline {
            return false;
        }
        self.server_deadline = deadline;
        self.safe_until = deadline - self.margin.min(ttl);
        true
    }

    /// The earliest instant the server could end the lease or session.
    pub fn server_deadline(&self) -> I {
        self.server_deadline
    }

    /// Until when this client may say "you hold this": the server's
    /// deadline minus the margin.
    pub fn safe_until(&self) -> I {
        self.safe_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_deadline_counts_from_the_send_time_not_the_answer() {
        let sent = Instant::now();
        let d: Deadline = Deadline::opened(sent, TTL);
        // However late the answer came, nothing of it enters the deadline.
        assert_eq!(d.server_deadline(), sent + TTL);
        assert_eq!(d.safe_until(), sent + TTL - ms(500));
    }

    #[test]
    fn a_late_answer_counts_from_its_send_time() {
        let t0 = Instant::now();
        let mut d: Deadline = Deadline::opened(t0, TTL);
        // Sent at 3 s, answered at 7 s: the server may have renewed at 3 s.
        assert!(d.acknowledged(t0 + ms(3_000), t0 + ms(7_000), TTL));
        assert_eq!(d.server_deadline(), t0 + ms(13_000));
        assert_eq!(d.safe_until(), t0 + ms(12_500));
    }

    #[test]
    fn safe_until_is_never_after_the_server_could_expire_the_session() {
        let t0 = Instant::now();
        let mut d: Deadline = Deadline::opened(t0, TTL);
        let mut latest = t0 + TTL;
        for (sent_ms, ttl) in [(3_000, TTL), (6_000, TTL), (6_500, ms(2_000)), (9_000, TTL)] {
            d.acknowledged(t0 + ms(sent_ms), t0 + ms(sent_ms), ttl);
            latest = latest.max(t0 + ms(sent_ms) + ttl);
            // The server extended the session no earlier than each send.
            assert_eq!(d.server_deadline(), latest);
            assert!(d.safe_until() < d.server_deadline());
        }
    }

    #[test]
    fn a_late_answer_to_an_older_heartbeat_never_moves_the_deadline_back() {
        let t0 = Instant::now();
        let mut d: Deadline = Deadline::opened(t0, TTL);
        assert!(d.acknowledged(t0 + ms(6_000), t0 + ms(6_000), TTL));
        let before = d;
        // The heartbeat sent at 3 s is answered after the one sent at 6 s.
        assert!(!d.acknowledged(t0 + ms(3_000), t0 + ms(3_000), TTL));
        assert_eq!(d, before);
    }

    #[test]
    fn a_shorter_ttl_after_a_resume_moves_the_deadline_only_if_later() {
        let t0 = Instant::now();
        let mut d: Deadline = Deadline::opened(t0, TTL);
        // A resume on a server that grants 2 s: ends before what is held.
        assert!(!d.acknowledged(t0 + ms(1_000), t0 + ms(1_000), ms(2_000)));
        assert_eq!(d.server_deadline(), t0 + TTL);
        // Later, the same 2 s reaches past it, and the margin is the one
        // the session opened with.
        assert!(d.acknowledged(t0 + ms(9_000), t0 + ms(9_000), ms(2_000)));
        assert_eq!(d.server_deadline(), t0 + ms(11_000));
        assert_eq!(d.safe_until(), t0 + ms(10_500));
    }

    #[test]
    fn the_margin_is_a_twentieth_at_least_a_tick_and_at_most_the_ttl() {
        assert_eq!(Deadline::<Instant>::margin(TTL), ms(500));
        assert_eq!(Deadline::<Instant>::margin(ms(100)), ms(10));
        assert_eq!(Deadline::<Instant>::margin(ms(4)), ms(4));
        let t0 = Instant::now();
        // A TTL below the margin: nothing is safe beyond the send time.
        assert_eq!(Deadline::<Instant>::opened(t0, ms(4)).safe_until(), t0);
        // A tiny acknowledged TTL never puts safe_until before its send.
        let mut d: Deadline = Deadline::opened(t0, ms(4));
        assert!(d.acknowledged(t0 + ms(100), t0 + ms(100), ms(5)));
        assert!(d.safe_until() >= t0 + ms(100));
    }
}
