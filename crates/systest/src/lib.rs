//! System tests of Baton: the server, the client library and the cluster,
//! each test against real `baton` processes over real sockets. The tests
//! live in `tests/`, one file per part; this library binds the test kit's
//! fixtures to the `baton` binary of the same build. The command line's
//! own tests (usage, `--json` shapes, `run`, `hold`, holders) stay with it
//! in `crates/cli/tests`.
//!
//! The binary is found beside the test binaries
//! ([`baton_testkit::process::workspace_bin`]): run these tests with
//! `cargo nextest run --workspace` (or `scripts/test`), which builds it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;

pub use baton_testkit::json::{json_lease_str, json_lease_u64, json_str, json_u64};
pub use baton_testkit::process::{Proc, Server};
pub use baton_testkit::{eventually, TempDir};

/// The `baton` binary under test.
pub static BIN: LazyLock<PathBuf> =
    LazyLock::new(|| baton_testkit::process::workspace_bin("baton"));

/// Starts this build's `baton serve` on ephemeral ports with short TTL bounds.
pub fn serve(data_dir: &Path, extra: &[&str]) -> Server {
    Server::start(&BIN, data_dir, extra)
}

/// Runs the `baton` command line and returns its output.
pub fn cli(args: &[&str]) -> Output {
    Command::new(&*BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run baton")
}
