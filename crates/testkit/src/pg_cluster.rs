//! A private PostgreSQL cluster from the server binaries (initdb, pg_ctl),
//! for tests that restart or crash PostgreSQL: the machine's own server must
//! not be restarted under the other tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::TempDir;

/// The directory of the PostgreSQL server binaries: `BATON_PG_BIN`, or the
/// newest `/usr/lib/postgresql/*/bin` that has `initdb`.
pub fn pg_bin_dir() -> std::io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("BATON_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| std::io::Error::new(e.kind(), "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: install the postgresql server package (Debian: postgresql-15) or set BATON_PG_BIN"))?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no initdb under /usr/lib/postgresql/*/bin: install the postgresql server package or set BATON_PG_BIN")
    })
}

/// A new cluster in `data`: trust auth, user postgres, UTF8 (the fence kit
/// needs it), no fsync during initialization.
fn initdb(data: &Path) {
    let out = PgCluster::tool("initdb")
        .arg("-D")
        .arg(data)
        .args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A running private cluster; stopped (immediately) when dropped.
pub struct PgCluster {
    dir: TempDir,
    port: u16,
}

impl PgCluster {
    /// initdb refuses to run as root: as root, run the tools as `postgres`.
    fn tool(tool: &str) -> Command {
        let bin = pg_bin_dir().unwrap_or_else(|e| panic!("{e}")).join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        }
    }

    /// A fresh directory for a cluster, owned by `postgres` when running as root.
    fn owned_dir(tag: &str) -> TempDir {
        let dir = TempDir::new(tag);
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status();
            assert!(
                ok.is_ok_and(|s| s.success()),
                "chown of the cluster directory to postgres failed"
            );
        }
        dir
    }

    /// Creates and starts a cluster on a free loopback port.
    pub fn start(tag: &str) -> Self {
        let dir = Self::owned_dir(tag);
        initdb(&dir.path().join("data"));
        let cluster = Self {
            dir,
            port: free_port(),
        };
        cluster.start_again();
        cluster
    }

    /// Starts the cluster (again, after `ctl(&["stop", ...])`) on its port.
    pub fn start_again(&self) {
        self.ctl(&[
            "start",
            "-o",
            &format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {}",
                self.port,
                self.dir.path().display()
            ),
        ]);
    }

    /// The cluster's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A streaming standby of this cluster (pg_basebackup), started on its
    /// own port and made this cluster's synchronous standby: a commit on
    /// this primary returns only once the standby has it.
    pub fn synchronous_standby(&self, tag: &str) -> PgCluster {
        let dir = Self::owned_dir(tag);
        let out = Self::tool("pg_basebackup")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-X", "stream", "-c", "fast"])
            .output()
            .expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let standby = Self {
            dir,
            port: free_port(),
        };
        standby.start_again();
        self.psql("ALTER SYSTEM SET synchronous_standby_names = '*'");
        self.psql("SELECT pg_reload_conf()");
        standby
    }

    /// Runs one SQL statement with psql on its `postgres` database.
    pub fn psql(&self, sql: &str) -> String {
        let out = Self::tool("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-XAtc", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs `pg_ctl` with `args` on this cluster and waits for it.
    pub fn ctl(&self, args: &[&str]) {
        let out = Self::tool("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .arg("-w")
            .args(args)
            .output()
            .expect("run pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Turns TLS on with this certificate and key (copied into the data
    /// directory, the key readable by its owner only) and restarts.
    pub fn enable_tls(&self, cert: &Path, key: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let data = self.dir.path().join("data");
        std::fs::copy(cert, data.join("server.crt")).expect("copy the certificate");
        std::fs::copy(key, data.join("server.key")).expect("copy the key");
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod the key");
        if is_root() {
            for f in ["server.crt", "server.key"] {
                let ok = Command::new("chown")
                    .arg("postgres")
                    .arg(data.join(f))
                    .status();
                assert!(ok.is_ok_and(|s| s.success()), "chown {f}");
            }
        }
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
        text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).expect("write postgresql.conf");
        self.ctl(&["stop", "-m", "fast"]);
        self.start_again();
    }

    /// The connection string of its `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = Self::tool("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// Where [`free_port`] looks: below Linux's ephemeral range (32768 and
/// up), which outgoing connections draw their source ports from. A port
/// the kernel handed out for `bind(0)` is from that range, and a test's
/// server that binds it a moment later can find it taken by any process's
/// outgoing connection; one of these is only taken by another test's
/// choice, which bound it to check.
const FREE_PORTS: std::ops::Range<u32> = 20_000..32_700;

/// A loopback port nobody listens on now, outside the ephemeral range;
/// successive calls in one process give different ports.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let span = FREE_PORTS.end - FREE_PORTS.start;
    // Where this process starts, different from process to process.
    let start = *START.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        (std::process::id().wrapping_mul(2_654_435_761) ^ now) % span
    });
    for _ in 0..span {
        // A stride prime to the span visits every port once.
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FREE_PORTS.start + (start + step.wrapping_mul(7_919)) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free loopback port in {FREE_PORTS:?}")
}

/// The target directory of this build (tests run from `target/<profile>/deps`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

/// The run's shared private cluster: started by the first test process that
/// needs it (under a file lock), reused by the others and by later runs,
/// never the machine's own server. Its port is kept in `port` beside it.
pub fn shared_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = target_dir().join("baton-test-pg");
        std::fs::create_dir_all(&dir).expect("create the private cluster's directory");
        let lock = std::fs::File::create(dir.join("lock")).expect("create the cluster lock");
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("lock {}: {e}", dir.display()));
        let port = match running_port(&dir) {
            Some(port) => port,
            None => start_shared(&dir),
        };
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")
    })
    .clone()
}

fn running_port(dir: &Path) -> Option<u16> {
    let port: u16 = std::fs::read_to_string(dir.join("port"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    Some(port)
}

fn start_shared(dir: &Path) -> u16 {
    let data = dir.join("data");
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir)
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "chown of {} to postgres failed",
            dir.display()
        );
    }
    if !data.join("PG_VERSION").exists() {
        let _ = std::fs::remove_dir_all(&data);
        initdb(&data);
    }
    let port = free_port();
    let options = format!(
        "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=400 -c fsync=off",
        dir.display()
    );
    let out = PgCluster::tool("pg_ctl")
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "start", "-o", &options])
        .output()
        .expect("run pg_ctl");
    assert!(
        out.status.success(),
        "the private PostgreSQL cluster did not start: {}{} (log: {})",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        dir.join("log").display()
    );
    std::fs::write(dir.join("port"), port.to_string()).expect("write the cluster's port");
    port
}
