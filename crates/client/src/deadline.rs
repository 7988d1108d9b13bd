//! Until when a session's leases are held, from what the server
//! acknowledged: a pure value (the clock's readings are passed in), tested
//! like the cluster's election timing.
//!
//! The server extends a session when it receives a heartbeat (or a resume),
//! by the session's TTL. The client cannot know when that was, only that it
//! was no earlier than when it sent the request. So the earliest instant the
//! server could expire the session is the send time of the last
//! acknowledged request plus the TTL ([`Deadline::server_deadline`]), and
//! the client stops claiming the session a margin before that
//! ([`Deadline::safe_until`]), on its own monotonic clock, whether or not
//! the server ever answers again.

use std::time::Duration;

use tokio::time::Instant;

/// The session's deadlines: they only move forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    server_deadline: Instant,
    safe_until: Instant,
    margin: Duration,
}

impl Deadline {
    /// The margin kept before the server's deadline: 5% of the TTL, at
    /// least 10 ms (a clock tick, a scheduling delay), at most the TTL.
    pub fn margin(ttl: Duration) -> Duration {
        (ttl / 20).max(Duration::from_millis(10)).min(ttl)
    }

    /// A session opened by a request sent at `sent` and granted `ttl`. The
    /// margin is fixed here, from the TTL the session was opened with.
    pub fn opened(sent: Instant, ttl: Duration) -> Self {
        let margin = Self::margin(ttl);
        Self {
            server_deadline: sent + ttl,
            safe_until: sent + ttl - margin,
            margin,
        }
    }

    /// A heartbeat or resume sent at `sent` was acknowledged with `ttl`
    /// remaining. `true` if that moved the deadlines; an answer to an
    /// older request (answers can arrive after later ones) never moves
    /// them back.
    pub fn acknowledged(&mut self, sent: Instant, ttl: Duration) -> bool {
        let deadline = sent + ttl;
        if deadline <= self.server_deadline {
            return false;
        }
        self.server_deadline = deadline;
        self.safe_until = deadline - self.margin.min(ttl);
        true
    }

    /// The earliest instant the server could expire the session.
    pub fn server_deadline(&self) -> Instant {
        self.server_deadline
    }

    /// Until when this client may say "you hold this": the server's
    /// deadline minus the margin.
    pub fn safe_until(&self) -> Instant {
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
        let d = Deadline::opened(sent, TTL);
        // However late the answer came, nothing of it enters the deadline.
        assert_eq!(d.server_deadline(), sent + TTL);
        assert_eq!(d.safe_until(), sent + TTL - ms(500));
    }

    #[test]
    fn safe_until_is_never_after_the_server_could_expire_the_session() {
        let t0 = Instant::now();
        let mut d = Deadline::opened(t0, TTL);
        let mut latest = t0 + TTL;
        for (sent_ms, ttl) in [(3_000, TTL), (6_000, TTL), (6_500, ms(2_000)), (9_000, TTL)] {
            d.acknowledged(t0 + ms(sent_ms), ttl);
            latest = latest.max(t0 + ms(sent_ms) + ttl);
            // The server extended the session no earlier than each send.
            assert_eq!(d.server_deadline(), latest);
            assert!(d.safe_until() < d.server_deadline());
        }
    }

    #[test]
    fn a_late_answer_to_an_older_heartbeat_never_moves_the_deadline_back() {
        let t0 = Instant::now();
        let mut d = Deadline::opened(t0, TTL);
        assert!(d.acknowledged(t0 + ms(6_000), TTL));
        let before = d;
        // The heartbeat sent at 3 s is answered after the one sent at 6 s.
        assert!(!d.acknowledged(t0 + ms(3_000), TTL));
        assert_eq!(d, before);
    }

    #[test]
    fn a_shorter_ttl_after_a_resume_moves_the_deadline_only_if_later() {
        let t0 = Instant::now();
        let mut d = Deadline::opened(t0, TTL);
        // A resume on a server that grants 2 s: ends before what is held.
        assert!(!d.acknowledged(t0 + ms(1_000), ms(2_000)));
        assert_eq!(d.server_deadline(), t0 + TTL);
        // Later, the same 2 s reaches past it, and the margin is the one
        // the session opened with.
        assert!(d.acknowledged(t0 + ms(9_000), ms(2_000)));
        assert_eq!(d.server_deadline(), t0 + ms(11_000));
        assert_eq!(d.safe_until(), t0 + ms(10_500));
    }

    #[test]
    fn the_margin_is_a_twentieth_at_least_a_tick_and_at_most_the_ttl() {
        assert_eq!(Deadline::margin(TTL), ms(500));
        assert_eq!(Deadline::margin(ms(100)), ms(10));
        assert_eq!(Deadline::margin(ms(4)), ms(4));
        let t0 = Instant::now();
        // A TTL below the margin: nothing is safe beyond the send time.
        assert_eq!(Deadline::opened(t0, ms(4)).safe_until(), t0);
        // A tiny acknowledged TTL never puts safe_until before its send.
        let mut d = Deadline::opened(t0, ms(4));
        assert!(d.acknowledged(t0 + ms(100), ms(5)));
        assert!(d.safe_until() >= t0 + ms(100));
    }
}
