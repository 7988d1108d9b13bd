//! The `baton` binary under test, and the test kit's fixtures bound to it.
#![allow(dead_code, unused_imports)] // each test binary uses a part of it

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub use baton_testkit::json::{json_lease_str, json_lease_u64, json_str, json_u64};
pub use baton_testkit::{eventually, TempDir};

pub const BIN: &str = env!("CARGO_BIN_EXE_baton");

pub use baton_testkit::process::Server;

/// Starts this build's `baton serve` on ephemeral ports with short TTL bounds.
pub fn serve(data_dir: &Path, extra: &[&str]) -> Server {
    Server::start(Path::new(BIN), data_dir, extra)
}

/// Runs the `baton` CLI and returns its output.
pub fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run baton")
}
