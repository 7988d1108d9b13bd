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

/// The client in `slot`, connected first if there is none (with calls
/// bounded at 2 s): for tests whose server is killed and restarted under
/// them. `None`, after a 5 ms pause, while the server is down.
pub async fn reconnect<'a>(
    slot: &'a mut Option<baton_client::Client>,
    url: &str,
) -> Option<&'a mut baton_client::Client> {
    if slot.is_none() {
        match baton_client::Client::connect(url).await {
            Ok(c) => *slot = Some(c.with_rpc_timeout(std::time::Duration::from_secs(2))),
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                return None;
            }
        }
    }
    slot.as_mut()
}

/// Takes `name` try-once for `ttl` with `slot`'s client; if granted,
/// records the grant in `history` and releases it, or, one time in three,
/// abandons it as a crashed worker would (its lease then ends no earlier
/// than one TTL after the send, which the record claims). `true` if
/// granted. A failed call drops the client, for [`reconnect`] to replace.
pub async fn take_once(
    slot: &mut Option<baton_client::Client>,
    name: &str,
    ttl: std::time::Duration,
    rng: &mut baton_client::rng::Rng,
    history: &std::sync::Mutex<Vec<baton_faults::grants::Grant>>,
) -> bool {
    use std::time::{Duration, Instant};
    let Some(c) = slot.as_mut() else {
        return false;
    };
    let sent = Instant::now();
    match c.acquire(name, ttl, Duration::ZERO).await {
        Ok(baton_client::Acquired::Granted(lease)) => {
            let abandoned = rng.below(3) == 0;
            history.lock().unwrap().push(baton_faults::grants::Grant {
                resource: name.to_string(),
                token: lease.token.get(),
                invoked: sent,
                answered: Instant::now(),
                earliest_end: abandoned.then(|| sent + ttl),
            });
            if !abandoned {
                let _ = c.release(name, &lease.acquisition_id).await;
            }
            true
        }
        Ok(baton_client::Acquired::NotAcquired(_)) => {
            tokio::time::sleep(Duration::from_millis(1)).await;
            false
        }
        Err(_) => {
            *slot = None;
            false
        }
    }
}
