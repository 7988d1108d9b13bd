//! A private PostgreSQL cluster from the server binaries (initdb, pg_ctl),
//! for tests that restart or crash PostgreSQL: the machine's own server must
//! not be restarted under the other tests.

use std::path::PathBuf;
use std::process::Command;

use crate::TempDir;

/// The directory of the PostgreSQL server binaries: `BATON_PG_BIN`, or the
/// newest `/usr/lib/postgresql/*/bin` that has `initdb`.
pub fn pg_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("BATON_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: install the postgresql server package (Debian: postgresql-15) or set BATON_PG_BIN".to_string())?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop().ok_or_else(|| {
        "no initdb under /usr/lib/postgresql/*/bin: install the postgresql server package or set BATON_PG_BIN".into()
    })
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

    /// Creates and starts a cluster on a free loopback port.
    pub fn start(tag: &str) -> Self {
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let out = Self::tool("initdb")
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { dir, port };
        cluster.ctl(&[
            "start",
            "-o",
            &format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {}",
                cluster.dir.path().display()
            ),
        ]);
        cluster
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
