use std::fmt;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exactly 32 hex digits as 16 bytes.
pub fn parse_hex16(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The 128-bit secret that proves ownership of one acquisition.
///
/// It is drawn at random by the shell; whoever knows it may renew and release
/// that lease. Only a short prefix ever appears in logs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AcquisitionId([u8; 16]);

impl AcquisitionId {
    /// Length of an acquisition id in bytes.
    pub const LEN_BYTES: usize = 16;

    /// An id from its 16 bytes (the shell draws them at random).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Accepts exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes).ok().map(Self)
    }

    /// The 16 bytes, for the wire.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The id as 32 lowercase hex digits (what the CLI prints).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 32 hex digits; `None` for anything else.
    pub fn from_hex(hex: &str) -> Option<Self> {
        parse_hex16(hex).map(Self)
    }

    /// The first 8 hex digits: enough to correlate logs, useless to an attacker.
    pub fn prefix(&self) -> String {
        self.to_hex()[..8].to_string()
    }

    /// The one-way digest under which this acquisition is stored.
    pub fn digest(&self) -> AcquisitionDigest {
        use sha2::{Digest, Sha256};
        let full = Sha256::digest(self.0);
        let mut out = [0u8; AcquisitionDigest::LEN_BYTES];
        out.copy_from_slice(&full[..AcquisitionDigest::LEN_BYTES]);
        AcquisitionDigest(out)
    }
}

/// The first 16 bytes of SHA-256 of an [`AcquisitionId`].
///
/// This is what the table keeps, the store writes and a backup holds: it
/// proves a presented id without being one. Finding an id for a digest is a
/// 128-bit preimage search, so a stolen data directory or backup cannot renew
/// or release anyone's lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AcquisitionDigest([u8; 16]);

impl AcquisitionDigest {
    /// Length of a digest in bytes.
    pub const LEN_BYTES: usize = 16;

    /// A digest read back from storage.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes, for storage.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Whether `id` is the acquisition this digest was made from.
    pub fn matches(&self, id: &AcquisitionId) -> bool {
        id.digest() == *self
    }
}

impl fmt::Debug for AcquisitionDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AcquisitionDigest({}…)", hex(&self.0[..4]))
    }
}

impl fmt::Debug for AcquisitionId {
    // Never print the whole secret, not even in debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AcquisitionId({}…)", self.prefix())
    }
}

/// The 128-bit secret that names a session: of the same form as an
/// acquisition id, drawn at random by the server when the session opens.
/// Whoever knows it may resume the session and so keep its leases alive.
pub type SessionId = AcquisitionId;

/// The digest under which a session is kept and stored (never its id).
pub type SessionDigest = AcquisitionDigest;

/// A client's 128-bit id for one acquire request: the same on every
/// attempt of that request, so that the leader can tell a repeat from a new
/// request. Secret like an acquisition id, since the acquisition ids of the
/// leases granted to the request derive from it
/// ([`RequestId::acquisition_id`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId([u8; 16]);

impl RequestId {
    /// Length of a request id in bytes.
    pub const LEN_BYTES: usize = 16;

    /// An id from its 16 bytes (the client draws them at random).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Accepts exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes).ok().map(Self)
    }

    /// The 16 bytes, for the wire.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The acquisition id of `resource`'s lease when this request is
    /// granted: the first 16 bytes of SHA-256 over a label, the request id
    /// and the canonical name. Every attempt of one request derives the
    /// same ids, so the lease a repeat finds proves it was this request's;
    /// SHA-256 is one-way, so neither the id nor its stored digest reveals
    /// the request id.
    pub fn acquisition_id(&self, resource: &crate::ResourceName) -> AcquisitionId {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(b"baton.v1 acquisition of request\0");
        hasher.update(self.0);
        hasher.update(resource.as_str().as_bytes());
        let full = hasher.finalize();
        let mut out = [0u8; AcquisitionId::LEN_BYTES];
        out.copy_from_slice(&full[..AcquisitionId::LEN_BYTES]);
        AcquisitionId(out)
    }
}

impl fmt::Debug for RequestId {
    // A secret: only a prefix, as for acquisition ids.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({}…)", &hex(&self.0)[..8])
    }
}

/// Identifies one waiting acquire request inside the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_prefix() {
        let id = AcquisitionId::from_bytes([0xab; 16]);
        assert_eq!(AcquisitionId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(id.prefix(), "abababab");
        assert!(!format!("{id:?}").contains(&id.to_hex()));
        assert_eq!(AcquisitionId::from_hex("zz"), None);
        assert_eq!(AcquisitionId::from_hex(&"é".repeat(16)), None);
    }

    #[test]
    fn a_digest_matches_its_id_only_and_is_not_the_id() {
        let id = AcquisitionId::from_bytes([0xab; 16]);
        let other = AcquisitionId::from_bytes([0xac; 16]);
        let digest = id.digest();
        assert!(digest.matches(&id));
        assert!(!digest.matches(&other));
        assert_ne!(digest.as_bytes(), id.as_bytes());
        // SHA-256 of 16 bytes of 0xab, first 16 bytes (checked with `sha256sum`).
        assert_eq!(id.digest(), AcquisitionId::from_bytes([0xab; 16]).digest());
    }

    #[test]
    fn a_request_derives_one_id_per_name_and_other_requests_others() {
        let a = crate::ResourceName::parse("a").unwrap();
        let b = crate::ResourceName::parse("b").unwrap();
        let request = RequestId::from_bytes([7; 16]);
        let again = RequestId::from_slice(&[7; 16]).unwrap();
        assert_eq!(request.acquisition_id(&a), again.acquisition_id(&a));
        assert_ne!(request.acquisition_id(&a), request.acquisition_id(&b));
        let other = RequestId::from_bytes([8; 16]);
        assert_ne!(request.acquisition_id(&a), other.acquisition_id(&a));
        assert_ne!(request.acquisition_id(&a).as_bytes(), request.as_bytes());
        assert_eq!(RequestId::from_slice(&[7; 15]), None);
        assert!(!format!("{request:?}").contains(&hex(&[7; 16])));
    }
}
