//! Who may do what: principals from the auth file, each with rules from a
//! name prefix to permissions, and the checks every call goes through.
//!
//! The table is pure data, parsed from TOML and consulted per request; the
//! server holds the current one behind [`Auth`] and swaps it on SIGHUP, so
//! a change applies to each principal's next call (held leases are not
//! touched). Tokens are never kept: the file holds their SHA-256 digests,
//! and a presented token is hashed and compared with every digest in
//! constant time.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use unicode_normalization::UnicodeNormalization;

/// What a rule can grant on the names under its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// Status and list.
    Read,
    /// Acquire, renew, release (renew and release also need the acquisition id).
    Lease,
    /// Operator fence: revoke a running holder.
    Fence,
    /// Backup and cluster status (on the empty prefix: everything).
    Admin,
}

impl Permission {
    const ALL: [(&'static str, Permission); 4] = [
        ("read", Permission::Read),
        ("lease", Permission::Lease),
        ("fence", Permission::Fence),
        ("admin", Permission::Admin),
    ];

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, p)| *p)
    }

    /// The word used in the auth file and in messages.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One authenticated identity and its rules.
#[derive(Debug)]
pub struct Principal {
    pub name: String,
    token_sha256: Option<[u8; 32]>,
    /// Name prefix (NFC) to the permissions it grants.
    rules: Vec<(String, Vec<Permission>)>,
}

impl Principal {
    /// Whether some rule whose prefix starts `name` grants `permission`.
    pub fn allows(&self, permission: Permission, name: &str) -> bool {
        self.rules
            .iter()
            .any(|(prefix, perms)| name.starts_with(prefix.as_str()) && perms.contains(&permission))
    }

    /// The prefixes under which `permission` is granted, none under
    /// another, in name order.
    pub fn prefixes(&self, permission: Permission) -> Vec<String> {
        let mut all: Vec<&str> = self
            .rules
            .iter()
            .filter(|(_, perms)| perms.contains(&permission))
            .map(|(prefix, _)| prefix.as_str())
            .collect();
        all.sort_unstable();
        let mut out: Vec<String> = Vec::new();
        for p in all {
            if !out.last().is_some_and(|q| p.starts_with(q.as_str())) {
                out.push(p.to_string());
            }
        }
        out
    }

    /// Whether `permission` is granted on every name (a rule on the empty prefix).
    pub fn allows_everything(&self, permission: Permission) -> bool {
        self.allows(permission, "")
    }
}

/// How a caller proved (or failed to prove) who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// The SHA-256 of a bearer token (the token itself is not kept).
    Token([u8; 32]),
    /// The subject common name of a verified client certificate.
    Certificate(String),
    /// Neither.
    None,
}

impl Credential {
    /// From the `authorization` header's value (if any) and the
    /// connection's verified client certificate name (if any). A bearer
    /// token wins over the certificate.
    pub fn from_parts(authorization: Option<&[u8]>, certificate_cn: Option<&str>) -> Self {
        if let Some(value) = authorization {
            let token = value
                .strip_prefix(b"Bearer ")
                .or_else(|| value.strip_prefix(b"bearer "))
                .unwrap_or(value);
            return Credential::Token(Sha256::digest(token.trim_ascii()).into());
        }
        match certificate_cn {
            Some(cn) => Credential::Certificate(cn.to_string()),
            None => Credential::None,
        }
    }
}

/// Why a caller was not let in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credential, or one no principal has (`UNAUTHENTICATED`).
    Unauthenticated(String),
    /// Known, but no rule grants the permission (`PERMISSION_DENIED`).
    Denied(String),
}

/// The principals of one version of the auth file.
#[derive(Debug, Default)]
pub struct AuthTable {
    principals: Vec<Arc<Principal>>,
}

