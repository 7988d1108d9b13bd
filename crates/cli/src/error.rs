//! Exit codes and the one error type of the command line; `main` prints an
//! error once, as text on stderr and, with `--json`, as one object on stdout.

use baton_client::ClientError;
use serde::Serialize;

/// The documented exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Failure = 1,
    Usage = 2,
    NotAcquired = 3,
    NotOwner = 4,
    Refused = 5,
    ExpiredOnArrival = 6,
    /// Over a server limit or a quota (`RESOURCE_EXHAUSTED`): nothing was
    /// applied; retry later.
    Exhausted = 7,
    /// `run`: ownership was lost; the command was stopped.
    RunLost = 124,
    /// `run`: the command did not run (not acquired, or run failed).
    RunNotStarted = 125,
}

/// A command that failed: what to say and how to exit.
#[derive(Debug)]
pub struct CliError {
    pub code: Exit,
    pub message: String,
}

impl CliError {
    /// Invalid usage or input (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: Exit::Usage,
            message: message.into(),
        }
    }

    /// Any other failure (exit 1).
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            code: Exit::Failure,
            message: message.into(),
        }
    }

    /// Prints the error once: JSON on stdout when asked for, text on stderr.
    pub fn report(&self, json: bool) -> Exit {
        if json {
            print_json(&self.message, self.code);
        }
        eprintln!("error: {}", self.message);
        self.code
    }
}

/// The one JSON shape of every error, usage errors included:
/// `{"error": "...", "exit_code": N}` on stdout.
pub fn print_json(message: &str, code: Exit) {
    #[derive(Serialize)]
    struct ErrorJson<'a> {
        error: &'a str,
        exit_code: u8,
    }
    let out = ErrorJson {
        error: message,
        exit_code: code as u8,
    };
    crate::stdout::line(&serde_json::to_string(&out).expect("plain struct serializes"));
}

impl From<crate::args::ShapeError> for CliError {
    fn from(e: crate::args::ShapeError) -> Self {
        Self::usage(e.to_string())
    }
}

impl From<ClientError> for CliError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Invalid(_) => Self::usage(e.to_string()),
            ClientError::Unauthenticated(_) | ClientError::PermissionDenied(_) => Self {
                code: Exit::Refused,
                message: e.to_string(),
            },
            ClientError::Exhausted(_) => Self {
                code: Exit::Exhausted,
                message: e.to_string(),
            },
            _ => Self::failure(e.to_string()),
        }
    }
}
