//! The table's bounds ([`Limits`]) and the check of a request against
//! them, before anything else is judged.

use std::collections::BTreeSet;

use super::{AcquireError, AcquireRequest, LeaseTable, LeaseTerm};

/// The longest TTL a lease or session can have (2^32-1 ms, about 49.7
/// days): a lease keeps its TTL in 32 bits. [`Limits::ttl_ms_max`] must
/// not be above it.
pub const TTL_MS_MAX: u64 = u32::MAX as u64;

/// Bounds on everything a request can ask for or make the table hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Shortest TTL accepted.
    pub ttl_ms_min: u64,
    /// Longest TTL accepted (at most [`TTL_MS_MAX`]).
    pub ttl_ms_max: u64,
    /// Longest wait accepted.
    pub wait_ms_max: u64,
    /// Most resources in one acquire.
    pub n_resources_per_request_max: usize,
    /// Most waiters queued on one resource.
    pub n_waiters_per_resource_max: usize,
    /// Most waiters in all.
    pub n_waiters_max: usize,
    /// Most open sessions.
    pub n_sessions_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ttl_ms_min: 1_000,
            ttl_ms_max: 600_000,
            wait_ms_max: 600_000,
            n_resources_per_request_max: 64,
            n_waiters_per_resource_max: 1_024,
            n_waiters_max: 100_000,
            n_sessions_max: 100_000,
        }
    }
}

impl LeaseTable {
    pub(super) fn validate(&self, request: &AcquireRequest) -> Result<(), AcquireError> {
        let l = &self.limits;
        if let LeaseTerm::Own { ttl_ms } = request.term {
            if ttl_ms < l.ttl_ms_min || ttl_ms > l.ttl_ms_max {
                return Err(AcquireError::TtlOutOfRange {
                    ttl_ms,
                    ttl_ms_min: l.ttl_ms_min,
                    ttl_ms_max: l.ttl_ms_max,
                });
            }
        }
        if request.wait_ms > l.wait_ms_max {
            return Err(AcquireError::WaitTooLong {
                wait_ms: request.wait_ms,
                wait_ms_max: l.wait_ms_max,
            });
        }
        let n_resources = request.claims.len();
        if n_resources == 0 {
            return Err(AcquireError::NoResources);
        }
        if n_resources > l.n_resources_per_request_max {
            return Err(AcquireError::TooManyResources {
                n_resources,
                n_resources_max: l.n_resources_per_request_max,
            });
        }
        let mut seen = BTreeSet::new();
        for claim in &request.claims {
            let resource = &claim.resource;
            if !seen.insert(resource) {
                return Err(AcquireError::DuplicateResource {
                    resource: resource.clone(),
                });
            }
        }
        Ok(())
    }
}
