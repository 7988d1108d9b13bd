//! Immutable outputs: generation-keyed, create-only objects with a manifest
//! beside each, validated before reuse, and garbage collection that never
//! touches the published object or a young one.
//!
//! Keys look like `{prefix}/{resource_path}/generation-{token}.{ext}` with
//! the manifest at `{key}.manifest`. Publishing is a fenced update of a
//! small pointer to the key ([`crate::sqlite::SqliteFence::publish`],
//! [`crate::postgres::PgFence::publish`]); call [`ObjectKit::validate`]
//! first, so no pointer ever names an object without its manifest.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::FencingToken;

/// Longest object key below the prefix, in bytes.
pub const OBJECT_PATH_LEN_BYTES_MAX: usize = 1_024;
/// Longest manifest field value, in bytes.
pub const MANIFEST_FIELD_LEN_BYTES_MAX: usize = 512;
const MANIFEST_HEADER: &str = "baton-manifest 1";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum ObjectError {
    #[error("object path {path:?} is not allowed: {rule}")]
    InvalidPath { path: String, rule: &'static str },
    #[error("manifest field {field} is not allowed: {rule}")]
    InvalidManifestField {
        field: &'static str,
        rule: &'static str,
    },
    #[error("{key} already exists; generation-keyed objects are never overwritten")]
    AlreadyExists { key: String },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("invalid object store url {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("the object store {store} {detail}: it does not honour conditional create (If-None-Match: *), so a create-only write could silently overwrite an object; the kit refuses to run on it")]
    NotCreateOnly { store: String, detail: String },
    #[error("object {key} is {size_bytes} bytes; the kit writes each object in one create-only PUT of at most {max_bytes} bytes (S3's single-PUT limit)")]
    TooLarge {
        key: String,
        size_bytes: u64,
        max_bytes: u64,
    },
    #[error("object store credentials: {0}")]
    Credentials(String),
}

/// The largest object the kit writes: one PUT, create-only (S3's limit for
/// a single PUT). Multipart uploads are not used: their completion cannot
/// be made create-only through `object_store`.
pub const OBJECT_LEN_BYTES_MAX: u64 = 5 * 1024 * 1024 * 1024;

/// The key the create-only probe writes (once per store, never deleted:
/// a worker needs no delete permission).
pub const PROBE_KEY: &str = ".baton-probe/create-only";

/// Why a candidate may not be reused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum Rejection {
    #[error("no manifest for {key}")]
    NoManifest { key: String },
    #[error("manifest for {key} is malformed: {detail}")]
    BadManifest { key: String, detail: String },
    #[error("object {key} is missing")]
    NoObject { key: String },
    #[error("object {key} is {actual} bytes; the manifest says {expected}")]
    SizeMismatch {
        key: String,
        expected: u64,
        actual: u64,
    },
    #[error("object {key} has sha256 {actual}; the manifest says {expected}")]
    ChecksumMismatch {
        key: String,
        expected: String,
        actual: String,
    },
    #[error("object {key} was made from input snapshot {actual:?}, not {expected:?}")]
    WrongInputSnapshot {
        key: String,
        expected: String,
        actual: String,
    },
    #[error("object {key} was made by generator {actual:?}, not {expected:?}")]
    WrongGenerator {
        key: String,
        expected: String,
        actual: String,
    },
}

/// What produced an object: written beside it, checked before reuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// SHA-256 of the object, hex.
    pub sha256_hex: String,
    /// The object's size.
    pub size_bytes: u64,
    /// The input version the object was made from.
    pub input_snapshot: String,
    /// The program version that made it.
    pub generator_version: String,
    /// The operation that made it.
    pub operation: String,
    /// The fenced resource it is a candidate for.
    pub resource: String,
    /// The token of the owner that made it.
    pub token: i64,
}