impl AuthTable {
    /// The principal `credential` proves, in constant time over every
    /// token digest (so timing tells nothing of how close a guess was).
    pub fn authenticate(&self, credential: &Credential) -> Result<Arc<Principal>, Refusal> {
        match credential {
            Credential::None => Err(Refusal::Unauthenticated(
                "authentication required: send `authorization: Bearer TOKEN` (--token-file) or a client certificate"
                    .into(),
            )),
            Credential::Token(digest) => {
                let mut found = None;
                for p in &self.principals {
                    if let Some(known) = &p.token_sha256 {
                        if bool::from(known.ct_eq(digest)) {
                            found = Some(p.clone());
                        }
                    }
                }
                found.ok_or_else(|| {
                    Refusal::Unauthenticated(
                        "the bearer token matches no principal in the server's auth file".into(),
                    )
                })
            }
            Credential::Certificate(cn) => self
                .principals
                .iter()
                .find(|p| p.name == *cn)
                .cloned()
                .ok_or_else(|| {
                    Refusal::Unauthenticated(format!(
                        "the client certificate's common name {cn:?} is no principal in the server's auth file"
                    ))
                }),
        }
    }

    /// Number of principals.
    pub fn len(&self) -> usize {
        self.principals.len()
    }

    /// Whether some principal is granted some permission somewhere (a
    /// table that grants nothing refuses every call).
    pub fn grants_anything(&self) -> bool {
        self.principals
            .iter()
            .any(|p| p.rules.iter().any(|(_, perms)| !perms.is_empty()))
    }
}

/// What is wrong with how an auth file is kept, for a warning: readable or
/// writable by users other than its owner (it holds token digests, and
/// whoever writes it grants themselves anything).
pub fn file_mode_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "auth file {} is readable or writable by other users (mode {mode:03o}): it holds token digests and grants every permission; chmod 600 it",
            path.display()
        )
    })
}

/// Why an auth file was refused; each message names the rule.
#[derive(Debug, thiserror::Error)]
#[error("auth file {path}: {message}")]
pub struct AuthFileError {
    pub path: String,
    pub message: String,
}

/// The rule of the auth file that a text breaks, named in the message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BrokenRule(pub String);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principal: Vec<Entry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    token_sha256: Option<String>,
    #[serde(default)]
    rules: BTreeMap<String, Vec<String>>,
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Parses the auth file's text (TOML: `[[principal]]` entries with `name`,
/// `token_sha256` and `rules`).
pub fn parse(text: &str) -> Result<AuthTable, BrokenRule> {
    let file: File = toml::from_str(text).map_err(|e| BrokenRule(e.to_string()))?;
    let mut names = HashSet::new();
    let mut digests = HashSet::new();
    let mut principals = Vec::with_capacity(file.principal.len());
    for (i, e) in file.principal.into_iter().enumerate() {
        let at = format!("principal #{} ({:?})", i + 1, e.name);
        if e.name.trim().is_empty() || e.name.trim() != e.name {
            return Err(BrokenRule(format!(
                "{at}: `name` must be non-empty without surrounding whitespace"
            )));
        }
        if !names.insert(e.name.clone()) {
            return Err(BrokenRule(format!(
                "{at}: the name is used by an earlier principal; names must be unique"
            )));
        }
        let token_sha256 = match &e.token_sha256 {
            None => None,
            Some(hex) => Some(parse_digest(hex).ok_or_else(|| {
                BrokenRule(format!("{at}: `token_sha256` must be 64 hex digits (the SHA-256 of the token, as `sha256sum` prints it)"))
            })?),
        };
        if let Some(d) = token_sha256 {
            if !digests.insert(d) {
                return Err(BrokenRule(format!(
                    "{at}: `token_sha256` is also an earlier principal's; each token must prove one principal"
                )));
            }
        }
        let mut rules = Vec::with_capacity(e.rules.len());
        for (prefix, words) in e.rules {
            let mut perms = Vec::with_capacity(words.len());
            for w in &words {
                perms.push(Permission::parse(w).ok_or_else(|| {
                    BrokenRule(format!(
                        "{at}: rule {prefix:?} has permission {w:?}; the permissions are read, lease, fence and admin"
                    ))
                })?);
            }
            rules.push((prefix.nfc().collect::<String>(), perms));
        }
        principals.push(Arc::new(Principal {
            name: e.name,
            token_sha256,
            rules,
        }));
    }
    Ok(AuthTable { principals })
}

