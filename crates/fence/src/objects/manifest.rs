//! Manifests: what produced an object, written beside it and checked before
//! reuse; and the rules for paths and manifest fields.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::{
    Manifest, ObjectError, MANIFEST_FIELD_LEN_BYTES_MAX, MANIFEST_HEADER, OBJECT_PATH_LEN_BYTES_MAX,
};

pub(super) fn field(name: &'static str, value: &str) -> Result<(), ObjectError> {
    if value.is_empty() {
        return Err(ObjectError::InvalidManifestField {
            field: name,
            rule: "must not be empty",
        });
    }
    if value.len() > MANIFEST_FIELD_LEN_BYTES_MAX {
        return Err(ObjectError::InvalidManifestField {
            field: name,
            rule: "longer than 512 bytes",
        });
    }
    if value.chars().any(char::is_control) {
        return Err(ObjectError::InvalidManifestField {
            field: name,
            rule: "contains a control character",
        });
    }
    Ok(())
}

/// Checks a caller-supplied relative path such as `statements/account-42/2026-09-13`.
pub(super) fn relative_path(raw: &str) -> Result<(), ObjectError> {
    let bad = |rule| {
        Err(ObjectError::InvalidPath {
            path: raw.to_string(),
            rule,
        })
    };
    if raw.is_empty() || raw.len() > OBJECT_PATH_LEN_BYTES_MAX {
        return bad("must be 1 to 1024 bytes");
    }
    if raw.starts_with('/') {
        return bad("must be relative to the prefix");
    }
    for segment in raw.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return bad(
                "segments must be non-empty and not '.' or '..' (it would escape its prefix)",
            );
        }
        if segment.chars().any(|c| c.is_control() || c == '\\') {
            return bad("segments must not contain control characters or backslashes");
        }
    }
    Ok(())
}

impl Manifest {
    pub(super) fn render(&self) -> String {
        let mut out = String::from(MANIFEST_HEADER);
        out.push('\n');
        let _ = write!(
            out,
            "sha256: {}\nsize_bytes: {}\ninput_snapshot: {}\ngenerator_version: {}\noperation: {}\nresource: {}\ntoken: {}\n",
            self.sha256_hex, self.size_bytes, self.input_snapshot, self.generator_version, self.operation, self.resource, self.token
        );
        out
    }

    pub(super) fn parse(text: &str) -> Result<Self, ManifestError> {
        let mut lines = text.lines();
        if lines.next() != Some(MANIFEST_HEADER) {
            return Err(ManifestError::NoHeader);
        }
        let mut get = |name: &'static str| -> Result<String, ManifestError> {
            let line = lines.next().ok_or(ManifestError::Missing(name))?;
            line.strip_prefix(&format!("{name}: "))
                .map(str::to_string)
                .ok_or_else(|| ManifestError::Unexpected {
                    name,
                    line: line.to_string(),
                })
        };
        fn number<T: std::str::FromStr<Err = std::num::ParseIntError>>(
            name: &'static str,
            value: String,
        ) -> Result<T, ManifestError> {
            value
                .parse()
                .map_err(|reason| ManifestError::Number { name, reason })
        }
        Ok(Manifest {
            sha256_hex: get("sha256")?,
            size_bytes: number("size_bytes", get("size_bytes")?)?,
            input_snapshot: get("input_snapshot")?,
            generator_version: get("generator_version")?,
            operation: get("operation")?,
            resource: get("resource")?,
            token: number("token", get("token")?)?,
        })
    }
}

/// Why a manifest did not read.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum ManifestError {
    #[error("missing header")]
    NoHeader,
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("expected {name}, found {line:?}")]
    Unexpected { name: &'static str, line: String },
    #[error("{name}: {reason}")]
    Number {
        name: &'static str,
        reason: std::num::ParseIntError,
    },
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
