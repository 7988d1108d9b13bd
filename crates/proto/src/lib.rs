//! Wire types for the Baton gRPC API (`proto/baton/v1/baton.proto`) and their
//! conversion into validated core types.

pub mod codec;

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("baton.v1");
}

/// The service as the server implements it: the messages of [`v1`], except
/// that a `Watch` answer is an [`wire::EncodedWatchResponse`], so an event
/// is encoded once whatever the number of watchers it goes to.
pub mod server {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/server/baton.v1.rs"));
}

pub mod wire;

/// Largest encoded request the server decodes, in bytes. A request naming
/// the maximum number of maximum-length resources fits well inside it.
pub const REQUEST_LEN_BYTES_MAX: usize = 256 * 1024;
/// Default and maximum page sizes of `List`.
pub const LIST_LIMIT_DEFAULT: u32 = 100;
pub const LIST_LIMIT_MAX: u32 = 1_000;
/// Snapshot format version written by this build: 2 holds acquisition
/// digests (`Snapshot.stored_leases`), never acquisition ids.
pub const SNAPSHOT_FORMAT: u32 = 2;
/// Leases per part of a `BackupParts` answer (about 200 KiB encoded).
pub const BACKUP_PART_LEASES: usize = 4_096;
/// The earlier format, whose `leases` held usable acquisition ids. A restore
/// still reads it (it drops every lease anyway).
pub const SNAPSHOT_FORMAT_WITH_IDS: u32 = 1;

/// gRPC metadata key on a follower's UNAVAILABLE answer: the leader's
/// advertised address, empty while none is known (see `baton.proto`).
pub const LEADER_METADATA: &str = "baton-leader";
