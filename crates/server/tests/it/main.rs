//! The integration tests of this crate, one binary with a module per
//! subject: a change re-links one test binary, not one per file.

mod session_stream;
mod store_seam;
