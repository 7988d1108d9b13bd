//! Values on the command line of Baton's tools, parsed one way everywhere.
//!
//! Every duration flag of every tool (client and server) goes through
//! [`parse_duration`] or [`parse_positive_duration`], so a value is either
//! exactly what was typed, in whole milliseconds, or refused naming the
//! rule: never rounded down to zero, never wrapped around on the way to
//! the milliseconds the wire carries.

use std::time::Duration;

const RULE: &str = "write a whole number with a unit: ms, s, m or h, like 500ms, 30s, 5m or 1m30s";

/// A duration that breaks the rule, which the message names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadDuration(pub String);

/// The longest duration any flag accepts: one year. Far above every server
/// bound (a TTL is at most `--ttl-max`, 10 minutes by default), and far
/// below where milliseconds or a monotonic deadline could overflow.
pub const DURATION_MAX: Duration = Duration::from_secs(365 * 24 * 3_600);

/// A duration flag that may be zero (a wait: "try once"): `500ms`, `30s`,
/// `5m`, `1h`, or combined like `1m30s` (humantime's syntax). A bare number
/// is refused (the unit is never guessed), and so is anything that is not
/// whole milliseconds or is longer than [`DURATION_MAX`].
pub fn parse_duration(s: &str) -> Result<Duration, BadDuration> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadDuration(format!("{s:?} has no unit; {RULE}")));
    }
    if s.contains('.') {
        return Err(BadDuration(format!(
            "{s:?} has a fraction; {RULE} (1.5s is 1500ms)"
        )));
    }
    if s.starts_with('-') {
        return Err(BadDuration(format!("{s:?} is negative; {RULE}")));
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| BadDuration(format!("{s:?} is not a duration ({e}); {RULE}")))?;
    if d > DURATION_MAX {
        return Err(BadDuration(format!(
            "{s:?} is longer than the longest duration accepted, 365 days ({} ms)",
            DURATION_MAX.as_millis()
        )));
    }
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(BadDuration(format!(
            "{s:?} is not a whole number of milliseconds; durations are counted in milliseconds"
        )));
    }
    Ok(d)
}

/// A duration flag that must be above zero (a TTL, a timeout): as
/// [`parse_duration`], and `0s` is refused.
pub fn parse_positive_duration(s: &str) -> Result<Duration, BadDuration> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(BadDuration(format!(
            "{:?} is zero; this duration must be at least 1ms",
            s.trim()
        )));
    }
    Ok(d)
}

/// A duration as the parsers above read it back (`30s`, `10m`, `1m30s`):
/// how defaults are shown.
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_formatted_duration_parses_back_to_itself() {
        for ms in [
            1, 999, 1_000, 4_000, 30_000, 90_000, 600_000, 900_000, 3_600_000,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{ms} ms");
        }
    }

    #[test]
    fn durations_as_data() {
        for (input, ms) in [
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("0s", 0),
            ("1m30s", 90_000),
            ("8760h", 31_536_000_000),
        ] {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(ms)),
                "{input}"
            );
        }
        for (bad, says) in [
            ("", "not a duration"),
            ("30", "no unit"),
            ("s", "not a duration"),
            ("-1s", "negative"),
            ("1.5s", "1500ms"),
            ("10x", "not a duration"),
            ("99999999999999999999h", "not a duration"),
            ("2305843009213693982s", "365 days (31536000000 ms)"),
            ("8761h", "longest duration accepted"),
            ("500us", "whole number of milliseconds"),
            ("1s1ns", "whole number of milliseconds"),
        ] {
            let err = parse_duration(bad).unwrap_err().0;
            assert!(err.contains(says), "{bad}: {err}");
            assert!(
                err.contains(bad) || bad.is_empty(),
                "names the value: {err}"
            );
        }
    }

    #[test]
    fn a_positive_duration_refuses_zero_and_keeps_every_other_rule() {
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
        for zero in ["0s", "0ms", "0h"] {
            let err = parse_positive_duration(zero).unwrap_err().0;
            assert!(err.contains("at least 1ms"), "{zero}: {err}");
        }
        assert!(parse_positive_duration("2305843009213693982s")
            .unwrap_err()
            .0
            .contains("365 days"));
    }
}
