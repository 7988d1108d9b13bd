//! The integration tests of this crate, one binary with a module per
//! subject: a change re-links one test binary, not one per file.

mod concurrency;
mod objects;
mod outbox;
#[cfg(feature = "s3")]
mod s3;
mod scenarios;
mod sql_functions;
mod sql_install;
mod sql_names;
