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
/// A numbered holder change (format 6; see [`encode_change`]).
const CHANGED: u8 = 9;

/// A holder change's kind as one byte.
fn kind_byte(kind: HolderChange) -> u8 {
    match kind {
        HolderChange::Granted => 1,
        HolderChange::HandedOff => 2,
        HolderChange::Released => 3,
        HolderChange::Expired => 4,
        HolderChange::Fenced => 5,
    }
}

/// A numbered change: its number, kind, resource (u16 length), slot (a
/// flag byte, then a u32), token, revoked token (0: none) and holder
/// (u16 length, 0: none).
pub(crate) fn encode_change(out: &mut Vec<u8>, c: &NumberedChange) {
    out.extend_from_slice(&c.seq.to_le_bytes());
    out.push(kind_byte(c.change.kind));
    let resource = c.change.resource.as_bytes();
    out.extend_from_slice(&(resource.len() as u16).to_le_bytes());
    out.extend_from_slice(resource);
    match c.change.slot {
        Some(slot) => {
            out.push(1);
            out.extend_from_slice(&slot.to_le_bytes());
        }
        None => out.push(0),
    }
    out.extend_from_slice(&c.change.token.get().to_le_bytes());
    out.extend_from_slice(&c.change.revoked.map_or(0, |t| t.get()).to_le_bytes());
    let holder = c
        .change
        .holder
        .as_ref()
        .map_or("", |h| h.as_str())
        .as_bytes();
    out.extend_from_slice(&(holder.len() as u16).to_le_bytes());
    out.extend_from_slice(holder);
}

/// Reads changes encoded by [`encode_change`], end to end (the store's
/// history keeps them so, one value per fold).
pub(crate) fn decode_changes(bytes: &[u8]) -> Result<Vec<NumberedChange>, Undecodable> {
    let mut c = Cursor(bytes);
    let mut out = Vec::new();
    while !c.0.is_empty() {
        out.push(c.change()?);
    }
    Ok(out)
}

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
            Write::Changed(change) => {
                out.push(CHANGED);
                encode_change(&mut out, change);
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

    fn text(&mut self, what: &str) -> Result<&'a str, Undecodable> {
        let len = self.u16(what)? as usize;
        std::str::from_utf8(self.take(len, what)?)
            .map_err(|_| Undecodable(format!("{what} is not UTF-8")))
    }

    fn change(&mut self) -> Result<NumberedChange, Undecodable> {
        let seq = self.u64("a change's number")?;
        let kind = match self.take(1, "a change's kind")?[0] {
            1 => HolderChange::Granted,
            2 => HolderChange::HandedOff,
            3 => HolderChange::Released,
            4 => HolderChange::Expired,
            5 => HolderChange::Fenced,
            other => return Err(Undecodable(format!("unknown change kind {other}"))),
        };
        let resource = self.text("a change's resource")?.to_string();
        let slot = match self.take(1, "a slot flag")?[0] {
            0 => None,
            _ => Some(u32::from_le_bytes(
                self.take(4, "a slot")?.try_into().expect("4"),
            )),
        };
        let token = FencingToken::of(self.u64("a change's token")?)?;
        let revoked = match self.u64("a revoked token")? {
            0 => None,
            t => Some(FencingToken::of(t)?),
        };
        let holder = match self.text("a change's holder")? {
            "" => None,
            h => Some(Holder::parse_existing(h)?),
        };
        Ok(NumberedChange {
            seq,
            change: Change {
                kind,
                resource,
                slot,
                token,
                revoked,
                holder,
            },
        })
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
            CHANGED => Write::Changed(c.change()?),
            other => return Err(Undecodable(format!("unknown write tag {other}"))),
        });
    }
    Ok(())
}
