//! Baton's lease state in PostgreSQL, shared by the servers of a cluster.
//!
//! - [`schema`]: the `baton_server` schema, created and checked by the
//!   server itself (versioned; a newer schema or another cluster's is refused).
//! - [`leader`]: the leadership lease (one row, a term that only goes up).
//! - [`election`]: the pure rule for when a follower may take over, and the
//!   leader's own deadline; no I/O, no clock.
//! - [`PgLeaseStore`]: the [`baton_store::LeaseStore`] a leader commits to;
//!   every commit is refused unless its term is still the current one.
//!   While it lives, it vacuums the tables its commits churn (`vacuum`).
#![warn(missing_docs)]

pub mod election;
pub mod leader;
pub mod schema;
mod store;
mod vacuum;

pub use store::PgLeaseStore;

/// Why the PostgreSQL store cannot be used.
#[allow(missing_docs)] // variant fields are named for what they hold; the messages explain them
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    #[error("the store address is not a PostgreSQL connection string ({why}); use postgres://USER@HOST:PORT/DB or 'host=... dbname=...'")]
    BadUrl { why: String },
    #[error("cannot connect to the store database: {0}")]
    Connect(String),
    #[error("the store database refused the connection: {0}")]
    Refused(String),
    #[error("the store database refused {action}: {message}; the role needs CREATE on the database (first start) and SELECT, INSERT, UPDATE, DELETE on schema baton_server")]
    Privileges {
        action: &'static str,
        message: String,
    },
    #[error("the baton_server schema has version {found}, written by a newer Baton; this build knows version {supported} and will not touch it")]
    NewerSchema { found: i32, supported: i32 },
    #[error("the baton_server schema in this database belongs to cluster {found:?}, not {expected:?}: two clusters must not share one database (they would share tokens); use another database or --cluster {found}")]
    ClusterMismatch { expected: String, found: String },
    #[error(
        "the cluster name {0:?} is invalid: use 1 to 64 characters from a-z, 0-9, '-' and '_'"
    )]
    BadClusterName(String),
    #[error("store database error: {0}")]
    Db(String),
}

impl PgError {
    /// Whether retrying later may help (the database is down or busy), as
    /// opposed to a problem that needs a person (URL, privileges, schema).
    pub fn is_transient(&self) -> bool {
        matches!(self, PgError::Connect(_) | PgError::Db(_))
    }
}

/// The full text of a database error: its message, detail and SQLSTATE.
pub(crate) fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = db.message().to_string();
            if let Some(d) = db.detail() {
                m = format!("{m} ({d})");
            }
            format!("{m} (SQLSTATE {})", db.code().code())
        }
        None => baton_pgconn::describe(e),
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
            return PgError::Privileges {
                action: "an operation",
                message: db_message(&e),
            };
        }
        if e.as_db_error().is_none() {
            return PgError::Connect(db_message(&e));
        }
        PgError::Db(db_message(&e))
    }
}

/// Where the store is and how to reach it (TLS as libpq's `sslmode` and
/// friends say; see `baton-pgconn`).
pub use baton_pgconn::Target as PgTarget;

/// Parses a store address: a `postgres://` URL or a `key=value` string,
/// with libpq's SSL settings (`sslmode`, `sslrootcert`, `sslcert`,
/// `sslkey`, or `PGSSLMODE`...).
pub fn parse_url(url: &str) -> Result<PgTarget, PgError> {
    let looks_like =
        url.starts_with("postgres://") || url.starts_with("postgresql://") || url.contains('=');
    if !looks_like {
        return Err(PgError::BadUrl {
            why: format!("{url:?} is neither a postgres:// URL nor key=value pairs"),
        });
    }
    let mut target = baton_pgconn::parse(url).map_err(|e| PgError::BadUrl { why: e.0 })?;
    let config = &mut target.config;
    if config.get_hosts().is_empty() {
        return Err(PgError::BadUrl {
            why: "it names no host".into(),
        });
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(std::time::Duration::from_secs(5));
    }
    config.keepalives_idle(std::time::Duration::from_secs(5));
    config.application_name("baton-server");
    Ok(target)
}

/// Connects and drives the connection on the current runtime.
pub async fn connect(target: &PgTarget) -> Result<tokio_postgres::Client, PgError> {
    target.connect().await.map_err(|e| {
        use tokio_postgres::error::SqlState;
        // The server answered: a wrong database, role or password needs
        // a person; starting up, shutting down or full is transient.
        let transient = [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::TOO_MANY_CONNECTIONS,
        ];
        let message = db_message(&e);
        // A certificate that does not verify (another CA, another name)
        // is a setting to fix, not an outage to wait out.
        let certificate = message.contains("invalid peer certificate");
        match e.code() {
            Some(code) if !transient.contains(code) => PgError::Refused(message),
            _ if certificate => PgError::Refused(message),
            _ => PgError::Connect(message),
        }
    })
}

/// A random 64-bit hex id (store ids, node ids).
pub fn random_id() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
