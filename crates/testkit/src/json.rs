//! Reading the JSON that the binaries print.

use serde_json::Value;

/// The first line of `text` that is a JSON object, parsed.
pub fn object(text: &str) -> Option<Value> {
    text.lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
}

/// Field `key` of the first JSON object in `text`, as an unsigned integer.
pub fn json_u64(text: &str, key: &str) -> Option<u64> {
    object(text)?.get(key)?.as_u64()
}

/// Field `key` of the first JSON object in `text`, as a string.
pub fn json_str(text: &str, key: &str) -> Option<String> {
    Some(object(text)?.get(key)?.as_str()?.to_string())
}

/// Field `key` of the first lease (`leases[0]`) in the first JSON object in
/// `text`: what `baton acquire --json` and `baton hold --json` print.
pub fn json_lease_u64(text: &str, key: &str) -> Option<u64> {
    object(text)?.get("leases")?.get(0)?.get(key)?.as_u64()
}

/// As [`json_lease_u64`], a string field.
pub fn json_lease_str(text: &str, key: &str) -> Option<String> {
    Some(
        object(text)?
            .get("leases")?
            .get(0)?
            .get(key)?
            .as_str()?
            .to_string(),
    )
}