/// The caller's description of a new candidate.
#[derive(Clone, Debug)]
pub struct Provenance<'a> {
    /// The input version the object is made from.
    pub input_snapshot: &'a str,
    /// The program version making it.
    pub generator_version: &'a str,
    /// The operation making it.
    pub operation: &'a str,
    /// The fenced resource it is a candidate for.
    pub resource: &'a str,
}

/// An uploaded candidate: its key and manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The object's key, to publish.
    pub key: String,
    /// What it was made from.
    pub manifest: Manifest,
}

/// What a garbage collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Objects deleted.
    pub deleted: Vec<String>,
    /// Objects kept because a pointer names them.
    pub kept_published: usize,
    /// Objects kept because they are younger than the retention.
    pub kept_young: usize,
}

/// Generation-keyed immutable objects in an object store, under a prefix.
#[derive(Clone, Debug)]
pub struct ObjectKit {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl ObjectKit {
    /// Objects in a local directory (created if missing).
    pub fn local(dir: &std::path::Path) -> Result<Self, ObjectError> {
        std::fs::create_dir_all(dir).map_err(|e| ObjectError::InvalidPath {
            path: dir.display().to_string(),
            rule: io_rule(&e),
        })?;
        Ok(Self::new(
            Arc::new(LocalFileSystem::new_with_prefix(dir)?),
            "",
        ))
    }

