use std::{fmt, sync::Arc};

use unicode_normalization::UnicodeNormalization;

/// Longest canonical resource name, in UTF-8 bytes.
pub const RESOURCE_NAME_LEN_BYTES_MAX: usize = 512;
/// Inputs longer than this are refused before normalization does any work.
const RAW_LEN_BYTES_MAX: usize = 4 * RESOURCE_NAME_LEN_BYTES_MAX;

/// A validated, NFC-normalized resource name.
///
/// Two spellings that normalize to the same string name the same resource.
/// Cloning is cheap: the text is shared.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(Arc<str>);

/// Why a resource name was refused; each message names the rule and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum NameError {
    #[error("resource name is empty")]
    Empty,
    #[error("resource name is {len_bytes} bytes long; the limit is {len_bytes_max} bytes (after NFC normalization)")]
    TooLong {
        len_bytes: usize,
        len_bytes_max: usize,
    },
    #[error("resource name contains control character U+{code_point:04X} at byte {at_byte}; control characters are not allowed")]
    ControlCharacter { code_point: u32, at_byte: usize },
    #[error("resource name has leading or trailing whitespace; trim it")]
    SurroundingWhitespace,
    #[error("resource name has an empty ':'-separated segment at byte {at_byte}; segments must be non-empty")]
    EmptySegment { at_byte: usize },
}

impl ResourceName {
    /// The empty name, below every valid one: a bound for ranges and
    /// splits inside the table, never a resource.
    pub(crate) fn below_all() -> Self {
        Self(Arc::from(""))
    }

    /// Validates `raw` and returns its canonical (NFC) form.
    pub fn parse(raw: &str) -> Result<Self, NameError> {
        if raw.is_empty() {
            return Err(NameError::Empty);
        }
        if raw.len() > RAW_LEN_BYTES_MAX {
            return Err(NameError::TooLong {
                len_bytes: raw.len(),
                len_bytes_max: RESOURCE_NAME_LEN_BYTES_MAX,
            });
        }
        // ASCII is already in NFC: skip the normalizer on the common path.
        let canonical: String = if raw.is_ascii() {
            raw.to_owned()
        } else {
            raw.nfc().collect()
        };
        if canonical.len() > RESOURCE_NAME_LEN_BYTES_MAX {
            return Err(NameError::TooLong {
                len_bytes: canonical.len(),
                len_bytes_max: RESOURCE_NAME_LEN_BYTES_MAX,
            });
        }
        if let Some((at_byte, c)) = canonical.char_indices().find(|(_, c)| c.is_control()) {
            return Err(NameError::ControlCharacter {
                code_point: u32::from(c),
                at_byte,
            });
        }
        let starts = canonical.chars().next().is_some_and(char::is_whitespace);
        let ends = canonical
            .chars()
            .next_back()
            .is_some_and(char::is_whitespace);
        if starts || ends {
            return Err(NameError::SurroundingWhitespace);
        }
        let mut at_byte = 0;
        for segment in canonical.split(':') {
            if segment.is_empty() {
                return Err(NameError::EmptySegment { at_byte });
            }
            at_byte += segment.len() + 1;
        }
        Ok(Self(canonical.into()))
    }

    /// The canonical (NFC) text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(raw: &str, expected: Result<&str, NameError>) {
        let got = ResourceName::parse(raw);
        assert_eq!(
            got.as_ref().map(ResourceName::as_str),
            expected.as_ref().map(|s| *s),
            "{raw:?}"
        );
    }

    #[test]
    fn names_as_data() {
        check(
            "statement:account-42:2026-09-13",
            Ok("statement:account-42:2026-09-13"),
        );
        // "e" + combining acute accent normalizes to the precomposed "é".
        check("caf\u{65}\u{301}", Ok("caf\u{e9}"));
        check("a b", Ok("a b"));
        check("", Err(NameError::Empty));
        check(" a", Err(NameError::SurroundingWhitespace));
        check("a\u{3000}", Err(NameError::SurroundingWhitespace));
        check(
            "a\nb",
            Err(NameError::ControlCharacter {
                code_point: 10,
                at_byte: 1,
            }),
        );
        check(
            "a\u{0}",
            Err(NameError::ControlCharacter {
                code_point: 0,
                at_byte: 1,
            }),
        );
        check(":a", Err(NameError::EmptySegment { at_byte: 0 }));
        check("a::b", Err(NameError::EmptySegment { at_byte: 2 }));
        check("a:", Err(NameError::EmptySegment { at_byte: 2 }));
        check(&"x".repeat(512), Ok(&"x".repeat(512)));
        check(
            &"x".repeat(513),
            Err(NameError::TooLong {
                len_bytes: 513,
                len_bytes_max: 512,
            }),
        );
        check(
            &"x".repeat(5000),
            Err(NameError::TooLong {
                len_bytes: 5000,
                len_bytes_max: 512,
            }),
        );
    }

    #[test]
    fn errors_name_the_rule_and_value() {
        let err = ResourceName::parse(&"x".repeat(600))
            .unwrap_err()
            .to_string();
        assert!(err.contains("600") && err.contains("512"), "{err}");
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_is_idempotent(raw in ".{0,80}") {
            if let Ok(name) = ResourceName::parse(&raw) {
                let again = ResourceName::parse(name.as_str()).unwrap();
                prop_assert_eq!(again, name);
            }
        }
    }
}
