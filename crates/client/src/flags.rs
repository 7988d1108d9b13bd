//! Values on the command line of Baton's tools, parsed one way everywhere.

use std::time::Duration;

const RULE: &str = "write a whole number with a unit: ms, s, m or h, like 500ms, 30s, 5m or 1m30s";

/// A duration flag: `500ms`, `30s`, `5m`, `1h`, or combined like `1m30s`
/// (humantime's syntax). A bare number is refused: the unit is never guessed.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} has no unit; {RULE}"));
    }
    if s.contains('.') {
        return Err(format!("{s:?} has a fraction; {RULE} (1.5s is 1500ms)"));
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative; {RULE}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration ({e}); {RULE}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_data() {
        for (input, ms) in [
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("0s", 0),
            ("1m30s", 90_000),
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
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(
                err.contains(says) && err.contains("like 500ms"),
                "{bad}: {err}"
            );
        }
    }
}
