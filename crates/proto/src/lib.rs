//! Wire types for the Baton gRPC API (`proto/baton/v1/baton.proto`) and their
//! conversion into validated core types.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("baton.v1");
}

/// Largest encoded request the server decodes, in bytes. A request naming
/// the maximum number of maximum-length resources fits well inside it.
pub const REQUEST_LEN_BYTES_MAX: usize = 256 * 1024;
/// Default and maximum page sizes of `List`.
pub const LIST_LIMIT_DEFAULT: u32 = 100;
pub const LIST_LIMIT_MAX: u32 = 1_000;
/// Snapshot format version written by this build.
pub const SNAPSHOT_FORMAT: u32 = 1;
