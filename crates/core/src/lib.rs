//! The pure core of Baton: resource names, fencing tokens and the lease table.
//!
//! Nothing in this crate reads a clock, draws random numbers or does I/O.
//! Time arrives as [`MonoMs`] values, acquisition ids arrive already drawn,
//! and every change that must reach the disk leaves as a [`Write`] in
//! [`Effects`]. The server is the shell that executes those effects.
//!
//! ```
//! use baton_core::{AcquireRequest, AcquireOutcome, AcquisitionId, Epoch, LeaseTable, Limits, MonoMs, ResourceName};
//!
//! let mut table = LeaseTable::new(Limits::default(), Epoch::FIRST, 0);
//! let name = ResourceName::parse("statement:account-42:2026-09-13").unwrap();
//! let request = AcquireRequest::single(name, AcquisitionId::from_bytes([7; 16]), 30_000);
//! let AcquireOutcome::Granted(grants) = table.acquire(MonoMs(0), request).unwrap() else { panic!() };
//! let effects = table.take_effects();
//! // The grant must be durable before anyone hears about its token.
//! assert!(effects.sync);
//! assert_eq!(grants[0].token.get(), (1 << 40) | 1);
//! ```
#![warn(missing_docs)]

pub mod bad;
mod holder;
mod ids;
pub mod invisible;
mod name;
pub mod pipeline;
pub mod quota;
mod table;
mod token;

pub use holder::{Holder, HolderError, HOLDER_LEN_BYTES_MAX};
pub use ids::{
    hex, parse_hex16, AcquisitionDigest, AcquisitionId, RequestId, SessionDigest, SessionId,
    WaiterId,
};
pub use name::{NameError, ResourceName, RESOURCE_NAME_LEN_BYTES_MAX, SLOT_SEPARATOR};
pub use table::recovery_delay_ms;
pub use table::{
    first_seq, AcquireError, AcquireOutcome, AcquireRequest, Attempt, Blocker, Change, ChangeOf,
    Claim, Effects, Event, FenceOutcome, Grant, Held, HeldFor, HolderChange, KeptAlive, Kind,
    LeaseRecord, LeaseStatus, LeaseTable, LeaseTerm, Limits, MonoMs, NotAcquired, NumberedChange,
    QuotaUse, ReleaseOutcome, RenewOutcome, Resumed, SessionCheck, SessionError, SessionRecord,
    SetPermitsError, Shape, SlotStatus, WaitResult, Write, BLOCKING_HOLDERS_MAX, ENDS_PER_STEP,
    HISTORY_LEN_MAX, PERMITS_MAX, RECOVERED_ENDS_PER_MS, REPEATS_REMEMBERED_MAX, REPEAT_MEMORY_MS,
    TTL_MS_MAX,
};
pub use token::{
    restore_epoch, Epoch, FencingToken, RestoreFloors, TokenError, COUNTER_BITS, COUNTER_MAX,
    EPOCH_FLOOR_ORIGIN_UNIX_S, EPOCH_FLOOR_STEP_S, EPOCH_FLOOR_YEARS_MAX, EPOCH_MAX,
};
