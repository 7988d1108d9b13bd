//! Rendering: every result is one type that serializes to the `--json`
//! object and knows its text line(s) and exit code.

use serde::Serialize;

use crate::error::Exit;
use crate::stdout::line;

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
