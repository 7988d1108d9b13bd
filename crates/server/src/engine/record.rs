//! What the table's events leave behind: counters and log lines.

use baton_core::{Event, FencingToken, Holder, ResourceName};
use tracing::{debug, info};

use super::Engine;

impl Engine {
    pub(super) fn record(&self, events: &[Event]) {
        let m = &self.metrics;
        for event in events {
            match event {
                Event::Granted {
                    resource,
                    token,
                    acquisition_id,
                    after_wait,
                    holder,
                } => {
                    m.grants.inc();
                    if *after_wait {
                        m.ownership_transfers.inc();
                    }
                    debug!(%resource, %token, acquisition = %acquisition_id.prefix(), after_wait, holder = holder.as_ref().map(|h| h.as_str()), "granted");
                }
                Event::Renewed { .. } => _ = m.renewals.inc(),
                Event::RenewRefused { resource } => {
                    m.renewals_failed.inc();
                    debug!(%resource, "renewal refused: not owner");
                }
                Event::Released {
                    resource,
                    token,
                    holder,
                } => {
                    m.releases.inc();
                    debug!(%resource, %token, holder = holder.as_ref().map(|h| h.as_str()), "released");
                }
                Event::Expired {
                    resource,
                    token,
                    holder,
                } => {
                    m.expiries.inc();
                    debug!(%resource, %token, holder = holder.as_ref().map(|h| h.as_str()), "lease expired");
                }
                Event::Fenced {
                    resource,
                    token,
                    revoked,
                    holder,
                } => {
                    m.fences.inc();
                    fenced(resource, *token, *revoked, holder.as_ref());
                }
                Event::WaitTimedOut { .. } => _ = m.wait_timeouts.inc(),
                Event::SessionOpened { .. } => {}
                Event::SessionEnded {
                    expired, n_leases, ..
                } => {
                    if *expired {
                        m.session_expiries.inc();
                    }
                    session_ended(*expired, *n_leases);
                }
                Event::ExpiriesDeferred { n_leases } => {
                    m.expiries_deferred.inc_by(*n_leases as u64);
                    debug!(
                        n_leases,
                        "more leases expired than a step drops; the rest follow in bounded steps"
                    );
                }
            }
        }
    }
}

fn fenced(
    resource: &ResourceName,
    token: FencingToken,
    revoked: Option<FencingToken>,
    holder: Option<&Holder>,
) {
    match revoked {
        Some(revoked) => {
            info!(%resource, %token, %revoked, holder = holder.map(|h| h.as_str()), "fenced; lease revoked")
        }
        None => info!(%resource, %token, "fenced; no lease was held"),
    }
}

fn session_ended(expired: bool, n_leases: usize) {
    if expired {
        info!(
            n_leases,
            "session expired without a heartbeat; its leases expired with it"
        );
    } else {
        debug!(n_leases, "session closed; its leases released");
    }
}
