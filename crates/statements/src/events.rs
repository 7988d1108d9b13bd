//! One JSON object per line on stdout: the worker's timeline, read by
//! `statements demo`, the chaos orchestrator and the tests.

use std::io::Write as _;

use serde_json::{Map, Value};

/// Prints `{"event": event, ...fields}` as one line and flushes it.
pub fn emit(event: &str, fields: Value) {
    let mut line = Map::new();
    line.insert("event".into(), Value::from(event));
    if let Value::Object(fields) = fields {
        line.extend(fields);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", Value::Object(line));
    let _ = out.flush();
}

/// Field `key` of one event line, as text (numbers written out); `None` if
/// the line is not a JSON object or has no such field.
pub fn field(line: &str, key: &str) -> Option<String> {
    match serde_json::from_str::<Value>(line).ok()?.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_whatever_their_type() {
        let line = serde_json::json!({"event": "published", "token": 7, "key": "a\"b"}).to_string();
        assert_eq!(field(&line, "event").as_deref(), Some("published"));
        assert_eq!(field(&line, "token").as_deref(), Some("7"));
        assert_eq!(field(&line, "key").as_deref(), Some("a\"b"));
        assert_eq!(field(&line, "nope"), None);
        assert_eq!(field("not json", "event"), None);
    }
}
