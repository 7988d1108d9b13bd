use std::{fmt, sync::Arc};

/// Longest holder description, in UTF-8 bytes.
pub const HOLDER_LEN_BYTES_MAX: usize = 256;

/// A short, free-form description of who holds a lease ("alice@build-3
/// pid 4242", "report-worker-7"): shown by status, list, watch and logs,
/// never used to decide anything. Validated like a resource name: at most
/// [`HOLDER_LEN_BYTES_MAX`] bytes, no control characters, not empty.
/// Cloning is cheap: the text is shared.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Holder(Arc<str>);

/// Why a holder description was refused; each message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum HolderError {
    #[error("holder description is empty; omit it instead")]
    Empty,
    #[error("holder description is {len_bytes} bytes long; the limit is {len_bytes_max} bytes")]
    TooLong {
        len_bytes: usize,
        len_bytes_max: usize,
    },
    #[error("holder description contains control character U+{code_point:04X} at byte {at_byte}; control characters are not allowed")]
    ControlCharacter { code_point: u32, at_byte: usize },
    #[error("holder description contains invisible or formatting character U+{code_point:04X} at byte {at_byte}; characters of Unicode category Cf and default-ignorable code points (bidi overrides, zero-width characters) are not allowed: they make one description look like another")]
    InvisibleCharacter { code_point: u32, at_byte: usize },
}

impl Holder {
    /// Checks `raw` against the rules above and refuses invisible or
    /// formatting characters ([`crate::invisible`]): the rule of every new
    /// description.
    pub fn parse(raw: &str) -> Result<Self, HolderError> {
        let holder = Self::parse_existing(raw)?;
        match crate::invisible::find_invisible(raw) {
            Some((at_byte, c)) => Err(HolderError::InvisibleCharacter {
                code_point: u32::from(c),
                at_byte,
            }),
            None => Ok(holder),
        }
    }

    /// The rule descriptions were stored under before invisible characters
    /// were refused: for those read back from a store or a backup.
    pub fn parse_existing(raw: &str) -> Result<Self, HolderError> {
        if raw.is_empty() {
            return Err(HolderError::Empty);
        }
        if raw.len() > HOLDER_LEN_BYTES_MAX {
            return Err(HolderError::TooLong {
                len_bytes: raw.len(),
                len_bytes_max: HOLDER_LEN_BYTES_MAX,
            });
        }
        if let Some((at_byte, c)) = raw.char_indices().find(|(_, c)| c.is_control()) {
            return Err(HolderError::ControlCharacter {
                code_point: u32::from(c),
                at_byte,
            });
        }
        Ok(Self(raw.into()))
    }

    /// The description.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_follow_the_rules() {
        assert_eq!(
            Holder::parse("alice@build-3 pid 42").unwrap().as_str(),
            "alice@build-3 pid 42"
        );
        assert_eq!(Holder::parse(""), Err(HolderError::Empty));
        let at_limit = "h".repeat(HOLDER_LEN_BYTES_MAX);
        assert!(Holder::parse(&at_limit).is_ok());
        let over = format!("{at_limit}x");
        assert!(matches!(
            Holder::parse(&over),
            Err(HolderError::TooLong { len_bytes: 257, .. })
        ));
        assert_eq!(
            Holder::parse("job\n7"),
            Err(HolderError::ControlCharacter {
                code_point: 0x0A,
                at_byte: 3
            })
        );
        // Multibyte text counts its bytes, not its characters.
        assert!(Holder::parse(&"é".repeat(128)).is_ok());
        assert!(Holder::parse(&"é".repeat(129)).is_err());
    }
}
