//! `baton completions SHELL` and `baton man --dir DIR`: shell completions
//! and man pages generated from the command line's own definitions
//! (`clap_complete`, `clap_mangen`), so they never drift from the flags.

use std::path::Path;

use crate::args::command;
use crate::error::CliError;

/// The completion script for `shell`, on stdout (a reader that went away
/// is not an error).
pub fn completions(shell: clap_complete::Shell) {
    let mut cmd = command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "baton", &mut script);
    crate::stdout::line(String::from_utf8_lossy(&script).trim_end());
}

/// `baton.1` and a page per visible command (`baton-acquire.1`, and
/// `baton-cluster-status.1` for nested ones) in `dir`.
pub fn man_pages(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failure(format!("--dir {}: {e}", dir.display())))?;
    write_page(dir, command(), "baton")
}

fn write_page(dir: &Path, cmd: clap::Command, name: &str) -> Result<(), CliError> {
    let cmd = cmd.name(name.to_string());
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut out)
        .map_err(|e| CliError::failure(format!("rendering {name}.1: {e}")))?;
    std::fs::write(&path, out)
        .map_err(|e| CliError::failure(format!("{}: {e}", path.display())))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_page(dir, sub.clone(), &format!("{name}-{}", sub.get_name()))?;
    }
    Ok(())
}
