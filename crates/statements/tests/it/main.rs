//! The integration tests of this crate, one binary with a module per
//! subject: a change re-links one test binary, not one per file.

#[cfg(feature = "chaos")]
mod deliveries;
#[cfg(feature = "chaos")]
mod faults;
mod prometheus;
mod recovery;
mod tracing;
