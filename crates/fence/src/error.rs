use crate::{InputError, PolicyMismatch};

/// A fenced write that could not be judged. Refusals (stale, conflict, ...)
/// are [`crate::Outcome`]s, never errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum FenceError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    PolicyMismatch(#[from] PolicyMismatch),
    #[error("operation records younger than {min_age_s_floor}s are never pruned; asked for {min_age_s}s")]
    PruneTooYoung {
        min_age_s: u64,
        min_age_s_floor: u64,
    },
    #[error("stored fence state is invalid: {0}")]
    Corrupt(String),
    /// The database's fence kit is newer than this build's: never
    /// downgraded, never overwritten.
    #[error("the fence kit in this database is at version {installed}, newer than this install (version {supported}): install that release or a later one, never an older one over it")]
    NewerSchema { installed: i32, supported: i32 },
    #[cfg(feature = "sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[cfg(feature = "postgres")]
    #[error("postgres: {}", crate::postgres::describe_error(.0))]
    Postgres(#[from] tokio_postgres::Error),
}

/// A token built from an integer out of range is bad input, as from
/// [`crate::FenceRequest::new`]'s other arguments.
impl From<baton_core::TokenError> for FenceError {
    fn from(e: baton_core::TokenError) -> Self {
        Self::Input(InputError::Token(e))
    }
}

/// Operation records younger than this are kept by every prune: a retry may
/// still be on its way.
pub const PRUNE_MIN_AGE_S_FLOOR: u64 = 3_600;

pub(crate) fn check_prune_age(min_age_s: u64) -> Result<(), FenceError> {
    if min_age_s < PRUNE_MIN_AGE_S_FLOOR {
        return Err(FenceError::PruneTooYoung {
            min_age_s,
            min_age_s_floor: PRUNE_MIN_AGE_S_FLOOR,
        });
    }
    Ok(())
}

/// A token read back from storage; anything out of range means corruption.
pub(crate) fn stored_token(value: i64) -> Result<crate::FencingToken, FenceError> {
    crate::FencingToken::from_bigint(value).map_err(|e| FenceError::Corrupt(e.to_string()))
}
