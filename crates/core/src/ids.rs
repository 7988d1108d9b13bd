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
}