    /// Objects in any store, for example an S3-compatible one built with
    /// `object_store::aws::AmazonS3Builder` (feature `s3`).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self {
            store,
            prefix: Path::from(prefix),
        }
    }

    /// A store by URL: `file:///abs/dir`, `memory:///`, or with feature
    /// `s3`, `s3://bucket/prefix`, configured as the AWS SDKs are (see
    /// `objects/s3.rs`). Not checked: [`ObjectKit::open`] also probes it.
    pub fn from_url(raw: &str) -> Result<Self, ObjectError> {
        let bad = |message: String| ObjectError::Url {
            url: raw.to_string(),
            message,
        };
        let url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
        #[cfg(feature = "s3")]
        if url.scheme() == "s3" {
            let (store, prefix) = s3::open(&url)?;
            return Ok(Self { store, prefix });
        }
        let (store, prefix) = object_store::parse_url(&url).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            store: Arc::from(store),
            prefix,
        })
    }

    /// [`ObjectKit::from_url`], or a local directory, for reading only:
    /// nothing is created, probed or written. A local directory that does
    /// not exist yet holds no object (an empty store in memory stands for
    /// it).
    pub fn open_existing(location: &str) -> Result<Self, ObjectError> {
        if location.contains("://") {
            return Self::from_url(location);
        }
        let dir = std::path::Path::new(location);
        if !dir.exists() {
            return Ok(Self::new(
                Arc::new(object_store::memory::InMemory::new()),
                "",
            ));
        }
        Ok(Self::new(
            Arc::new(LocalFileSystem::new_with_prefix(dir)?),
            "",
        ))
    }

    /// [`ObjectKit::from_url`], or a local directory for a path that is not
    /// a URL, then [`ObjectKit::check_create_only`]: a store that would
    /// overwrite is refused before anything is written.
    pub async fn open(location: &str) -> Result<Self, ObjectError> {
        let kit = if location.contains("://") {
            Self::from_url(location)?
        } else {
            Self::local(std::path::Path::new(location))?
        };
        kit.check_create_only().await?;
        Ok(kit)
    }

    /// Creates [`PROBE_KEY`] (if it is not there yet) and then creates it
    /// again: the second create must be refused. A store that accepts it
    /// (it ignores `If-None-Match: *`), or cannot express it, is refused
    /// with [`ObjectError::NotCreateOnly`].
    pub async fn check_create_only(&self) -> Result<(), ObjectError> {
        let not_create_only = |detail: String| ObjectError::NotCreateOnly {
            store: self.store.to_string(),
            detail,
        };
        for attempt in 0..2 {
            match self
                .put_create(PROBE_KEY, b"create-only probe\n".to_vec())
                .await
            {
                Ok(()) if attempt == 1 => {
                    return Err(not_create_only(format!(
                        "accepted a second create of {PROBE_KEY}"
                    )))
                }
                Ok(()) | Err(ObjectError::AlreadyExists { .. }) => {}
                Err(ObjectError::Store(object_store::Error::NotImplemented { .. })) => {
                    return Err(not_create_only(
                        "cannot express a conditional create".into(),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn full(&self, relative: &str) -> Path {
        Path::from_iter(self.prefix.parts().chain(Path::from(relative).parts()))
    }

    /// The key a generation's object gets: `{resource_path}/generation-{token}.{ext}`.
    pub fn key(resource_path: &str, token: FencingToken, ext: &str) -> Result<String, ObjectError> {
        relative_path(resource_path)?;
        if ext.is_empty() || ext.len() > 16 || !ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(ObjectError::InvalidPath {
                path: ext.to_string(),
                rule: "extension must be 1 to 16 ASCII letters or digits",
            });
        }
        Ok(format!("{resource_path}/generation-{token}.{ext}"))
    }

    async fn put_create(&self, key: &str, bytes: Vec<u8>) -> Result<(), ObjectError> {
        if bytes.len() as u64 > OBJECT_LEN_BYTES_MAX {
            return Err(ObjectError::TooLarge {
                key: key.to_string(),
                size_bytes: bytes.len() as u64,
                max_bytes: OBJECT_LEN_BYTES_MAX,
            });
        }
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.full(key), PutPayload::from(bytes), options)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(ObjectError::AlreadyExists {
                key: key.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a candidate and then its manifest, both create-only. A crash
    /// between the two leaves an object without a manifest, which
    /// [`ObjectKit::validate`] refuses and [`ObjectKit::gc`] removes.
    pub async fn put_candidate(
        &self,
        resource_path: &str,
        token: FencingToken,
        ext: &str,
        bytes: Vec<u8>,
        provenance: &Provenance<'_>,
    ) -> Result<Candidate, ObjectError> {
        let key = Self::key(resource_path, token, ext)?;
        field("input_snapshot", provenance.input_snapshot)?;
        field("generator_version", provenance.generator_version)?;
        field("operation", provenance.operation)?;
        field("resource", provenance.resource)?;
        let manifest = Manifest {
            sha256_hex: sha256_hex(&bytes),
            size_bytes: bytes.len() as u64,
            input_snapshot: provenance.input_snapshot.to_string(),
            generator_version: provenance.generator_version.to_string(),
            operation: provenance.operation.to_string(),
            resource: provenance.resource.to_string(),
            token: token.bigint(),
        };
        self.put_create(&key, bytes).await?;
        self.put_create(&format!("{key}.manifest"), manifest.render().into_bytes())
            .await?;
        Ok(Candidate { key, manifest })
    }

    /// Checks a candidate against its manifest (size, SHA-256) and, if given,
    /// the input snapshot and generator version it must have been made from.
    pub async fn validate(
        &self,
        key: &str,
        input_snapshot: Option<&str>,
        generator_version: Option<&str>,
    ) -> Result<Result<Manifest, Rejection>, ObjectError> {
        relative_path(key)?;
        let text = match self.store.get(&self.full(&format!("{key}.manifest"))).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Ok(Err(Rejection::NoManifest { key: key.into() }))
            }
            Err(e) => return Err(e.into()),
        };
        let manifest = match std::str::from_utf8(&text)
            .map_err(|e| e.to_string())
            .and_then(|text| Manifest::parse(text).map_err(|e| e.to_string()))
        {
            Ok(m) => m,
            Err(detail) => {
                return Ok(Err(Rejection::BadManifest {
                    key: key.into(),
                    detail,
                }))
            }
        };
        let bytes = match self.store.get(&self.full(key)).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Ok(Err(Rejection::NoObject { key: key.into() }))
            }
            Err(e) => return Err(e.into()),
        };
        let k = || key.to_string();
        if bytes.len() as u64 != manifest.size_bytes {
            return Ok(Err(Rejection::SizeMismatch {
                key: k(),
                expected: manifest.size_bytes,
                actual: bytes.len() as u64,
            }));
        }
        let actual = sha256_hex(&bytes);
        if actual != manifest.sha256_hex {
            return Ok(Err(Rejection::ChecksumMismatch {
                key: k(),
                expected: manifest.sha256_hex,
                actual,
            }));
        }
        if let Some(expected) = input_snapshot.filter(|e| *e != manifest.input_snapshot) {
            return Ok(Err(Rejection::WrongInputSnapshot {
                key: k(),
                expected: expected.into(),
                actual: manifest.input_snapshot,
            }));
        }
        if let Some(expected) = generator_version.filter(|e| *e != manifest.generator_version) {
            return Ok(Err(Rejection::WrongGenerator {
                key: k(),
                expected: expected.into(),
                actual: manifest.generator_version,
            }));
        }
        Ok(Ok(manifest))
    }

    /// Validates the object named by `req.result` against its manifest and
    /// only then moves the pointer through [`crate::sqlite::SqliteFence::publish`]:
    /// no pointer ever names an object without a valid manifest.
    #[cfg(feature = "sqlite")]
    pub async fn publish_sqlite(
        &self,
        conn: &mut rusqlite::Connection,
        req: &crate::FenceRequest,
    ) -> Result<Result<crate::Outcome, Rejection>, crate::FenceError> {
        if let Err(invalid) = self.validate_for(req).await? {
            return Ok(Err(invalid));
        }
        crate::sqlite::SqliteFence::publish(conn, req).map(Ok)
    }

    /// [`ObjectKit::publish_sqlite`] with the caller's `effect` in the
    /// publish's transaction, run only if it applied (an outbox intent).
    #[cfg(feature = "sqlite")]
    pub async fn publish_sqlite_with(
        &self,
        conn: &mut rusqlite::Connection,
        req: &crate::FenceRequest,
        effect: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<(), crate::FenceError>,
    ) -> Result<Result<crate::Outcome, Rejection>, crate::FenceError> {
        if let Err(invalid) = self.validate_for(req).await? {
            return Ok(Err(invalid));
        }
        crate::sqlite::SqliteFence::publish_with(conn, req, effect).map(Ok)
    }

    /// [`ObjectKit::publish_sqlite`] for PostgreSQL (`baton.publish`).
    #[cfg(feature = "postgres")]
    pub async fn publish_postgres(
        &self,
        client: &impl tokio_postgres::GenericClient,
        prepared: &crate::postgres::Prepared,
        req: &crate::FenceRequest,
    ) -> Result<Result<crate::Outcome, Rejection>, crate::FenceError> {
        if let Err(invalid) = self.validate_for(req).await? {
            return Ok(Err(invalid));
        }
        crate::postgres::PgFence::publish(client, prepared, req)
            .await
            .map(Ok)
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    async fn validate_for(
        &self,
        req: &crate::FenceRequest,
    ) -> Result<Result<Manifest, Rejection>, crate::FenceError> {
        let key =
            std::str::from_utf8(&req.result).map_err(|_| crate::InputError::ControlCharacter {
                field: "object key",
                at_byte: 0,
            })?;
        self.validate(key, None, None)
            .await
            .map_err(|e| crate::FenceError::Corrupt(e.to_string()))
    }

    /// The object's bytes.
    pub async fn read(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        relative_path(key)?;
        Ok(self
            .store
            .get(&self.full(key))
            .await?
            .bytes()
            .await?
            .to_vec())
    }
}

fn io_rule(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => "permission denied",
        _ => "cannot create the directory",
    }
}

mod gc;
mod manifest;
#[cfg(feature = "s3")]
mod s3;

use manifest::{field, relative_path, sha256_hex};

#[cfg(test)]
mod tests;
