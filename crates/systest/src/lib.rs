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

/// Sends SIGHUP to `server` and waits (at most 10 s) until its log, which
/// it writes to `log`, says `needle` once more than before: the reload
/// (or its refusal) has happened.
pub async fn sighup_until(server: &Server, log: &Path, needle: &str) {
    let count = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches(needle)
            .count()
    };
    let seen = count();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(std::time::Duration::from_secs(10), async || count() > seen).await;
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
    match c.acquire(name, Some(ttl), Duration::ZERO).await {
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

/// Servers of one cluster on PostgreSQL, as real processes.
pub mod cluster {
    use std::time::Duration;

    use baton_testkit::pg_cluster::free_port;
    use baton_testkit::{eventually, TempDir};

    use super::{Server, BIN};

    /// Leadership TTL of the test clusters: failover in about a second.
    pub const LEADER_TTL: &str = "1s";

    /// Servers of one cluster, on fixed loopback ports so a killed one comes
    /// back on its address.
    pub struct Cluster {
        /// The servers, in the order they were started.
        pub nodes: Vec<Server>,
        _dir: TempDir,
    }

    impl Cluster {
        /// `n` servers on one store.
        pub fn start(store_url: &str, n: usize) -> Self {
            Self::start_each(&vec![store_url.to_string(); n])
        }

        /// `n` servers on one store, each given the `serve` flags `extra`.
        pub fn start_with(store_url: &str, n: usize, extra: &[&str]) -> Self {
            let listens = (0..n)
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect::<Vec<_>>();
            Self::spawn_with(&vec![store_url.to_string(); n], &listens, &[], extra)
        }

        /// One server per store address (each may go through its own proxy).
        pub fn start_each(store_urls: &[String]) -> Self {
            let listens = store_urls
                .iter()
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect::<Vec<_>>();
            Self::spawn(store_urls, &listens, &[])
        }

        /// `n` servers on one store, each reached through a fault proxy
        /// of its own and advertising it: every client call, redirects
        /// followed, passes a proxy. The proxies are in the servers' order.
        pub async fn start_behind_proxies(
            store_url: &str,
            n: usize,
        ) -> (Self, Vec<baton_faults::Proxy>) {
            let listens = (0..n)
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect::<Vec<_>>();
            let mut proxies = Vec::with_capacity(n);
            for listen in &listens {
                let upstream = listen.parse().expect("a socket address");
                proxies.push(baton_faults::Proxy::start(upstream).await.expect("a proxy"));
            }
            let advertise = proxies
                .iter()
                .map(|p| format!("http://127.0.0.1:{}", p.addr().port()))
                .collect::<Vec<_>>();
            let cluster = Self::spawn(&vec![store_url.to_string(); n], &listens, &advertise);
            (cluster, proxies)
        }

        fn spawn(store_urls: &[String], listens: &[String], advertise: &[String]) -> Self {
            Self::spawn_with(store_urls, listens, advertise, &[])
        }

        fn spawn_with(
            store_urls: &[String],
            listens: &[String],
            advertise: &[String],
            flags: &[&str],
        ) -> Self {
            let dir = TempDir::new("cluster");
            let nodes = store_urls
                .iter()
                .zip(listens)
                .enumerate()
                .map(|(i, (store_url, listen))| {
                    let mut extra = vec![
                        "--store".to_string(),
                        store_url.to_string(),
                        "--leader-ttl".to_string(),
                        LEADER_TTL.to_string(),
                    ];
                    if let Some(a) = advertise.get(i) {
                        extra.extend(["--advertise".to_string(), a.clone()]);
                    }
                    extra.extend(flags.iter().map(|f| f.to_string()));
                    Server::spawn(&BIN, listen, dir.path(), extra).unwrap_or_else(|e| panic!("{e}"))
                })
                .collect();
            Self { nodes, _dir: dir }
        }

        /// Every server's address, in order, separated by commas.
        pub fn endpoints(&self) -> String {
            self.nodes
                .iter()
                .map(|n| n.url())
                .collect::<Vec<_>>()
                .join(",")
        }

        /// The node whose `/healthz` says it leads (skipping `except`, which
        /// may be stopped and must not be asked).
        pub fn leader(&self, except: Option<usize>) -> Option<usize> {
            (0..self.nodes.len())
                .filter(|i| Some(*i) != except)
                .find(|i| self.nodes[*i].http_get("/healthz").contains("ok leader"))
        }

        /// The leader, once one says it leads (within 30 s).
        pub async fn wait_leader(&self, except: Option<usize>) -> usize {
            let mut found = None;
            eventually(Duration::from_secs(30), async || {
                found = self.leader(except);
                found.is_some()
            })
            .await;
            found.expect("a leader")
        }

        /// The process id of server `i`.
        pub fn pid(&self, i: usize) -> u32 {
            self.nodes[i].proc.pid()
        }
    }
}
pub use cluster::Cluster;
