//! How long a lease lives: its own TTL, or its session's life.

use crate::SessionDigest;

/// How long a lease lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseTerm {
    /// Its own TTL: it ends `ttl_ms` after the grant or the last renewal.
    Own {
        /// Checked against the table's TTL limits.
        ttl_ms: u64,
    },
    /// Tied to this session: held while the session lives, ended with it
    /// (a waiter on it is withdrawn when it ends).
    Session(SessionDigest),
}

impl LeaseTerm {
    /// The session a lease on this term is tied to.
    pub fn session(self) -> Option<SessionDigest> {
        match self {
            LeaseTerm::Own { .. } => None,
            LeaseTerm::Session(digest) => Some(digest),
        }
    }
}
