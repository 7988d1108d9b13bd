//! The fence kit: where fencing tokens are enforced.
//!
//! A lease cannot stop a paused worker from resuming; only the system that
//! accepts the final write can. This crate checks a token in the same
//! transaction as the write it protects, records the operation so a retry
//! returns the saved result, keeps a tombstone's generation floor after
//! deletion, makes cancellation durable, and publishes immutable objects by
//! a fenced pointer. It depends on no running lease server: tokens are
//! integers, from Baton or anywhere else.
//!
//! ```
//! use baton_fence::{decide, Decision, FenceRequest, FencingToken, Outcome};
//!
//! // Bob (token 108) published; Alice (token 107) resumes after a pause.
//! let (t108, t107) = (FencingToken::of(108).unwrap(), FencingToken::of(107).unwrap());
//! let bob = FenceRequest::new("statement:account-42:2026-09-13", t108, "publish-108", b"sha256:bob", b"gen-108.pdf").unwrap();
//! let Decision::Apply { next, .. } = decide(None, None, &bob).unwrap() else { panic!() };
//! let alice = FenceRequest::new("statement:account-42:2026-09-13", t107, "publish-107", b"sha256:alice", b"gen-107.pdf").unwrap();
//! let Decision::Refuse(outcome) = decide(Some(&next), None, &alice).unwrap() else { panic!() };
//! assert_eq!(outcome.label(), "stale");
//! ```
//!
#![warn(missing_docs)]
#![doc = include_str!("../../../docs/fence-kit.md")]

mod error;
pub mod metrics;
#[cfg(feature = "objects")]
pub mod objects;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod outbox;
#[cfg(feature = "postgres")]
pub mod postgres;
mod rule;
mod shared;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod types;

pub use error::{FenceError, PRUNE_MIN_AGE_S_FLOOR};

pub use rule::{
    cancel, decide, recreate, Decision, OperationRecord, PolicyMismatch, Recreate, ResourceState,
};
pub use shared::ExclusiveFloor;
pub use types::{
    resource_name, FenceRequest, FencingToken, Fingerprint, InputError, OperationId, Outcome,
    Policy, Publication, ResourceName, Sequence, Side, FINGERPRINT_LEN_BYTES_MAX,
    OPERATION_LEN_BYTES_MAX, RESOURCE_LEN_BYTES_MAX, RESULT_LEN_BYTES_MAX,
};
