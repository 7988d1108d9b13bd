//! Rendering: every result is one type that serializes to the `--json`
//! object and knows its text line(s) and exit code.

use serde::Serialize;

use crate::error::Exit;

/// A command's result, printed once by [`emit`].
pub trait Rendered: Serialize {
    /// The human-readable form.
    fn text(&self) -> String;
    /// The exit code this result means.
    fn exit(&self) -> Exit {
        Exit::Ok
    }
}

/// Prints `out` as JSON or text and returns its exit code.
pub fn emit(json: bool, out: &impl Rendered) -> Exit {
    if json {
        line(&serde_json::to_string(out).expect("output types serialize"));
    } else {
        let text = out.text();
        if !text.is_empty() {
            line(&text);
        }
    }
    out.exit()
}

/// Prints one line on stdout. A reader that went away (a closed pipe) is
/// not an error of the command: its exit code still tells the outcome.
pub fn line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}
