//! A lease record as the embedded store and its log write it.
//!
//! Format 3 (this build): acquisition digest (16 bytes), token (8), TTL
//! (8), a flags byte, then the digest of the session the lease is tied to
//! (16, if flag [`HAS_SESSION`]), the shape of a shared holder or a permit
//! (a byte, 1 shared or 2 permit, and for a permit the semaphore's N as 4
//! bytes; if flag [`HAS_SHAPE`], which records written before shapes lack:
//! they are exclusive) and the holder description (the rest, if flag
//! [`HAS_HOLDER`]). Format 2 wrote 32 bytes, or 48 with the session:
//! [`decode_v2`] still reads it, for the upgrade and for old log records.

use baton_core::{AcquisitionDigest, FencingToken, Holder, LeaseRecord, ResourceName, Shape};

use crate::StoreError;

/// Format 2: a lease with its own TTL.
pub(crate) const LEASE_LEN_BYTES: usize = 32;
/// Format 2: a lease tied to a session.
const BOUND_LEASE_LEN_BYTES: usize = 48;

const HAS_SESSION: u8 = 1;
const HAS_HOLDER: u8 = 2;
const HAS_SHAPE: u8 = 4;
const SHARED: u8 = 1;
const PERMIT: u8 = 2;
/// The fixed part of a format-3 record: the format-2 fields and the flags.
const FIXED_LEN_BYTES: usize = LEASE_LEN_BYTES + 1;

/// The format-3 encoding of `record`.
pub(crate) fn encode(record: &LeaseRecord) -> Vec<u8> {
    let holder = record.holder.as_ref().map(Holder::as_str);
    let mut out = Vec::with_capacity(FIXED_LEN_BYTES + 16 + holder.map_or(0, str::len));
    out.extend_from_slice(record.acquisition_digest.as_bytes());
    out.extend_from_slice(&record.token.get().to_be_bytes());
    out.extend_from_slice(&record.ttl_ms.to_be_bytes());
    let flags = (if record.session.is_some() {
        HAS_SESSION
    } else {
        0
    }) | (if holder.is_some() { HAS_HOLDER } else { 0 })
        | (if record.shape == Shape::Exclusive {
            0
        } else {
            HAS_SHAPE
        });
    out.push(flags);
    if let Some(session) = record.session {
        out.extend_from_slice(session.as_bytes());
    }
    match record.shape {
        Shape::Exclusive => {}
        Shape::Shared => out.push(SHARED),
        Shape::Permits(n) => {
            out.push(PERMIT);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    if let Some(holder) = holder {
        out.extend_from_slice(holder.as_bytes());
    }
    out
}

fn fixed(
    name: &str,
    bytes: &[u8],
) -> Result<(ResourceName, AcquisitionDigest, FencingToken, u64), StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("lease {name:?}: {what}"));
    let resource = ResourceName::parse_stored(name).map_err(|e| corrupt(e.to_string()))?;
    let digest = AcquisitionDigest::from_bytes(bytes[..16].try_into().expect("16 bytes"));
    let token = u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let token = FencingToken::from_u64(token).map_err(|e| corrupt(e.to_string()))?;
    let ttl_ms = u64::from_be_bytes(bytes[24..32].try_into().expect("8 bytes"));
    Ok((resource, digest, token, ttl_ms))
}

/// Reads a format-3 record.
pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<(ResourceName, LeaseRecord), StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("lease {name:?}: {what}"));
    if bytes.len() < FIXED_LEN_BYTES {
        return Err(corrupt(format!(
            "{} bytes, expected at least {FIXED_LEN_BYTES}",
            bytes.len()
        )));
    }
    let (resource, acquisition_digest, token, ttl_ms) = fixed(name, bytes)?;
    let flags = bytes[LEASE_LEN_BYTES];
    if flags & !(HAS_SESSION | HAS_HOLDER | HAS_SHAPE) != 0 {
        return Err(corrupt(format!("unknown flags {flags:#04x}")));
    }
    let mut rest = &bytes[FIXED_LEN_BYTES..];
    let session = if flags & HAS_SESSION != 0 {
        if rest.len() < 16 {
            return Err(corrupt("the session digest is cut short".into()));
        }
        let (digest, tail) = rest.split_at(16);
        rest = tail;
        Some(AcquisitionDigest::from_bytes(
            digest.try_into().expect("16 bytes"),
        ))
    } else {
        None
    };
    let shape = if flags & HAS_SHAPE != 0 {
        let (shape, tail) =
            read_shape(rest).ok_or_else(|| corrupt("the shape is cut short or unknown".into()))?;
        rest = tail;
        shape
    } else {
        Shape::Exclusive
    };
    if (shape == Shape::Exclusive) != resource.split_slot().is_none() {
        let under = match resource.split_slot() {
            Some(_) => "a holder's name",
            None => "a resource's own name",
        };
        return Err(corrupt(format!("{} kept under {under}", shape.describe())));
    }
    let holder = if flags & HAS_HOLDER != 0 {
        let text = std::str::from_utf8(rest)
            .map_err(|_| corrupt("the holder description is not UTF-8".into()))?;
        Some(Holder::parse_existing(text).map_err(|e| corrupt(e.to_string()))?)
    } else if !rest.is_empty() {
        return Err(corrupt(format!("{} bytes after the record", rest.len())));
    } else {
        None
    };
    Ok((
        resource,
        LeaseRecord {
            acquisition_digest,
            token,
            ttl_ms,
            session,
            holder,
            shape,
        },
    ))
}

