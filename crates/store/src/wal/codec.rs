//! A log record's payload: the writes of one commit, tagged, with a
//! decoder that names what a record that passed its checksum lacks
//! (corruption, not a torn tail).

use super::*;

/// Format-2 lease records (no holder): still read, no longer written.
const PUT_LEASE_V2: u8 = 1;
const DELETE_LEASE: u8 = 2;
const TOKENS: u8 = 3;
/// Sessions without an opener: still read, no longer written.
const PUT_SESSION_V2: u8 = 4;
const DELETE_SESSION: u8 = 5;
/// A format-3 lease record, its length as a u16.
const PUT_LEASE: u8 = 6;
/// A session with its opener (a u16 length, 0 for none, then UTF-8).
const PUT_SESSION: u8 = 7;
/// An ended lease's acquisition digest (format 5).
const LEASE_ENDED: u8 = 8;

fn put_name(out: &mut Vec<u8>, resource: &ResourceName) {
    let name = resource.as_str().as_bytes();
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name);
}

/// One commit's writes as a record payload.
pub(crate) fn encode(writes: &[Write]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * writes.len());
    for w in writes {
        match w {
            Write::PutLease { resource, record } => {
                out.push(PUT_LEASE);
                put_name(&mut out, resource);
                let bytes = crate::record::encode(record);
                out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                out.extend_from_slice(&bytes);
            }
            Write::DeleteLease { resource } => {
                out.push(DELETE_LEASE);
                put_name(&mut out, resource);
            }
            Write::Tokens { epoch, counter } => {
                out.push(TOKENS);
                out.extend_from_slice(&epoch.get().to_le_bytes());
                out.extend_from_slice(&counter.to_le_bytes());
            }
            Write::PutSession { record } => {
                out.push(PUT_SESSION);
                out.extend_from_slice(record.digest.as_bytes());
                out.extend_from_slice(&record.ttl_ms.to_le_bytes());
                let opener = record.opener.as_deref().unwrap_or("").as_bytes();
                out.extend_from_slice(&(opener.len() as u16).to_le_bytes());
                out.extend_from_slice(opener);
            }
            Write::DeleteSession { digest } => {
                out.push(DELETE_SESSION);
                out.extend_from_slice(digest.as_bytes());
            }
            Write::LeaseEnded { digest } => {
                out.push(LEASE_ENDED);
                out.extend_from_slice(digest.as_bytes());
            }
        }
    }
    out
}

/// Why a record that passed its checksum did not decode: corruption, not
/// a torn tail.
#[derive(Debug)]
pub struct Undecodable(String);

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for Undecodable {
    fn from(e: E) -> Self {
        Self(e.to_string())
    }
}

/// A cursor over a payload; every read names what was cut short.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Undecodable> {
        if self.0.len() < n {
            return Err(Undecodable(format!("a record ends inside {what}")));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn name(&mut self) -> Result<ResourceName, Undecodable> {
        let len = u16::from_le_bytes(self.take(2, "a name length")?.try_into().expect("2"));
        let raw = std::str::from_utf8(self.take(len as usize, "a name")?)
            .map_err(|_| Undecodable("a name is not UTF-8".into()))?;
        ResourceName::parse_stored(raw).map_err(|e| Undecodable(format!("name {raw:?}: {e}")))
    }

    fn digest(&mut self) -> Result<AcquisitionDigest, Undecodable> {
        Ok(AcquisitionDigest::from_bytes(
            self.take(16, "a digest")?.try_into().expect("16"),
        ))
    }

    fn u16(&mut self, what: &str) -> Result<u16, Undecodable> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64, Undecodable> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }
}

/// Appends the writes of one record's payload to `out`. A record that
/// passed its checksum but does not decode is corruption, not a torn tail.
pub(super) fn decode(payload: &[u8], out: &mut Vec<Write>) -> Result<(), Undecodable> {
    let mut c = Cursor(payload);
    while !c.0.is_empty() {
        let tag = c.take(1, "a write tag")?[0];
        out.push(match tag {
            PUT_LEASE_V2 => {
                let resource = c.name()?;
                let len = c.take(1, "a lease length")?[0] as usize;
                let bytes = c.take(len, "a lease")?;
                let (_, record) = crate::record::decode_v2(resource.as_str(), bytes)
                    .map_err(Undecodable::from)?;
                Write::PutLease { resource, record }
            }
            PUT_LEASE => {
                let resource = c.name()?;
                let len = c.u16("a lease length")? as usize;
                let bytes = c.take(len, "a lease")?;
                let (_, record) =
                    crate::record::decode(resource.as_str(), bytes).map_err(Undecodable::from)?;
                Write::PutLease { resource, record }
            }
            DELETE_LEASE => Write::DeleteLease {
                resource: c.name()?,
            },
            TOKENS => {
                let epoch = u32::from_le_bytes(c.take(4, "an epoch")?.try_into().expect("4"));
                let epoch = Epoch::new(epoch).map_err(Undecodable::from)?;
                let counter = c.u64("a counter")?;
                FencingToken::new(epoch, counter.max(1)).map_err(Undecodable::from)?;
                Write::Tokens { epoch, counter }
            }
            PUT_SESSION_V2 => Write::PutSession {
                record: SessionRecord {
                    digest: c.digest()?,
                    ttl_ms: c.u64("a session TTL")?,
                    opener: None,
                },
            },
            PUT_SESSION => {
                let digest = c.digest()?;
                let ttl_ms = c.u64("a session TTL")?;
                let len = c.u16("an opener length")? as usize;
                let opener = std::str::from_utf8(c.take(len, "an opener")?)
                    .map_err(|_| Undecodable("a session opener is not UTF-8".into()))?;
                Write::PutSession {
                    record: SessionRecord {
                        digest,
                        ttl_ms,
                        opener: (!opener.is_empty()).then(|| opener.to_string()),
                    },
                }
            }
            DELETE_SESSION => Write::DeleteSession {
                digest: c.digest()?,
            },
            LEASE_ENDED => Write::LeaseEnded {
                digest: c.digest()?,
            },
            other => return Err(Undecodable(format!("unknown write tag {other}"))),
        });
    }
    Ok(())
}
