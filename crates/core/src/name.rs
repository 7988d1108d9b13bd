use std::{borrow::Cow, cmp::Ordering, fmt, hash};

use triomphe::ThinArc;

use unicode_normalization::UnicodeNormalization;

/// Longest canonical resource name, in UTF-8 bytes.
pub const RESOURCE_NAME_LEN_BYTES_MAX: usize = 512;
/// Separates a resource's name from a slot in a holder's name
/// ([`ResourceName::slot`]): a control character, refused in names.
pub const SLOT_SEPARATOR: char = '\u{1f}';
/// Inputs longer than this are refused before normalization does any work.
const RAW_LEN_BYTES_MAX: usize = 4 * RESOURCE_NAME_LEN_BYTES_MAX;

/// A validated, NFC-normalized resource name.
///
/// Two spellings that normalize to the same string name the same resource.
/// Cloning is cheap: the text is shared. The name is one word wide (its
/// length lives with the text): the lease table keys its resources and its
/// deadlines by names, and at 10 million leases a two-word key costs about
/// 50 bytes a lease in half-full tree nodes.
#[derive(Clone)]
pub struct ResourceName(ThinArc<(), u8>);

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
    #[error("resource name contains invisible or formatting character U+{code_point:04X} at byte {at_byte}; characters of Unicode category Cf and default-ignorable code points (bidi overrides, zero-width characters) are not allowed: they make one name look like another")]
    InvisibleCharacter { code_point: u32, at_byte: usize },
    #[error("resource name has leading or trailing whitespace; trim it")]
    SurroundingWhitespace,
    #[error("resource name has an empty ':'-separated segment at byte {at_byte}; segments must be non-empty")]
    EmptySegment { at_byte: usize },
}

impl ResourceName {
    /// The empty name, below every valid one: a bound for ranges and
    /// splits inside the table, never a resource.
    pub(crate) fn below_all() -> Self {
        Self::shared("")
    }

    /// Validates `raw` and returns its canonical (NFC) form: the rule of
    /// every new name, which [`ResourceName::parse_existing`]'s rule and no
    /// invisible or formatting character ([`crate::invisible`]).
    pub fn parse(raw: &str) -> Result<Self, NameError> {
        let name = Self::parse_existing(raw)?;
        match crate::invisible::find_invisible(name.as_str()) {
            Some((at_byte, c)) => Err(NameError::InvisibleCharacter {
                code_point: u32::from(c),
                at_byte,
            }),
            None => Ok(name),
        }
    }

    /// The rule names were stored under before invisible characters were
    /// refused: for names read back from a store or a backup, and for
    /// reaching a lease already held under such a name (status, renew,
    /// release, fence), never for a new grant.
    pub fn parse_existing(raw: &str) -> Result<Self, NameError> {
        if raw.is_empty() {
            return Err(NameError::Empty);
        }
        if raw.len() > RAW_LEN_BYTES_MAX {
            return Err(NameError::TooLong {
                len_bytes: raw.len(),
                len_bytes_max: RESOURCE_NAME_LEN_BYTES_MAX,
            });
        }
        // ASCII is already in NFC: skip the normalizer (and a copy) on the
        // common path.
        let ascii = raw.is_ascii();
        let canonical: Cow<'_, str> = if ascii {
            Cow::Borrowed(raw)
        } else {
            Cow::Owned(raw.nfc().collect())
        };
        if canonical.len() > RESOURCE_NAME_LEN_BYTES_MAX {
            return Err(NameError::TooLong {
                len_bytes: canonical.len(),
                len_bytes_max: RESOURCE_NAME_LEN_BYTES_MAX,
            });
        }
        // An ASCII name is checked byte by byte: a restart parses every
        // stored name, ten million of them at ten million leases. (One that
        // normalization made ASCII, like the Kelvin sign's "K", takes the
        // character path, which holds for any name.)
        let control = if ascii {
            (canonical.bytes().enumerate())
                .find(|(_, b)| b.is_ascii_control())
                .map(|(at_byte, b)| (at_byte, char::from(b)))
        } else {
            canonical.char_indices().find(|(_, c)| c.is_control())
        };
        if let Some((at_byte, c)) = control {
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
        // ':' is ASCII: its byte is never part of another character.
        let mut segment_at = 0;
        for (at_byte, b) in canonical.bytes().enumerate() {
            if b == b':' {
                if at_byte == segment_at {
                    return Err(NameError::EmptySegment { at_byte });
                }
                segment_at = at_byte + 1;
            }
        }
        if segment_at == canonical.len() {
            return Err(NameError::EmptySegment {
                at_byte: segment_at,
            });
        }
        Ok(Self::shared(&canonical))
    }

