//! The Baton lease server.
//!
//! [`start`] binds the gRPC and HTTP listeners, recovers the lease state from
//! the store under the data directory and serves until
//! [`RunningServer::shutdown`] is called or the engine fails.
//!
//! The parts, each a folder (ARCHITECTURE.md has the map):
//! - `engine/`: the lease table behind a lock, its timer and committer
//!   threads, and what watches and the operator page read from it;
//! - `service/`: the gRPC service (unary calls, the session stream, watch);
//! - `http/`: the HTTP port (health, `/metrics`, the operator page);
//! - `access/`: authentication, the one gate, the guessing penalty, audit;
//! - `net/`: connections, their limits, and TLS;
//! - `cluster/`: leadership on PostgreSQL and the seat that says who answers;
//! - `quota.rs`: the quota file, and the rates and watches it bounds;
//! - `config.rs` and `start.rs`: what a server is told and the one path that
//!   starts and stops it.
//!
//! I/O ordering (see docs/design.md): a reply that carries a token, or that
//! follows a batch that issued one, is sent only after the batch's writes
//! were committed with fsync.
#![warn(missing_docs)]

mod access;
mod cluster;
mod config;
mod engine;
mod history;
mod http;
mod metrics;
mod net;
mod observed;
mod quota;
mod service;
mod start;

pub use access::audit::{Audit, Record as AuditRecord};
pub use cluster::seat::LEADER_METADATA;
pub use cluster::{ClusterConfig, LEADER_TTL_MS_DEFAULT, LEADER_TTL_MS_MIN};
pub use config::{
    EngineFailure, ServerConfig, ServerError, HANDSHAKE_TIMEOUT_MS_DEFAULT, IDLE_TIMEOUT_MS_DEFAULT,
};
pub use http::{check_allowed_name, BadHostName};
pub use metrics::Metrics;
pub use net::tls::TlsFiles;
pub use start::{start, start_cluster, start_with_store, RunningServer};