/// A shared holder's or a permit's shape at the start of `bytes`, and
/// what follows it.
fn read_shape(bytes: &[u8]) -> Option<(Shape, &[u8])> {
    match bytes {
        [SHARED, tail @ ..] => Some((Shape::Shared, tail)),
        [PERMIT, a, b, c, d, tail @ ..] => {
            Some((Shape::Permits(u32::from_be_bytes([*a, *b, *c, *d])), tail))
        }
        _ => None,
    }
}

/// Reads a format-2 record (no holder).
pub(crate) fn decode_v2(
    name: &str,
    bytes: &[u8],
) -> Result<(ResourceName, LeaseRecord), StoreError> {
    if bytes.len() != LEASE_LEN_BYTES && bytes.len() != BOUND_LEASE_LEN_BYTES {
        return Err(StoreError::Corrupt(format!(
            "lease {name:?}: {} bytes, expected {LEASE_LEN_BYTES} or {BOUND_LEASE_LEN_BYTES}",
            bytes.len()
        )));
    }
    let (resource, acquisition_digest, token, ttl_ms) = fixed(name, bytes)?;
    let session = (bytes.len() == BOUND_LEASE_LEN_BYTES)
        .then(|| AcquisitionDigest::from_bytes(bytes[32..].try_into().expect("16 bytes")));
    Ok((
        resource,
        LeaseRecord {
            acquisition_digest,
            token,
            ttl_ms,
            session,
            holder: None,
            shape: Shape::Exclusive,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::Epoch;

    #[test]
    fn every_shape_of_record_reads_back() {
        let token = FencingToken::new(Epoch::FIRST, 9).unwrap();
        let r = ResourceName::parse("r").unwrap();
        let shapes = [
            (r.clone(), Shape::Exclusive),
            (r.slot(0), Shape::Shared),
            (r.slot(7), Shape::Permits(8)),
        ];
        for session in [None, Some(AcquisitionDigest::from_bytes([3; 16]))] {
            for holder in [None, Some(Holder::parse("ö@host pid 7").unwrap())] {
                for (name, shape) in &shapes {
                    let record = LeaseRecord {
                        acquisition_digest: AcquisitionDigest::from_bytes([1; 16]),
                        token,
                        ttl_ms: 30_000,
                        session,
                        holder: holder.clone(),
                        shape: *shape,
                    };
                    let (back_name, back) = decode(name.as_str(), &encode(&record)).unwrap();
                    assert_eq!((&back_name, &back), (name, &record));
                }
            }
        }
        // A shape must match the name it is kept under.
        let record = LeaseRecord {
            acquisition_digest: AcquisitionDigest::from_bytes([1; 16]),
            token,
            ttl_ms: 30_000,
            session: None,
            holder: None,
            shape: Shape::Shared,
        };
        assert!(matches!(
            decode("r", &encode(&record)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_damaged_record_is_corruption_not_a_panic() {
        let record = LeaseRecord {
            acquisition_digest: AcquisitionDigest::from_bytes([1; 16]),
            token: FencingToken::new(Epoch::FIRST, 9).unwrap(),
            ttl_ms: 30_000,
            session: Some(AcquisitionDigest::from_bytes([3; 16])),
            holder: Some(Holder::parse("job").unwrap()),
            shape: Shape::Exclusive,
        };
        let bytes = encode(&record);
        for len in 0..bytes.len() {
            let _ = decode("r", &bytes[..len]);
        }
        let mut flags = bytes.clone();
        flags[LEASE_LEN_BYTES] = 0x80;
        assert!(matches!(decode("r", &flags), Err(StoreError::Corrupt(_))));
        let mut control = bytes;
        *control.last_mut().unwrap() = b'\n';
        assert!(matches!(decode("r", &control), Err(StoreError::Corrupt(_))));
    }
}
