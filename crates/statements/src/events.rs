//! One JSON object per line on stdout: the worker's timeline, read by
//! `statements demo` and the tests.

use std::io::Write as _;

pub enum V<'a> {
    S(&'a str),
    N(i64),
    /// Already JSON (a nested object, an array, a boolean).
    Raw(&'a str),
}

pub fn escape(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn object(fields: &[(&str, V<'_>)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| {
            let v = match v {
                V::S(s) => escape(s),
                V::N(n) => n.to_string(),
                V::Raw(r) => r.to_string(),
            };
            format!("{}:{v}", escape(k))
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

pub fn emit(event: &str, fields: &[(&str, V<'_>)]) {
    let mut all = vec![("event", V::S(event))];
    all.extend(fields.iter().map(|(k, v)| {
        (
            *k,
            match v {
                V::S(s) => V::S(s),
                V::N(n) => V::N(*n),
                V::Raw(r) => V::Raw(r),
            },
        )
    }));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", object(&all));
    let _ = out.flush();
}

/// Reads a string field from one event line.
pub fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    if let Some(s) = rest.strip_prefix('"') {
        return s.split('"').next().map(str::to_string);
    }
    rest.split([',', '}']).next().map(str::to_string)
}
