//! When a follower may take over, and until when a leader may answer.
//!
//! Pure: times are milliseconds on the caller's monotonic clock, passed in.
//! No clock is ever compared across machines: a follower measures how long
//! the leadership row has gone unchanged on its own clock, from the moment
//! it first saw the current value. The leader's renewal that wrote that
//! value was sent before the follower saw it, so a leader that stops
//! answering at `send + ttl - margin` has stopped before any follower can
//! take over at `seen + ttl`.

use crate::leader::LeaderRow;

/// Timing of the leadership lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long the row must stay unchanged before a follower takes over.
    pub ttl_ms: u64,
}

impl Timing {
    /// The leader renews this often.
    pub fn renew_interval_ms(self) -> u64 {
        (self.ttl_ms / 4).max(1)
    }

    /// Followers read the row this often.
    pub fn poll_interval_ms(self) -> u64 {
        (self.ttl_ms / 8).max(1)
    }

    /// The leader stops answering this long before its lease could lapse
    /// (rate differences between two machines' clocks, scheduling).
    pub fn margin_ms(self) -> u64 {
        self.ttl_ms / 5
    }

    /// The leader's answer deadline after a renewal (or takeover) sent at `sent_ms`.
    pub fn deadline_ms(self, sent_ms: u64) -> u64 {
        sent_ms + self.ttl_ms - self.margin_ms()
    }

    /// Whether a leader whose deadline is `deadline_ms` may still answer
    /// at `now_ms` (both on its own clock): only before the deadline.
    pub fn answers(now_ms: u64, deadline_ms: u64) -> bool {
        now_ms < deadline_ms || baton_core::bad::on(baton_core::bad::Variant::LeaderPastDeadline)
    }
}

/// What a follower decides after reading the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Someone leads (or may still): wait.
    Wait,
    /// Nobody can be answering for the current term: take over.
    TakeOver,
}

/// A follower's view of the leadership row over time.
#[derive(Clone, Debug)]
pub struct Watch {
    timing: Timing,
    node: String,
    seen: Option<(LeaderRow, u64)>,
    /// A term this node led and has stopped answering for.
    own_ended_term: Option<u64>,
}

impl Watch {
    /// A watch for node `node`.
    pub fn new(timing: Timing, node: &str) -> Self {
        Self {
            timing,
            node: node.to_string(),
            seen: None,
            own_ended_term: None,
        }
    }

    /// Records that this node led `term` and no longer answers for it.
    pub fn ended_own_term(&mut self, term: u64) {
        self.own_ended_term = Some(term);
    }

    /// Takes a new reading of the row at `now_ms`.
    pub fn observe(&mut self, now_ms: u64, row: &LeaderRow) -> Verdict {
        let Some(holder) = &row.holder else {
            // Nobody leads: never led, or the leader stepped down after it
            // stopped answering.
            return Verdict::TakeOver;
        };
        if *holder == self.node && self.own_ended_term == Some(row.term) {
            // Our own term, and we stopped answering for it.
            return Verdict::TakeOver;
        }
        match &self.seen {
            Some((seen, since)) if seen == row => {
                if now_ms.saturating_sub(*since) >= self.timing.ttl_ms {
                    Verdict::TakeOver
                } else {
                    Verdict::Wait
                }
            }
            _ => {
                self.seen = Some((row.clone(), now_ms));
                Verdict::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(term: u64, holder: Option<&str>, beats: u64) -> LeaderRow {
        LeaderRow {
            term,
            holder: holder.map(str::to_string),
            advertise: holder.map(|h| format!("http://{h}")),
            beats,
        }
    }

    const T: Timing = Timing { ttl_ms: 4_000 };

    #[test]
    fn a_renewing_leader_is_never_taken_over() {
        let mut w = Watch::new(T, "b");
        for i in 0..100 {
            assert_eq!(w.observe(i * 1_000, &row(3, Some("a"), i)), Verdict::Wait);
        }
    }

    #[test]
    fn a_silent_leader_is_taken_over_after_a_full_ttl_from_first_sight() {
        let mut w = Watch::new(T, "b");
        let r = row(3, Some("a"), 7);
        assert_eq!(w.observe(10_000, &r), Verdict::Wait);
        assert_eq!(w.observe(13_999, &r), Verdict::Wait);
        assert_eq!(w.observe(14_000, &r), Verdict::TakeOver);
    }

    #[test]
    fn the_leader_stops_answering_before_any_follower_can_take_over() {
        // Renewal sent at 1_000 (the follower sees its value at 1_000 at the earliest).
        assert!(T.deadline_ms(1_000) < 1_000 + T.ttl_ms);
    }

    #[test]
    fn a_released_row_is_free_at_once_and_an_own_ended_term_too() {
        let mut w = Watch::new(T, "b");
        assert_eq!(w.observe(0, &row(3, None, 9)), Verdict::TakeOver);
        assert_eq!(w.observe(0, &row(4, Some("b"), 0)), Verdict::Wait);
        w.ended_own_term(4);
        assert_eq!(w.observe(1, &row(4, Some("b"), 0)), Verdict::TakeOver);
        // Another node's term is never "ours".
        assert_eq!(w.observe(2, &row(5, Some("a"), 0)), Verdict::Wait);
    }

    #[test]
    fn a_changed_row_restarts_the_wait() {
        let mut w = Watch::new(T, "b");
        assert_eq!(w.observe(0, &row(3, Some("a"), 1)), Verdict::Wait);
        assert_eq!(w.observe(3_000, &row(3, Some("a"), 2)), Verdict::Wait);
        assert_eq!(w.observe(6_999, &row(3, Some("a"), 2)), Verdict::Wait);
        assert_eq!(w.observe(7_000, &row(3, Some("a"), 2)), Verdict::TakeOver);
    }
}
