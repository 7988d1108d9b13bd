//! A lease record as the embedded store and its log write it: 32 bytes
//! (acquisition digest, token, TTL), or 48 with the digest of the session
//! the lease is tied to.

use baton_core::{AcquisitionDigest, FencingToken, LeaseRecord, ResourceName};

use crate::StoreError;

/// A lease with its own TTL.
pub(crate) const LEASE_LEN_BYTES: usize = 32;
/// A lease tied to a session: the record above, then the session's digest.
/// Readers before sessions existed never meet one unless sessions were used.
pub(crate) const BOUND_LEASE_LEN_BYTES: usize = 48;

pub(crate) fn encode(record: &LeaseRecord) -> ([u8; BOUND_LEASE_LEN_BYTES], usize) {
    let mut out = [0u8; BOUND_LEASE_LEN_BYTES];
    out[..16].copy_from_slice(record.acquisition_digest.as_bytes());
    out[16..24].copy_from_slice(&record.token.get().to_be_bytes());
    out[24..32].copy_from_slice(&record.ttl_ms.to_be_bytes());
    match record.session {
        Some(session) => {
            out[32..].copy_from_slice(session.as_bytes());
            (out, BOUND_LEASE_LEN_BYTES)
        }
        None => (out, LEASE_LEN_BYTES),
    }
}

pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<(ResourceName, LeaseRecord), StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("lease {name:?}: {what}"));
    let resource = ResourceName::parse(name).map_err(|e| corrupt(e.to_string()))?;
    if bytes.len() != LEASE_LEN_BYTES && bytes.len() != BOUND_LEASE_LEN_BYTES {
        return Err(corrupt(format!(
            "{} bytes, expected {LEASE_LEN_BYTES} or {BOUND_LEASE_LEN_BYTES}",
            bytes.len()
        )));
    }
    let digest = AcquisitionDigest::from_bytes(bytes[..16].try_into().expect("16 bytes"));
    let token = u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let token = FencingToken::from_u64(token).map_err(|e| corrupt(e.to_string()))?;
    let ttl_ms = u64::from_be_bytes(bytes[24..32].try_into().expect("8 bytes"));
    let session = (bytes.len() == BOUND_LEASE_LEN_BYTES)
        .then(|| AcquisitionDigest::from_bytes(bytes[32..].try_into().expect("16 bytes")));
    Ok((
        resource,
        LeaseRecord {
            acquisition_digest: digest,
            token,
            ttl_ms,
            session,
        },
    ))
}
