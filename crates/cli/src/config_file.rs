//! `baton serve --config FILE`: a TOML file of serve flags.
//!
//! The file is a flat table whose keys are the flag names (`listen`,
//! `data_dir` or `data-dir`, `default_ttl`, ...). Precedence: a flag on the
//! command line, then its `BATON_*` environment variable, then the file,
//! then the built-in default. The file's values are handed to clap as
//! those environment variables, so one parser validates every source.

use std::collections::BTreeMap;

/// The serve flags a config file may set, read from their definitions
/// (every long flag of `serve` but `--config` itself), so that a new flag
/// needs no entry here.
fn keys() -> Vec<String> {
    use clap::CommandFactory;
    let cli = crate::args::Cli::command();
    let serve = cli
        .find_subcommand("serve")
        .expect("the serve subcommand is defined");
    serve
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|long| *long != "config" && *long != "help")
        .map(|long| long.replace('-', "_"))
        .collect()
}

/// The `--config` path among `args` (or `BATON_CONFIG`), for `serve` only.
fn config_path(args: &[String]) -> Option<String> {
    if args.get(1).map(String::as_str) != Some("serve") {
        return None;
    }
    let mut it = args.iter().skip(2);
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(v.to_string());
        }
        if a == "--config" {
            return it.next().cloned();
        }
    }
    std::env::var("BATON_CONFIG").ok()
}

/// The arguments as text for the look-ups here; one that is not UTF-8 is
/// left for clap to refuse.
fn lossy(args: &[std::ffi::OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Why `serve --config FILE` was refused: the file and the rule.
#[derive(Debug, thiserror::Error)]
#[error("--config {path}: {reason}")]
pub struct ConfigFileError {
    path: String,
    reason: String,
}

/// Reads the config file named on the command line, if any, and exposes
/// each value that neither a flag nor the environment sets as its `BATON_*`
/// variable. An unreadable file or an unknown key is an error naming it.
pub fn apply(args: &[std::ffi::OsString]) -> Result<(), ConfigFileError> {
    let args = &lossy(args);
    let Some(path) = config_path(args) else {
        return Ok(());
    };
    let refused = |reason: String| ConfigFileError {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| refused(e.to_string()))?;
    let table: BTreeMap<String, toml::Value> = toml::from_str(&text)
        .map_err(|e| refused(format!("not a TOML table of serve flags: {e}")))?;
    for (key, value) in table {
        let key = key.replace('-', "_");
        let keys = keys();
        if !keys.contains(&key) {
            return Err(refused(format!(
                "unknown key {key:?}; the keys are the serve flags: {}",
                keys.join(", ")
            )));
        }
        let flag = format!("--{}", key.replace('_', "-"));
        let on_command_line = args
            .iter()
            .any(|a| a == &flag || a.starts_with(&format!("{flag}=")));
        let env = format!("BATON_{}", key.to_uppercase());
        if on_command_line || std::env::var_os(&env).is_some() {
            continue;
        }
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            other => {
                return Err(refused(format!(
                    "{key} must be a string or a number, not a {}",
                    other.type_str()
                )))
            }
        };
        // Edition 2021, before any thread starts: set_var is sound here.
        std::env::set_var(env, value);
    }
    Ok(())
}
