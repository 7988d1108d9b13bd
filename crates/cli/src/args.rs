//! The `baton` command line: flag definitions only. Values are validated
//! into configuration by the subcommand modules.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use baton_client::flags::{parse_duration, parse_positive_duration};

pub const EXIT_CODES: &str = "Exit codes:
  0  success (also: release of a lease that was not held, which changes nothing)
  1  any other failure (server unreachable, outcome unknown, storage error)
  2  invalid usage or input (bad name, TTL or wait out of bounds, bad flag)
  3  not acquired (held by someone else, or the wait ran out)
  4  not owner (renew of a lease that expired, was released, fenced or
     replaced; hold: the lease was lost while held)
  5  refused by the server's auth rules (unauthenticated, or permission denied)
  6  expired on arrival: the grant or renewal came back later than its TTL
     counted from when the request was sent (released, best effort)";

mod serve;
mod shape;
pub use serve::{command, parse_from, ServeArgs};
pub use shape::{parse_permits, ShapeError, ShapeOpt};

#[derive(Parser)]
#[command(name = "baton", version, about = "Leases with fencing tokens that make stale workers harmless", after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Clone)]
pub struct ClientOpts {
    /// Server address: HOST (port 7700), HOST:PORT, [IPv6]:PORT, a bare
    /// PORT (on 127.0.0.1), or a URL (http://, or https:// with --tls-ca);
    /// for a cluster, several separated by commas (all are dialed at once
    /// and the client finds the leader).
    #[arg(
        long,
        env = "BATON_SERVER",
        default_value = "127.0.0.1:7700",
        global = true
    )]
    pub server: String,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The CA (PEM) that signed the server's certificate: connect over TLS
    /// (a bare host:port then means https://).
    #[arg(long, env = "BATON_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for a server that asks for one; with --tls-key.
    #[arg(long, env = "BATON_CLIENT_CERT", global = true, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "BATON_CLIENT_KEY", global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A file holding the bearer token sent with every request.
    #[arg(long, env = "BATON_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// How long to wait for an answer, beyond any --wait; past it the
    /// outcome is unknown (exit 1).
    #[arg(long, env = "BATON_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration, global = true)]
    pub timeout: Duration,
    /// How long a server has to answer a new connection before it is
    /// passed over for another (nothing was sent to it); also how long an
    /// open connection may leave a ping unanswered.
    #[arg(long, env = "BATON_DIAL_TIMEOUT", default_value = "1s", value_parser = parse_positive_duration, global = true)]
    pub dial_timeout: Duration,
}

/// Who holds the leases a command acquires, as status, list, watch and
/// the server's logs show it.
#[derive(Args, Clone, Default)]
pub struct HolderOpt {
    /// Describe the holder (at most 256 bytes, no control characters)
    /// [default: USER@HOST pid PID]
    #[arg(long, env = "BATON_HOLDER", value_parser = parse_holder)]
    pub holder: Option<baton_core::Holder>,
}

fn parse_holder(raw: &str) -> Result<baton_core::Holder, baton_core::HolderError> {
    baton_core::Holder::parse(raw)
}

impl HolderOpt {
    /// The description given, or `user@host pid N` for this process.
    pub fn resolve(&self) -> baton_core::Holder {
        self.holder.clone().unwrap_or_else(default_holder)
    }
}

