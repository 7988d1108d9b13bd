//! The one way the command line prints a result line.

/// Prints one line on stdout. A reader that went away (a closed pipe) is
/// not an error of the command: its exit code still tells the outcome.
pub fn line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}
