//! Who may call and what is written about it: the auth table
//! (`auth.rs`), the one gate every entry point calls (`gate.rs`), the
//! guessing penalty (`penalty.rs`) and the audit log (`audit.rs`); here,
//! loading them with the TLS material at start and reloading them on
//! SIGHUP.

pub(crate) mod action;
pub(crate) mod audit;
pub(crate) mod auth;
pub(crate) mod gate;
pub(crate) mod penalty;

use std::sync::Arc;

use tracing::{error, info};

pub(crate) use action::Action;
pub(crate) use gate::{Admitted, Caller, Gate};

use crate::config::{ServerConfig, ServerError};
use crate::metrics::Metrics;
use crate::net::tls::{server_tls, Tls};
use crate::quota::Quotas;

/// What guards the ports: TLS acceptors, the auth table and the audit sink.
pub(crate) struct Guards {
    pub(crate) grpc_tls: Option<Tls>,
    pub(crate) http_tls: Option<Tls>,
    auth: Arc<auth::Auth>,
    audit: Arc<audit::Audit>,
    /// Shared by both ports: a guesser is slowed wherever it guesses.
    penalties: Arc<penalty::Penalties>,
    /// The quota file in force (reloaded with the auth file).
    pub(crate) quotas: Arc<Quotas>,
}

impl Guards {
    /// The server's one gatekeeper, for every entry point.
    pub(crate) fn gate(&self, metrics: &Arc<Metrics>) -> Gate {
        Gate::new(
            self.auth.clone(),
            self.audit.clone(),
            self.penalties.clone(),
            metrics.clone(),
        )
    }
}

/// Loads the certificates, the auth file and the audit log, or names the
/// file and the rule that stop the server from starting.
pub(crate) fn guards(config: &ServerConfig) -> Result<Guards, ServerError> {
    let (grpc_tls, http_tls) = match &config.tls {
        None => (None, None),
        Some(files) => {
            let grpc = server_tls(files, &[b"h2"], true)
                .map_err(|e| ServerError::Config(e.to_string()))?;
            let http = server_tls(files, &[b"http/1.1"], false)
                .map_err(|e| ServerError::Config(e.to_string()))?;
            (Some(grpc), Some(http))
        }
    };
    let auth = match &config.auth_file {
        Some(path) => {
            let auth = auth::Auth::load(path).map_err(|e| ServerError::Config(e.to_string()))?;
            warn_about_auth_file(path, &auth);
            auth
        }
        None => auth::Auth::off(),
    };
    let quotas = match &config.quota_file {
        Some(path) => Quotas::load(path, config.limits.n_waiters_max as u64)
            .map_err(|e| ServerError::Config(e.to_string()))?,
        None => Quotas::off(),
    };
    let audit = match &config.audit_log {
        Some(path) => audit::Audit::to_file(path)
            .map_err(|e| ServerError::Config(format!("--audit-log {}: {e}", path.display())))?,
        None => audit::Audit::log_only(),
    };
    for (port, addr) in [("gRPC", Some(config.listen)), ("HTTP", config.http_listen)] {
        if let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) {
            if config.tls.is_none() {
                tracing::warn!(%addr, "the {port} port listens beyond loopback without TLS: tokens, acquisition ids and session ids cross the network in clear text (--tls-cert, --tls-key)");
            }
        }
    }
    if config.auth_file.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(addr = %config.listen, "auth is off: anyone who reaches the gRPC port may acquire, fence and back up any resource (--auth-file, --require-auth)");
    }
    Ok(Guards {
        grpc_tls,
        http_tls,
        auth: Arc::new(auth),
        audit: Arc::new(audit),
        penalties: Arc::default(),
        quotas: Arc::new(quotas),
    })
}

/// Says loudly what is wrong with the auth file in force: it grants
/// nothing to anybody (every call will be refused), or others may read or
/// write it.
fn warn_about_auth_file(path: &std::path::Path, auth: &auth::Auth) {
    if auth.table().is_some_and(|t| !t.grants_anything()) {
        tracing::warn!(path = %path.display(), "the auth file grants nothing to anybody: every call will be refused until it is fixed and reloaded (SIGHUP)");
    }
    if let Some(warning) = auth::file_mode_warning(path) {
        tracing::warn!("{warning}");
    }
}

/// Reloads the auth file, the quota file and the TLS certificate, key and client CA on
/// every SIGHUP; a file that does not parse (or a key that does not match)
/// leaves what is in force unchanged, and the log says why. Connections
/// already accepted keep the certificate they were accepted with. The
/// handler is installed even with nothing to reload, so that a reload
/// never ends the server.
pub(crate) fn reload_on_sighup(guards: &Guards, config: &ServerConfig) -> Result<(), ServerError> {
    let auth_path = config.auth_file.clone();
    let ports: Vec<(&'static str, Tls)> = [("gRPC", &guards.grpc_tls), ("HTTP", &guards.http_tls)]
        .into_iter()
        .filter_map(|(port, t)| t.clone().map(|t| (port, t)))
        .collect();
    // Installed even with nothing to reload: SIGHUP's default action ends
    // the process, and `systemctl reload` sends it.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| ServerError::Config(format!("cannot install the SIGHUP handler: {e}")))?;
    let auth = guards.auth.clone();
    let quotas = guards.quotas.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if auth_path.is_none() && ports.is_empty() && !quotas.is_on() {
                info!("SIGHUP: nothing to reload (no auth file, no quota file, no TLS)");
            }
            if let Some(path) = quotas.path() {
                match quotas.reload() {
                    Ok((prefixes, principals)) => {
                        info!(path = %path.display(), prefixes, principals, "quota file reloaded")
                    }
                    Err(e) => {
                        error!(error = %e, "quota file not reloaded; the previous quotas stay in force")
                    }
                }
            }
            if let Some(path) = &auth_path {
                match auth.reload() {
                    Ok(n) => {
                        info!(path = %path.display(), principals = n, "auth file reloaded");
                        warn_about_auth_file(path, &auth);
                    }
                    Err(e) => {
                        error!(error = %e, "auth file not reloaded; the previous rules stay in force")
                    }
                }
            }
            for (port, tls) in &ports {
                match tls.reload() {
                    Ok(()) => info!(
                        port,
                        "TLS certificate, key and client CA reloaded; new connections use them"
                    ),
                    Err(e) => {
                        error!(port, error = %e, "TLS material not reloaded; the previous certificate stays in force")
                    }
                }
            }
        }
    });
    Ok(())
}
