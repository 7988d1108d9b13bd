//! The data directory's identity, kept outside the store file.
//!
//! A store file that is missing, empty or replaced must never look like a
//! first start: a first start issues tokens from epoch 1 again. So the data
//! directory holds a second, small file, written and fsynced when the
//! directory is initialized and whenever the epoch changes, that names the
//! store it belongs to and the lowest position its tokens may continue from.
//! It is a guard, not a source of truth: the store file still holds every
//! lease and the exact token position.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use baton_core::{Epoch, FencingToken};
use serde::{Deserialize, Serialize};

use crate::StoreError;

const FILE_NAME: &str = "baton.identity";
const FORMAT: u32 = 1;

/// A store's identity: 16 random bytes drawn when the store was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreId(pub [u8; 16]);

impl StoreId {
    pub(crate) fn random() -> Result<Self, StoreError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| StoreError::Storage(format!("cannot draw a store id: {e}")))?;
        Ok(Self(bytes))
    }

    pub(crate) fn halves(&self) -> (u64, u64) {
        let hi = u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"));
        let lo = u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"));
        (hi, lo)
    }

    pub(crate) fn from_halves(hi: u64, lo: u64) -> Self {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&hi.to_be_bytes());
        bytes[8..].copy_from_slice(&lo.to_be_bytes());
        Self(bytes)
    }

    /// The id as 32 hex digits, as the identity file writes it.
    pub fn to_hex(&self) -> String {
        baton_core::hex(&self.0)
    }

    fn from_hex(hex: &str) -> Option<Self> {
        baton_core::parse_hex16(hex).map(Self)
    }
}

impl std::fmt::Display for StoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// What the identity file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The store this directory belongs to.
    pub store_id: StoreId,
    /// No token of this directory's store is below `FencingToken(floor_epoch, floor_counter)`.
    pub floor_epoch: Epoch,
    /// See `floor_epoch`.
    pub floor_counter: u64,
}

#[derive(Serialize, Deserialize)]
struct IdentityFile {
    comment: String,
    format: u32,
    store_id: String,
    floor_epoch: u32,
    floor_counter: u64,
}

impl Identity {
    /// Where the identity file of `data_dir` lives.
    pub fn path_in(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE_NAME)
    }

    /// The token position below which this directory never issues again.
    pub fn floor(&self) -> (Epoch, u64) {
        (self.floor_epoch, self.floor_counter)
    }

    /// Reads the identity file; `Ok(None)` if there is none.
    pub fn read(data_dir: &Path) -> Result<Option<Self>, StoreError> {
        let path = Self::path_in(data_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StoreError::Io {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let unreadable = |why: String| StoreError::IdentityUnreadable {
            path: path.display().to_string(),
            why,
        };
        let file: IdentityFile =
            serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
        if file.format != FORMAT {
            return Err(unreadable(format!(
                "format {} is not supported; this build reads format {FORMAT}",
                file.format
            )));
        }
        let store_id = StoreId::from_hex(&file.store_id)
            .ok_or_else(|| unreadable("store_id must be 32 hex digits".into()))?;
        let floor_epoch = Epoch::new(file.floor_epoch).map_err(|e| unreadable(e.to_string()))?;
        FencingToken::new(floor_epoch, file.floor_counter)
            .map_err(|e| unreadable(e.to_string()))?;
        Ok(Some(Self {
            store_id,
            floor_epoch,
            floor_counter: file.floor_counter,
        }))
    }

    /// Writes the identity file durably: a temporary file, fsync, rename,
    /// fsync of the directory.
    pub fn write(&self, data_dir: &Path) -> Result<(), StoreError> {
        let path = Self::path_in(data_dir);
        let tmp = data_dir.join(format!("{FILE_NAME}.tmp"));
        let file = IdentityFile {
            comment: "Baton data directory identity: do not edit, copy or delete. \
                      It stops a lost or replaced store file from restarting the token sequence."
                .into(),
            format: FORMAT,
            store_id: self.store_id.to_hex(),
            floor_epoch: self.floor_epoch.get(),
            floor_counter: self.floor_counter,
        };
        let text = serde_json::to_string_pretty(&file).expect("plain struct serializes");
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |source| StoreError::Io { path: p, source }
        };
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(text.as_bytes()).map_err(io(&tmp))?;
        f.write_all(b"\n").map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(io(data_dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_and_rejects_garbage() {
        let dir = std::env::temp_dir().join(format!("baton-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(Identity::read(&dir).unwrap(), None);
        let identity = Identity {
            store_id: StoreId([7; 16]),
            floor_epoch: Epoch::new(3).unwrap(),
            floor_counter: 42,
        };
        identity.write(&dir).unwrap();
        assert_eq!(Identity::read(&dir).unwrap(), Some(identity));
        std::fs::write(Identity::path_in(&dir), "{}").unwrap();
        let err = Identity::read(&dir).unwrap_err().to_string();
        assert!(err.contains("baton.identity"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
