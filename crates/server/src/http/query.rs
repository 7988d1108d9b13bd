//! The page API's query strings, decoded strictly: a parameter whose
//! percent-decoded bytes are not UTF-8 is refused naming the rule, never
//! turned into U+FFFD (a fence of `%FF` must not fence a resource named
//! "\u{FFFD}"), and a parameter given twice is refused. Percent-decoding is
//! `percent-encoding`'s; the split into pairs is the URL standard's
//! `application/x-www-form-urlencoded` (`&` between pairs, `=` inside,
//! `+` for a space).

use std::collections::HashMap;

use tonic::Status;

/// The parameters of `raw` (the part after `?`), each once, strictly
/// decoded; `known` are the names the endpoint reads (others are ignored,
/// as browsers add their own).
pub fn params(raw: Option<&str>, known: &[&str]) -> Result<HashMap<String, String>, Status> {
    let mut out = HashMap::new();
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode("a parameter name", key)?;
        if !known.contains(&key.as_str()) {
            continue;
        }
        let value = decode(&format!("query parameter `{key}`"), value)?;
        if out.insert(key.clone(), value).is_some() {
            return Err(Status::invalid_argument(format!(
                "query parameter `{key}` is given twice; give it once"
            )));
        }
    }
    Ok(out)
}

fn decode(what: &str, text: &str) -> Result<String, Status> {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            Status::invalid_argument(format!(
                "{what} is not valid UTF-8 once percent-decoded: names and prefixes are UTF-8 text"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::params;

    #[test]
    fn parameters_are_decoded_strictly() {
        let p = params(
            Some("resource=a%3Ab+c&x=%FF&prefix=caf%C3%A9"),
            &["resource", "prefix"],
        )
        .unwrap();
        assert_eq!(p["resource"], "a:b c");
        assert_eq!(p["prefix"], "café");
        assert!(!p.contains_key("x"), "unknown parameters are ignored");
        for bad in [
            "resource=%FF",
            "prefix=%C3%28",
            "resource=a%FF",
            "resource=%FE%FF",
        ] {
            let e = params(Some(bad), &["resource", "prefix"]).unwrap_err();
            assert!(
                e.message().contains("not valid UTF-8"),
                "{bad}: {}",
                e.message()
            );
            assert!(e.message().contains("query parameter"), "{bad}: names it");
        }
        let e = params(Some("resource=a&resource=b"), &["resource"]).unwrap_err();
        assert!(e.message().contains("given twice"), "{}", e.message());
        assert!(params(None, &["resource"]).unwrap().is_empty());
    }
}