    /// A name read back from a store or a backup: a resource's own
    /// ([`ResourceName::parse_existing`]'s rule), or a holder's
    /// ([`ResourceName::slot`]) of such a name.
    pub fn parse_stored(raw: &str) -> Result<Self, NameError> {
        // A resource's own name passes `parse_existing`, and a holder's
        // never does (the separator is a control character): the common
        // case reads the name once.
        let own = Self::parse_existing(raw);
        if own.is_ok() || !has_slot_separator(raw.as_bytes()) {
            return own;
        }
        if let Some((resource, slot)) = raw.rsplit_once(SLOT_SEPARATOR) {
            if let Ok(k) = slot.parse::<u32>() {
                if k.to_string() == slot {
                    return Ok(Self::parse_existing(resource)?.slot(k));
                }
            }
        }
        own
    }

    /// The name under which the holder in `slot` of this resource's
    /// shared lock or semaphore is kept: the name, [`SLOT_SEPARATOR`], the
    /// slot in decimal. No resource's own name contains the separator (a
    /// control character), so a holder's name never names a resource.
    pub fn slot(&self, slot: u32) -> Self {
        Self::shared(&format!("{}{SLOT_SEPARATOR}{slot}", self.as_str()))
    }

    /// For a holder's name ([`ResourceName::slot`]), the resource's own
    /// name and the slot; `None` for a resource's own name.
    pub fn split_slot(&self) -> Option<(&str, u32)> {
        if !has_slot_separator(self.bytes()) {
            return None;
        }
        let (resource, slot) = self.as_str().rsplit_once(SLOT_SEPARATOR)?;
        Some((resource, slot.parse().ok()?))
    }

    /// For a holder's name, the resource it holds (a new name: holders
    /// of shared locks and semaphores are few beside exclusive leases).
    pub fn slot_of(&self) -> Option<(Self, u32)> {
        let (resource, slot) = self.split_slot()?;
        Some((Self::shared(resource), slot))
    }

    fn shared(canonical: &str) -> Self {
        Self(ThinArc::from_header_and_slice((), canonical.as_bytes()))
    }

    /// The canonical (NFC) text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.bytes()).expect("a name is built from a str")
    }

    /// The text's bytes: they order, compare and hash as the `str` does.
    fn bytes(&self) -> &[u8] {
        &self.0.slice
    }
}

/// Whether `name` holds [`SLOT_SEPARATOR`]: most names do not, and this is
/// asked of every stored name at a restart, before the text is read as a
/// `str`. The separator is ASCII, so no other character's encoding holds
/// its byte.
fn has_slot_separator(name: &[u8]) -> bool {
    name.contains(&(SLOT_SEPARATOR as u8))
}

impl PartialEq for ResourceName {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for ResourceName {}

impl PartialOrd for ResourceName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Byte order, which is `str`'s order (so `Borrow<str>` lookups agree).
impl Ord for ResourceName {
    fn cmp(&self, other: &Self) -> Ordering {
        self.bytes().cmp(other.bytes())
    }
}

/// As the `str` hashes (so `Borrow<str>` lookups agree).
impl hash::Hash for ResourceName {
    fn hash<H: hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::borrow::Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
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

