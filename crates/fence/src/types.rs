//! Validated inputs and the outcomes of a fenced write.

use std::fmt;

pub use baton_core::ResourceName;

/// Longest resource identity, in bytes.
pub const RESOURCE_LEN_BYTES_MAX: usize = 512;
/// Longest operation id, in bytes.
pub const OPERATION_LEN_BYTES_MAX: usize = 128;
/// Longest request fingerprint, in bytes (a SHA-512 digest fits).
pub const FINGERPRINT_LEN_BYTES_MAX: usize = 64;
/// Largest saved result, in bytes: results are small (an object key, an id).
pub const RESULT_LEN_BYTES_MAX: usize = 4_096;

/// Refusals of malformed input. Nothing is written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum InputError {
    #[error("{field} is empty")]
    Empty { field: &'static str },
    #[error("{field} is {len_bytes} bytes; the limit is {len_bytes_max} bytes")]
    TooLong {
        field: &'static str,
        len_bytes: usize,
        len_bytes_max: usize,
    },
    #[error("{field} contains a control character at byte {at_byte}")]
    ControlCharacter { field: &'static str, at_byte: usize },
    /// A token the caller built from an integer ([`FencingToken::of`]).
    #[error(transparent)]
    Token(#[from] baton_core::TokenError),
    #[error("sequence {seq} is out of range: sequences are 0 to 9223372036854775807 (a BIGINT)")]
    SequenceOutOfRange { seq: u64 },
    /// The lease service's name rules (one copy: `baton_core::ResourceName`).
    #[error(transparent)]
    ResourceName(#[from] baton_core::NameError),
    #[error("a write under a shared lease cannot {operation}: it changes what every reader reads, so it needs the exclusive side's token (fence or write a reader's own output with Side::Shared)")]
    SharedCannot { operation: &'static str },
    #[error("resource name {given:?} is not in canonical form (Unicode NFC); write it as {canonical:?}, the name the lease service returns")]
    NotCanonical { given: String, canonical: String },
}

pub(crate) fn text(
    field: &'static str,
    raw: &str,
    len_bytes_max: usize,
) -> Result<String, InputError> {
    if raw.is_empty() {
        return Err(InputError::Empty { field });
    }
    if raw.len() > len_bytes_max {
        return Err(InputError::TooLong {
            field,
            len_bytes: raw.len(),
            len_bytes_max,
        });
    }
    if let Some((at_byte, _)) = raw.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InputError::ControlCharacter { field, at_byte });
    }
    Ok(raw.to_string())
}

/// The identity of a protected resource is the lease service's
/// [`ResourceName`] (same rules), and only in its canonical form: a spelling
/// that normalizes to another name would be a different row here while it is
/// the same lease there. Use this for names from outside (configuration,
/// user input); a name returned by Baton is canonical already.
pub fn resource_name(raw: &str) -> Result<ResourceName, InputError> {
    let canonical = ResourceName::parse(raw)?;
    if canonical.as_str() != raw {
        return Err(InputError::NotCanonical {
            given: raw.to_string(),
            canonical: canonical.as_str().to_string(),
        });
    }
    Ok(canonical)
}

/// Names one logical operation; a retry reuses it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationId(String);

impl OperationId {
    /// An operation id: 1 to 128 bytes, no control characters.
    pub fn new(raw: &str) -> Result<Self, InputError> {
        text("operation id", raw, OPERATION_LEN_BYTES_MAX).map(Self)
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A digest of the request's payload: the same operation id with another
/// fingerprint is a conflict, not a retry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(Vec<u8>);

impl Fingerprint {
    /// A fingerprint: 1 to 64 bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, InputError> {
        if bytes.is_empty() {
            return Err(InputError::Empty {
                field: "fingerprint",
            });
        }
        if bytes.len() > FINGERPRINT_LEN_BYTES_MAX {
            return Err(InputError::TooLong {
                field: "fingerprint",
                len_bytes: bytes.len(),
                len_bytes_max: FINGERPRINT_LEN_BYTES_MAX,
            });
        }
        Ok(Self(bytes.to_vec()))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The fencing token: the lease service's own type, 1 to 2^63-1 (a
/// `BIGINT`), from Baton or any other issuer ([`FencingToken::of`]).
pub use baton_core::FencingToken;

/// The order of mutations within one generation ([`Policy::Ordered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sequence(i64);

impl Sequence {
    /// A sequence number: 0 to 2^63-1.
    pub fn new(seq: u64) -> Result<Self, InputError> {
        i64::try_from(seq)
            .map(Self)
            .map_err(|_| InputError::SequenceOutOfRange { seq })
    }

    /// The sequence as stored.
    pub fn get(self) -> i64 {
        self.0
    }
}

/// What a generation (one token) may do at a resource. Chosen per resource
/// kind; the first write records it and later writes must agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// One operation per generation (the default): a token above the recorded
    /// generation is applied; a second, different operation with the same
    /// token is refused. Replays of the applied operation return its result.
    #[default]
    OnePerGeneration,
    /// Several ordered mutations per generation: the same token is accepted
    /// again only with a higher sequence number, so an earlier request that
    /// arrives late cannot undo a later one.
    Ordered,
    /// Any write with a token at or above the recorded generation. Weaker:
    /// two requests of one owner can arrive out of order and both apply.
    Session,
}

impl Policy {
    /// The number stored in the `policy` column.
    pub fn code(self) -> i16 {
        match self {
            Policy::OnePerGeneration => 1,
            Policy::Ordered => 2,
            Policy::Session => 3,
        }
    }

    /// The policy a stored number names.
    pub fn from_code(code: i16) -> Option<Self> {
        match code {
            1 => Some(Policy::OnePerGeneration),
            2 => Some(Policy::Ordered),
            3 => Some(Policy::Session),
            _ => None,
        }
    }
}

/// Which side of a shared/exclusive lock the writer holds (`baton acquire
/// NAME --shared` or the exclusive default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Side {
    /// The writer holds the resource alone (an exclusive lease, a permit's
    /// slot): its write raises the generation, and every write below it is
    /// stale from then on.
    #[default]
    Exclusive,
    /// The writer is one of many readers holding a shared lease: its write
    /// is refused only below the last exclusive write (a writer changed the
    /// data after its grant), and it never refuses another reader's.
    Shared,
}

/// One fenced write, presented with its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceRequest {
    /// The fenced resource (canonical name).
    pub resource: ResourceName,
    /// The writer's fencing token.
    pub token: FencingToken,
    /// The logical operation; a retry reuses it.
    pub operation: OperationId,
    /// A digest of the payload.
    pub fingerprint: Fingerprint,
    /// Used by [`Policy::Ordered`]; ignored otherwise.
    pub seq: Sequence,
    /// Which writes per generation the resource accepts.
    pub policy: Policy,
    /// When true, a resource with no row yet is [`Outcome::Missing`] instead of created.
    pub must_exist: bool,
    /// Saved with the operation record and returned on replay.
    pub result: Vec<u8>,
    /// Exclusive (the default) or shared: see [`Side`].
    pub side: Side,
}

impl FenceRequest {
    /// A request with the default policy, creating the resource if needed.
    /// `token` is the writer's: a Baton lease's (`Acquired::token`), or
    /// another issuer's integer checked by [`FencingToken::of`].
    pub fn new(
        resource: &str,
        token: FencingToken,
        operation: &str,
        fingerprint: &[u8],
        result: &[u8],
    ) -> Result<Self, InputError> {
        if result.len() > RESULT_LEN_BYTES_MAX {
            return Err(InputError::TooLong {
                field: "result",
                len_bytes: result.len(),
                len_bytes_max: RESULT_LEN_BYTES_MAX,
            });
        }
        Ok(Self {
            resource: resource_name(resource)?,
            token,
            operation: OperationId::new(operation)?,
            fingerprint: Fingerprint::new(fingerprint)?,
            seq: Sequence::default(),
            policy: Policy::default(),
            must_exist: false,
            result: result.to_vec(),
            side: Side::Exclusive,
        })
    }

    /// The same request under another policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The same request with a sequence number (ordered policy).
    pub fn with_seq(mut self, seq: u64) -> Result<Self, InputError> {
        self.seq = Sequence::new(seq)?;
        Ok(self)
    }

    /// The same request, refused as `missing` if the resource has no row.
    pub fn must_exist(mut self) -> Self {
        self.must_exist = true;
        self
    }

    /// The same request made under a shared lease ([`Side::Shared`]).
    pub fn shared(mut self) -> Self {
        self.side = Side::Shared;
        self
    }

    /// Refuses a shared request to an operation only the exclusive side
    /// makes (publish, delete, a pipelined write).
    pub fn exclusive_only(&self, operation: &'static str) -> Result<(), InputError> {
        match self.side {
            Side::Exclusive => Ok(()),
            Side::Shared => Err(InputError::SharedCannot { operation }),
        }
    }
}

/// The answer to a fenced write. Refusals are outcomes, not errors: an
/// `Err` means the write could not be judged at all.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // variants are documented in docs/fence-kit.md's outcome table; fields name the tokens compared
pub enum Outcome {
    /// The token passed; the caller's effect belongs to this transaction.
    Applied { token: FencingToken, created: bool },
    /// This operation id with this fingerprint was applied before: here is
    /// its saved result. Nothing was applied again.
    Replayed {
        token: FencingToken,
        result: Vec<u8>,
    },
    /// The token is below the resource's recorded generation.
    Stale {
        presented: FencingToken,
        current: FencingToken,
    },
    /// The operation id was used before with a different fingerprint.
    Conflict {
        operation: OperationId,
        token: FencingToken,
    },
    /// The resource was cancelled at or above this token.
    Cancelled {
        presented: FencingToken,
        cancelled_at: FencingToken,
    },
    /// The resource is deleted (tombstoned); its generation floor remains.
    Deleted {
        presented: FencingToken,
        floor: FencingToken,
    },
    /// No such resource, and the request said it must exist.
    Missing,
    /// [`Policy::OnePerGeneration`]: another operation already used this token.
    GenerationUsed {
        token: FencingToken,
        by_operation: String,
    },
    /// [`Policy::Ordered`]: the sequence is not above the last applied one.
    OutOfOrder {
        token: FencingToken,
        presented_seq: Sequence,
        current_seq: Sequence,
    },
}

impl Outcome {
    /// Whether the write was applied now (not a replay or a refusal).
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. })
    }

    /// The outcome in a few words for people: `applied (created)`,
    /// `stale: 107 < 108`, `cancelled at 110`.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Applied { created: true, .. } => "applied (created)".into(),
            Outcome::Applied { token, .. } => format!("applied at {token}"),
            Outcome::Replayed { token, .. } => format!("replayed (applied earlier at {token})"),
            Outcome::Stale { presented, current } => format!("stale: {presented} < {current}"),
            Outcome::Conflict { operation, token } => {
                format!("conflict: operation {operation} was used at {token} with another payload")
            }
            Outcome::Cancelled {
                presented,
                cancelled_at,
            } => format!("cancelled: {presented} <= {cancelled_at}"),
            Outcome::Deleted { presented, floor } => {
                format!("deleted: floor {floor}, presented {presented}")
            }
            Outcome::Missing => "missing: no such resource".into(),
            Outcome::GenerationUsed {
                token,
                by_operation,
            } => {
                format!("generation {token} already used by {by_operation}")
            }
            Outcome::OutOfOrder {
                token,
                presented_seq,
                current_seq,
            } => format!(
                "out of order at {token}: sequence {} <= {}",
                presented_seq.get(),
                current_seq.get()
            ),
        }
    }

    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::Replayed { .. } => "replayed",
            Outcome::Stale { .. } => "stale",
            Outcome::Conflict { .. } => "conflict",
            Outcome::Cancelled { .. } => "cancelled",
            Outcome::Deleted { .. } => "deleted",
            Outcome::Missing => "missing",
            Outcome::GenerationUsed { .. } => "generation_used",
            Outcome::OutOfOrder { .. } => "out_of_order",
        }
    }
}

/// The published pointer of a resource: which immutable object is authoritative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// The authoritative object.
    pub object_key: String,
    /// The token that published it.
    pub token: FencingToken,
    /// The operation that published it.
    pub operation: String,
}
