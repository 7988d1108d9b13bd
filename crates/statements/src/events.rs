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

/// Runs `pass` until it returns. With `once`, its first error ends it;
/// otherwise the process outlives its errors (a server restart, a lost
/// database connection): it says so as `{"event":"error", role: name}`,
/// backs off with jitter, and runs `pass` again (which reconnects).
pub async fn outlive_errors(
    role: &str,
    name: &str,
    once: bool,
    mut pass: impl AsyncFnMut(&mut baton_client::worker::Backoff) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut backoff = baton_client::worker::Backoff::new(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(2),
    );
    loop {
        match pass(&mut backoff).await {
            Ok(()) => return Ok(()),
            Err(e) if once => return Err(e),
            Err(e) => {
                let mut fields = Map::new();
                fields.insert(role.into(), Value::from(name));
                fields.insert("why".into(), Value::from(format!("{e:#}")));
                emit("error", Value::Object(fields));
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
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