/// The server's current auth table (or none: auth off), reloadable.
#[derive(Debug, Default)]
pub struct Auth {
    path: Option<PathBuf>,
    table: RwLock<Option<Arc<AuthTable>>>,
}

impl Auth {
    /// Auth off: every call is allowed.
    pub fn off() -> Self {
        Self::default()
    }

    /// Loads `path`; the error names the file and the rule.
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        let table = read(path)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            table: RwLock::new(Some(Arc::new(table))),
        })
    }

    /// Reads the file again; on error the previous table stays in force.
    /// Returns the number of principals now in force.
    pub fn reload(&self) -> Result<usize, AuthFileError> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let table = read(path)?;
        let n = table.len();
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(table));
        Ok(n)
    }

    /// Whether calls are checked (an auth file was given).
    pub fn is_on(&self) -> bool {
        self.path.is_some()
    }

    /// The table in force, or `None` with auth off.
    pub fn table(&self) -> Option<Arc<AuthTable>> {
        // Auth off never changes (a reload needs a file): every call asks,
        // so it takes no lock.
        if !self.is_on() {
            return None;
        }
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn read(path: &Path) -> Result<AuthTable, AuthFileError> {
    let error = |message: String| AuthFileError {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot read it: {e}")))?;
    parse(&text).map_err(|e| error(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN_A: &str = "alpha-token";

    fn hex(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn table() -> AuthTable {
        parse(&format!(
            r#"
[[principal]]
name = "billing"
token_sha256 = "{}"
rules = {{ "statement:" = ["read", "lease"], "" = ["read"] }}

[[principal]]
name = "ops"
rules = {{ "" = ["read", "fence", "admin"] }}
"#,
            hex(TOKEN_A)
        ))
        .unwrap()
    }

    #[test]
    fn tokens_and_certificates_prove_principals() {
        let t = table();
        let bearer = format!("Bearer {TOKEN_A}");
        let p = t
            .authenticate(&Credential::from_parts(Some(bearer.as_bytes()), None))
            .unwrap();
        assert_eq!(p.name, "billing");
        assert!(p.allows(Permission::Lease, "statement:42"));
        assert!(!p.allows(Permission::Lease, "invoice:42"));
        assert!(p.allows(Permission::Read, "invoice:42"));
        assert!(!p.allows(Permission::Fence, "statement:42"));
        let ops = t
            .authenticate(&Credential::from_parts(None, Some("ops")))
            .unwrap();
        assert!(ops.allows_everything(Permission::Admin));
        assert!(!ops.allows(Permission::Lease, "statement:1"));
        assert_eq!(p.prefixes(Permission::Read), [""], "\"\" covers statement:");
        assert_eq!(p.prefixes(Permission::Lease), ["statement:"]);
        assert!(p.prefixes(Permission::Fence).is_empty());
        for wrong in [
            Credential::from_parts(Some(b"Bearer nope"), Some("ops")),
            Credential::from_parts(None, Some("billing-x")),
            Credential::None,
        ] {
            assert!(matches!(
                t.authenticate(&wrong),
                Err(Refusal::Unauthenticated(_))
            ));
        }
    }

    #[test]
    fn bad_files_name_the_rule() {
        for (text, says) in [
            ("[[principal]]\nname = \"\"", "non-empty"),
            ("[[principal]]\nname = \"a\"\ntoken_sha256 = \"xyz\"", "64 hex digits"),
            (
                "[[principal]]\nname = \"a\"\nrules = { \"x:\" = [\"write\"] }",
                "read, lease, fence and admin",
            ),
            ("[[principal]]\nname = \"a\"\n[[principal]]\nname = \"a\"", "unique"),
            ("[[principal]]\nname = \"a\"\ncolour = 1", "unknown field"),
            (
                &format!(
                    "[[principal]]\nname = \"a\"\ntoken_sha256 = \"{0}\"\n[[principal]]\nname = \"b\"\ntoken_sha256 = \"{0}\"",
                    hex("t")
                ),
                "one principal",
            ),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