/// `user@host pid N`: the user from the environment (or the uid), the
/// host name, this process's id; each cut so the whole fits the limit.
fn default_holder() -> baton_core::Holder {
    let clean = |s: String| -> String {
        s.chars()
            .filter(|c| !c.is_control())
            .take(100)
            .collect::<String>()
    };
    let uid = nix::unistd::getuid();
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .or_else(|| Some(nix::unistd::User::from_uid(uid).ok()??.name))
        .unwrap_or_else(|| format!("uid{uid}"));
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    let text = format!("{}@{} pid {}", clean(user), clean(host), std::process::id());
    baton_core::Holder::parse(&text).expect("built within the rules")
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the lease server (on the embedded store, or with --store as one
    /// server of a cluster on PostgreSQL).
    Serve(ServeArgs),
    /// The cluster as a server sees it: leader, term, members.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Acquire one resource, or several all or nothing.
    Acquire {
        /// Resource names; with several, every lease is granted or none.
        #[arg(required = true)]
        names: Vec<String>,
        /// Lease duration, like 500ms, 30s or 5m [default: the server's --default-ttl].
        #[arg(long, value_parser = parse_positive_duration)]
        ttl: Option<Duration>,
        /// Wait in line up to this long (0: try once).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        wait: Duration,
        #[command(flatten)]
        shape: ShapeOpt,
        #[command(flatten)]
        holder: HolderOpt,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Acquire on a session and hold until SIGINT or SIGTERM (then release).
    /// The leases are kept by the session's heartbeat; they expire one TTL
    /// after this process stops heartbeating (killed, paused, cut off).
    Hold {
        /// Resource names; with several, every lease is granted or none.
        #[arg(required = true)]
        names: Vec<String>,
        /// Session TTL, like 5s [default: the server's --default-ttl].
        #[arg(long, value_parser = parse_positive_duration)]
        ttl: Option<Duration>,
        /// Wait in line up to this long (0: try once).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        wait: Duration,
        #[command(flatten)]
        shape: ShapeOpt,
        #[command(flatten)]
        holder: HolderOpt,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Run a command while holding leases: acquire on a session, start the
    /// command with its tokens in the environment, keep the leases, and
    /// stop the command's whole process tree (every process it started, at
    /// any depth, setsid or not: SIGTERM, then SIGKILL by the lease's
    /// safe-until) if ownership is lost. When the command's main process
    /// exits, the rest of its tree has --kill-after to end before it is
    /// stopped the same way; the leases are released, and run exits with
    /// the command's code, only once no process of the tree is left. If
    /// run itself is killed, its guard process SIGKILLs the tree at once.
    /// See "Exit codes of run".
    #[command(after_help = RUN_EXIT_CODES)]
    Run(RunArgs),
    /// Campaign in a fenced leader election: wait in line until this
    /// candidate leads, print the leadership with its token, then hold it
    /// until SIGINT or SIGTERM (resign) or until it is lost (exit 4). With
    /// a command, run it while leading, like `run` (same exit codes).
    #[command(after_help = RUN_EXIT_CODES)]
    Elect(ElectArgs),
    /// Follow an election: the leader now, then every change of leader
    /// (one line each, JSON lines with --json), until SIGINT; resumes by
    /// itself like `watch`.
    Observe {
        /// The election's name.
        name: String,
        /// Exit 1 when the stream ends instead of resuming.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish,
    /// elvish, powershell) on stdout, for example
    /// `baton completions bash > /etc/bash_completion.d/baton`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (baton.1 and one per command, like
    /// baton-acquire.1) into DIR.
    Man {
        /// The directory to write them into (created if missing).
        #[arg(long, default_value = ".")]
        dir: std::path::PathBuf,
    },
    /// (internal) The guard of `run`'s command: the subreaper of its
    /// process tree, which it kills when `run` dies (see `tree.rs`).
    #[command(hide = true, name = "exec-child")]
    ExecChild {
        /// The `baton run` process that must still be the parent.
        parent: u32,
        /// The write end of `run`'s control pipe.
        #[arg(long)]
        control_fd: i32,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_parser = clap::value_parser!(std::ffi::OsString))]
        command: Vec<std::ffi::OsString>,
    },
    /// Extend a lease by its TTL, proving ownership with its acquisition id.
    Renew {
        /// The resource name.
        name: String,
        /// The acquisition id (32 hex digits) printed by acquire.
        #[arg(long)]
        acquisition: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Release a lease. Releasing twice, or with an old id, changes nothing.
    Release {
        /// The resource name.
        name: String,
        /// The acquisition id (32 hex digits) printed by acquire.
        #[arg(long)]
        acquisition: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Holder token, remaining TTL and waiters of a resource.
    Status {
        /// The resource name.
        name: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Resources with a lease or waiters, by name prefix.
    List {
        /// Only names starting with this ("" for all).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Continue after this name.
        #[arg(long)]
        start_after: Option<String>,
        /// Most entries in one page (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Follow every change of holder under a prefix: the snapshot's number
    /// and size (kind `snapshot`), the holders now (kind `held`), then
    /// each grant, hand-off, release, expiry and fence, one
    /// line each (JSON lines with --json), until SIGINT. Resumes by itself
    /// after a restart, a failover or a broken connection, from the last
    /// number printed; when the server no longer keeps the changes since
    /// then, prints a `resnapshot` line and the holders now.
    Watch {
        /// Names starting with this ("" for all).
        #[arg(default_value = "")]
        prefix: String,
        /// Start after this change's number (from an earlier watch's
        /// output) instead of from a snapshot.
        #[arg(long, value_name = "SEQ")]
        after_seq: Option<u64>,
        /// Exit 1 when the stream ends instead of resuming.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Revoke a resource's lease and advance its token (operator cancel).
    Fence {
        /// The resource name.
        name: String,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Operator: change a semaphore's number of permits while it has
    /// holders or waiters. Lowering it revokes no permit held (no new one
    /// is granted until fewer than N are held); raising it grants waiters
    /// at once.
    Permits {
        /// The semaphore's resource name.
        name: String,
        /// The new number of permits (1 to 4096).
        #[arg(value_parser = parse_permits)]
        permits: u32,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Backup and restore.
    #[command(subcommand)]
    Admin(Admin),
    /// Load generator: acquire → release cycles against a running server.
    Bench(BenchArgs),
}

pub const RUN_EXIT_CODES: &str = "Exit codes of run (GNU timeout's convention):
  N    the command's own exit code (128+S if a signal S ended it)
  124  ownership was lost while the command ran (fenced, session ended, or
       the lease's safe-until about to pass): the command was stopped
  125  the command did not run: not acquired (held, or the wait ran out),
       server unreachable or refused, or a bad flag
  126  the command was found but could not be started
  127  the command was not found";

/// `baton elect`.
#[derive(Args)]
pub struct ElectArgs {
    /// The election's name (a resource name).
    pub name: String,
    /// This candidate's value, shown as the leader's (at most 256 bytes,
    /// no control characters) [default: USER@HOST pid PID]
    #[arg(long, value_parser = parse_holder)]
    pub value: Option<baton_core::Holder>,
    /// Session TTL: a leader that stops heartbeating is deposed this long
    /// after its last heartbeat [default: the server's --default-ttl].
    #[arg(long, value_parser = parse_positive_duration)]
    pub ttl: Option<Duration>,
    /// Give up campaigning after this long (exit 3, or 125 with a
    /// command) [default: campaign until elected or interrupted].
    #[arg(long, value_parser = parse_positive_duration)]
    pub wait: Option<Duration>,
    /// With a command: grace between SIGTERM and SIGKILL when leadership
    /// is lost (as for `run`).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub kill_after: Duration,
    /// The command to run while leading, after `--`.
    #[arg(last = true, value_parser = clap::value_parser!(std::ffi::OsString))]
    pub command: Vec<std::ffi::OsString>,
    /// Say on stderr, at start, how the command's process tree is kept.
    #[arg(long)]
    pub verbose: bool,
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `baton run`.
#[derive(Args)]
pub struct RunArgs {
    /// Resource names; with several, every lease is granted or none.
    #[arg(required = true)]
    pub names: Vec<String>,
    /// Session TTL, like 30s [default: the server's --default-ttl].
    #[arg(long, value_parser = parse_positive_duration)]
    pub ttl: Option<Duration>,
    /// Wait in line up to this long (0: try once).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Grace between SIGTERM and SIGKILL when ownership is lost (at most
    /// half the TTL; SIGKILL never lands after the lease's safe-until);
    /// also how long the command's other processes may outlive its main
    /// process before they are stopped.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub kill_after: Duration,
    /// Say on stderr, at start, how the command's process tree is kept.
    #[arg(long)]
    pub verbose: bool,
    #[command(flatten)]
    pub shape: ShapeOpt,
    #[command(flatten)]
    pub holder: HolderOpt,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_parser = clap::value_parser!(std::ffi::OsString))]
    pub command: Vec<std::ffi::OsString>,
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `baton bench`: the load generator's flags (`baton_bench::command`)
/// and the client flags.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub bench: baton_bench::command::Args,
    #[command(flatten)]
    pub client: ClientOpts,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Show the leader, its term, and every server seen in the last hour
    /// (asks each --server address; followers answer too).
    Status {
        #[command(flatten)]
        client: ClientOpts,
    },
}

#[derive(Subcommand)]
pub enum Admin {
    /// Write a consistent snapshot of a running server to a file.
    Backup {
        /// The file to write (written beside, fsynced, then renamed).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Replace a (stopped) server's data directory, or a cluster's
    /// PostgreSQL store (--store), with a backup, in a new token epoch.
    ///
    /// The new epoch is above the backup's, above the replaced directory's
    /// (read from its store or its identity file), above every token the
    /// resources named by --floor-from recorded, at least --min-epoch, and at
    /// least a wall-clock floor. Every lease is dropped: holders acquire again.
    Restore(RestoreArgs),
}

/// `baton admin restore`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["from", "empty"])))]
pub struct RestoreArgs {
    /// The backup file written by `baton admin backup`.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// No backup: start an empty store (for a store file that was lost or damaged).
    #[arg(long)]
    pub empty: bool,
    /// The stopped server's data directory.
    #[arg(long, default_value = "baton-data", conflicts_with = "store")]
    pub data_dir: PathBuf,
    /// Restore a cluster's PostgreSQL store instead (its servers may keep
    /// running: the leader's term ends, the next leader loads the new epoch).
    #[arg(long, env = "BATON_STORE")]
    pub store: Option<String>,
    /// The cluster whose store --store holds.
    #[arg(
        long,
        env = "BATON_CLUSTER",
        default_value = "baton",
        requires = "store"
    )]
    pub cluster: String,
    /// Lowest acceptable new epoch.
    #[arg(long)]
    pub min_epoch: Option<u32>,
    /// A fence-kit database (postgres://… or sqlite:PATH) whose highest
    /// recorded token the new epoch must be above; repeat for several.
    #[arg(long)]
    pub floor_from: Vec<String>,
    /// Also append the restore's audit line (JSON) to this file; it always
    /// goes to stderr.
    #[arg(long, env = "BATON_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_config(extra: &[&str]) -> baton_server::ServerConfig {
        let args: Vec<std::ffi::OsString> = ["baton", "serve"]
            .iter()
            .chain(extra)
            .map(Into::into)
            .collect();
        match parse_from(&args).expect("parses").command {
            Command::Serve(a) => crate::serve::config(a),
            _ => unreachable!("serve was asked for"),
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        command().debug_assert();
    }

    #[test]
    fn serve_with_no_flags_is_the_servers_default_configuration() {
        // Debug output: ServerConfig holds no secrets and has no PartialEq.
        assert_eq!(
            format!("{:?}", serve_config(&[])),
            format!("{:?}", baton_server::ServerConfig::default())
        );
    }

    #[test]
    fn the_log_size_is_in_mib_within_its_range() {
        assert_eq!(
            serve_config(&["--log-size-mib", "64"]).log_len_bytes,
            64 << 20
        );
        for bad in ["0", "4097", "16MiB"] {
            let args: Vec<std::ffi::OsString> = ["baton", "serve", "--log-size-mib", bad]
                .iter()
                .map(Into::into)
                .collect();
            let e = parse_from(&args).err().expect("refused").to_string();
            assert!(e.contains("--log-size-mib"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_flag_still_overrides_its_default() {
        let c = serve_config(&["--default-ttl", "5s", "--max-connections", "7"]);
        assert_eq!((c.default_ttl_ms, c.connections_max), (5_000, 7));
    }

    #[test]
    fn the_help_shows_the_servers_defaults() {
        let mut serve = command().find_subcommand("serve").expect("serve").clone();
        let help = serve.render_long_help().to_string();
        for shown in [
            "[default: 30s]",
            "[default: 10m]",
            "[default: 1024]",
            "[default: 4s]",
        ] {
            assert!(help.contains(shown), "{shown} missing from:\n{help}");
        }
    }
}
