//! Shared test fixtures. Each test owns its data: a PostgreSQL database
//! created for it and dropped after it, a directory removed after it.
#![warn(missing_docs)]

pub mod json;
pub mod otlp;
pub mod pg_cluster;
pub mod pki;
pub mod process;
pub mod s3;
pub mod smtp;
pub mod store;
pub mod store_contract;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::{Client, NoTls};

static N: AtomicU64 = AtomicU64::new(0);

/// A name unique to this process and call, for databases and directories.
pub fn unique(tag: &str) -> String {
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fault test's seed: `var` from the environment if it is set (to
/// rerun a run), else one drawn from the clock. Print it.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(1, |d| d.as_nanos() as u64 | 1)
        })
}

/// The administrative connection string: `BATON_TEST_PG` if set (for
/// example `host=127.0.0.1 user=postgres dbname=postgres` for the machine's
/// own server); otherwise the test run's private cluster, started on first
/// use under the target directory and shared by every test process.
pub fn pg_admin_url() -> String {
    match std::env::var("BATON_TEST_PG") {
        Ok(url) if !url.is_empty() => url,
        _ => pg_cluster::shared_url(),
    }
}

/// Connects and drives the connection in the background.
pub async fn pg_connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for this test ({url}): {e}"));
    tokio::spawn(connection);
    client
}

/// Every function of `schema`, by name, each overload's definition as the
/// server prints it (`pg_get_functiondef`), in a stable order: what the
/// SQL function files of the fence kit and of the cluster store are
/// checked against.
pub async fn pg_functions_in_force(
    client: &Client,
    schema: &str,
) -> std::collections::BTreeMap<String, String> {
    let rows = client
        .query(
            "SELECT p.proname, pg_get_functiondef(p.oid)
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = $1
              ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)",
            &[&schema],
        )
        .await
        .expect("read the functions in force");
    let mut out = std::collections::BTreeMap::<String, String>::new();
    for row in rows {
        let entry = out.entry(row.get(0)).or_default();
        if !entry.is_empty() {
            entry.push('\n');
        }
        entry.push_str(row.get::<_, &str>(1).trim_end());
        entry.push_str(";\n");
    }
    out
}

/// A database of its own, dropped (with any connections left) when the test ends.
pub struct PgDb {
    /// The database's name (unique to the test).
    pub name: String,
    /// Connection string for this database.
    pub url: String,
}

impl PgDb {
    /// Creates a database named after `tag` and this process.
    pub async fn create(tag: &str) -> Self {
        let name = unique(tag);
        let admin = pg_connect(&pg_admin_url()).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let url = format!(
            "{} dbname={name}",
            pg_admin_url().replace("dbname=postgres", "")
        );
        Self { name, url }
    }

    /// A new connection to the database.
    pub async fn connect(&self) -> Client {
        pg_connect(&self.url).await
    }

    /// The server's TCP address, for a fault proxy to forward to.
    pub fn upstream(&self) -> std::net::SocketAddr {
        let c: tokio_postgres::Config = self.url.parse().expect("a connection string");
        let host = match c.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            other => panic!("the fault tests need PostgreSQL over TCP, not {other:?}"),
        };
        let port = c.get_ports().first().copied().unwrap_or(5432);
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .expect("resolve the PostgreSQL host")
            .next()
            .expect("an address for the PostgreSQL host")
    }

    /// A connection string for this database through a proxy on loopback `port`.
    pub fn url_via(&self, port: u16) -> String {
        let c: tokio_postgres::Config = self.url.parse().expect("a connection string");
        let mut url = format!("host=127.0.0.1 port={port} dbname={}", self.name);
        if let Some(user) = c.get_user() {
            url += &format!(" user={user}");
        }
        url
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop may run inside or outside a runtime: use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let admin = pg_connect(&pg_admin_url()).await;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates an empty directory named after `tag` and this process.
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(unique(tag));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        Self(path)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `check` until it holds, failing the test after 20 seconds: for
/// state another process or task changes and nothing announces.
pub async fn until(check: impl AsyncFnMut() -> bool) {
    eventually(std::time::Duration::from_secs(20), check).await
}

/// Polls `check` until it holds, failing the test after `timeout`.
pub async fn eventually(timeout: std::time::Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached within {timeout:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Whether process `pid` is stopped (SIGSTOP delivered and taken), from `/proc`.
pub fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    })
}
