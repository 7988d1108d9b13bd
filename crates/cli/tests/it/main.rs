//! The integration tests of this crate, one binary with a module per
//! subject: a change re-links one test binary, not one per file.

mod command_line;
mod holder;
mod logs;
mod ownership;
mod run;
mod tree;
