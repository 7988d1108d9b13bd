//! `s3://bucket/prefix` stores, configured the way the AWS SDKs are:
//!
//! - the environment, through `object_store`'s `AmazonS3Builder::from_env`:
//!   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` (a self-hosted
//!   server; requests are path-style unless
//!   `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`), web identity and container
//!   credentials;
//! - else the profile `AWS_PROFILE` (default `default`) of the shared files
//!   `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`
//!   and `AWS_CONFIG_FILE`): keys, session token, region and `endpoint_url`.
//!
//! An `http://` endpoint is allowed because it was asked for (a server on
//! loopback); anything else needs TLS.
//!
//! The profile reader is written here: `object_store` has none, and the AWS
//! SDK's would bring the whole SDK for five keys of an INI file.

use std::collections::HashMap;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::ObjectStore;

use super::ObjectError;

/// The store and the prefix an `s3://` URL names.
pub(super) fn open(url: &url::Url) -> Result<(Arc<dyn ObjectStore>, Path), ObjectError> {
    baton_telemetry::use_ring_for_https();
    let mut builder = AmazonS3Builder::from_env().with_url(url.as_str());
    let has = |b: &AmazonS3Builder, k: AmazonS3ConfigKey| b.get_config_value(&k).is_some();
    if let Some(profile) = profile()? {
        if !has(&builder, AmazonS3ConfigKey::AccessKeyId) {
            if let Some(v) = profile.get("aws_access_key_id") {
                builder = builder.with_access_key_id(v);
            }
            if let Some(v) = profile.get("aws_secret_access_key") {
                builder = builder.with_secret_access_key(v);
            }
            if let Some(v) = profile.get("aws_session_token") {
                builder = builder.with_token(v);
            }
        }
        if !has(&builder, AmazonS3ConfigKey::Region) {
            if let Some(v) = profile.get("region") {
                builder = builder.with_region(v);
            }
        }
        if !has(&builder, AmazonS3ConfigKey::Endpoint) {
            if let Some(v) = profile.get("endpoint_url") {
                builder = builder.with_endpoint(v);
            }
        }
    }
    if builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .is_some_and(|e| e.starts_with("http://"))
    {
        builder = builder.with_allow_http(true);
    }
    let store = builder.build().map_err(|e| ObjectError::Url {
        url: url.to_string(),
        message: e.to_string(),
    })?;
    let prefix = Path::from(url.path().trim_start_matches('/'));
    Ok((Arc::new(store), prefix))
}

/// The keys of the profile named by `AWS_PROFILE` (or `default`) in the
/// shared credentials and config files, if either exists.
fn profile() -> Result<Option<HashMap<String, String>>, ObjectError> {
    let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let home = std::env::var("HOME").unwrap_or_default();
    let credentials = std::env::var("AWS_SHARED_CREDENTIALS_FILE")
        .unwrap_or_else(|_| format!("{home}/.aws/credentials"));
    let config = std::env::var("AWS_CONFIG_FILE").unwrap_or_else(|_| format!("{home}/.aws/config"));
    let mut found: Option<HashMap<String, String>> = None;
    // In the config file, profiles other than `default` are `[profile NAME]`.
    for (path, section) in [
        (credentials, name.clone()),
        (
            config,
            if name == "default" {
                name.clone()
            } else {
                format!("profile {name}")
            },
        ),
    ] {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ObjectError::Credentials(format!("{path}: {e}"))),
        };
        if let Some(keys) = ini_section(&text, &section) {
            let into = found.get_or_insert_with(HashMap::new);
            for (k, v) in keys {
                into.entry(k).or_insert(v);
            }
        }
    }
    Ok(found)
}

/// The `key = value` lines of `[section]` in an INI text, keys lowercased.
fn ini_section(text: &str, section: &str) -> Option<HashMap<String, String>> {
    let mut keys: Option<HashMap<String, String>> = None;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            if inside {
                keys.get_or_insert_with(HashMap::new);
            }
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                keys.get_or_insert_with(HashMap::new)
                    .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::ini_section;

    #[test]
    fn a_profile_section_is_read_and_others_are_not() {
        let text = "[default]\naws_access_key_id = A\n\n[profile ci]\n# comment\nregion = eu-west-1\nendpoint_url=http://127.0.0.1:9000\n[other]\nregion = x\n";
        let d = ini_section(text, "default").unwrap();
        assert_eq!(d["aws_access_key_id"], "A");
        assert!(!d.contains_key("region"));
        let ci = ini_section(text, "profile ci").unwrap();
        assert_eq!(ci["region"], "eu-west-1");
        assert_eq!(ci["endpoint_url"], "http://127.0.0.1:9000");
        assert!(ini_section(text, "missing").is_none());
    }
}
