//! A tiny JSON object writer for `--json` output.

use std::fmt;

pub struct Json {
    fields: Vec<(String, String)>,
}

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Json {
    pub fn obj() -> Self {
        Self { fields: Vec::new() }
    }

    fn raw(mut self, key: &str, value: String) -> Self {
        self.fields.push((escape(key), value));
        self
    }

    pub fn str(self, key: &str, value: &str) -> Self {
        self.raw(key, escape(value))
    }

    pub fn num(self, key: &str, value: u64) -> Self {
        self.raw(key, value.to_string())
    }

    pub fn bool(self, key: &str, value: bool) -> Self {
        self.raw(key, value.to_string())
    }

    pub fn null(self, key: &str) -> Self {
        self.raw(key, "null".into())
    }

    pub fn arr(self, key: &str, items: Vec<Json>) -> Self {
        let inner: Vec<String> = items.iter().map(ToString::to_string).collect();
        self.raw(key, format!("[{}]", inner.join(",")))
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}:{v}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_escaped_objects() {
        let j = Json::obj()
            .str("a\"", "x\ny\u{1}")
            .num("n", 7)
            .bool("b", true)
            .null("z")
            .arr("l", vec![Json::obj()]);
        assert_eq!(
            j.to_string(),
            r#"{"a\"":"x\ny\u0001","n":7,"b":true,"z":null,"l":[{}]}"#
        );
    }
}
