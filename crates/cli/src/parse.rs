//! Flag values: durations written like `500ms`, `30s`, `5m`, `1h`.

use std::time::Duration;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let rule = "write durations as a whole number with a unit: ms, s, m or h (like 500ms, 30s, 5m)";
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; {rule}"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("{s:?} has no valid unit; {rule}")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too large"))
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
        ] {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(ms)),
                "{input}"
            );
        }
        for bad in ["", "30", "s", "-1s", "1.5s", "10x", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