    /// [`ResourceName::parse_existing`]'s rule written over characters,
    /// as it was before its checks went byte by byte.
    fn by_characters(raw: &str) -> Result<ResourceName, NameError> {
        if raw.is_empty() {
            return Err(NameError::Empty);
        }
        let canonical: String = raw.nfc().collect();
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
        Ok(ResourceName::shared(&canonical))
    }

    #[test]
    fn errors_name_the_rule_and_value() {
        let err = ResourceName::parse(&"x".repeat(600))
            .unwrap_err()
            .to_string();
        assert!(err.contains("600") && err.contains("512"), "{err}");
    }

    fn hash_of<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
        use std::hash::{BuildHasher, RandomState};
        static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
        STATE.get_or_init(RandomState::new).hash_one(value)
    }

    #[test]
    fn a_holders_name_reads_back_only_from_a_store() {
        let jobs = ResourceName::parse("jobs").unwrap();
        let holder = jobs.slot(3);
        assert_eq!(holder.split_slot(), Some(("jobs", 3)));
        assert_eq!(holder.slot_of(), Some((jobs.clone(), 3)));
        assert_eq!(jobs.split_slot(), None);
        assert_eq!(
            ResourceName::parse_stored(holder.as_str()),
            Ok(holder.clone())
        );
        assert_eq!(ResourceName::parse_stored("jobs"), Ok(jobs));
        // A request never names a holder, and a stored name's slot is canonical.
        assert!(ResourceName::parse(holder.as_str()).is_err());
        assert!(ResourceName::parse_existing(holder.as_str()).is_err());
        assert!(ResourceName::parse_stored("jobs\u{1f}03").is_err());
        assert!(ResourceName::parse_stored("jobs\u{1f}x").is_err());
        assert!(ResourceName::parse_stored("\u{1f}3").is_err());
    }

    proptest! {
        /// A name orders, compares and hashes as its text does, so maps
        /// keyed by names answer lookups by `&str` (`Borrow<str>`).
        #[test]
        fn a_name_orders_and_hashes_as_its_text(a in "[a-c:é]{1,6}", b in "[a-c:é]{1,6}") {
            if let (Ok(x), Ok(y)) = (ResourceName::parse(&a), ResourceName::parse(&b)) {
                prop_assert_eq!(x.cmp(&y), x.as_str().cmp(y.as_str()));
                prop_assert_eq!(x == y, x.as_str() == y.as_str());
                prop_assert_eq!(hash_of(&x), hash_of(x.as_str()));
                prop_assert_eq!(std::mem::size_of_val(&x), std::mem::size_of::<usize>());
            }
        }

        /// The byte-wise checks (control characters of an ASCII name,
        /// empty segments, the slot separator) answer as the rule written
        /// over characters does, error and position included.
        #[test]
        fn the_byte_checks_answer_as_the_character_rule(
            raw in "[a :\\x00-\\x1f\\x7f\\u{85}é\\u{212a}\\u{3000}\\u{1f}0-9]{0,12}"
        ) {
            prop_assert_eq!(ResourceName::parse_existing(&raw), by_characters(&raw));
            let stored = ResourceName::parse_stored(&raw);
            if !raw.contains(SLOT_SEPARATOR) {
                prop_assert_eq!(stored, by_characters(&raw));
            } else if let Ok(name) = stored {
                prop_assert_eq!(name.as_str(), raw.as_str());
                prop_assert!(name.split_slot().is_some());
            }
        }

        #[test]
        fn parse_never_panics_and_is_idempotent(raw in ".{0,80}") {
            if let Ok(name) = ResourceName::parse(&raw) {
                let again = ResourceName::parse(name.as_str()).unwrap();
                prop_assert_eq!(again, name);
            }
        }
    }
}
