//! The signals that stop a command, caught from the moment it starts.
//!
//! `tokio::signal::ctrl_c()` only sees a signal that arrives while its
//! future exists; once any such future has installed tokio's handler, a
//! SIGINT that arrives between two of them (a watch printing an event, a
//! campaign between two tries) is caught by nobody and lost: the command
//! goes on as if the user had not asked it to stop. A [`Stop`] registers
//! its signals once, when the command starts, and keeps each one that
//! arrives until the command next waits for it.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::error::CliError;

/// SIGINT, and SIGTERM if asked for, registered at creation.
pub struct Stop {
    int: Signal,
    term: Option<Signal>,
}

fn register(kind: SignalKind, name: &str) -> Result<Signal, CliError> {
    signal(kind).map_err(|e| CliError::failure(format!("cannot install a {name} handler: {e}")))
}

impl Stop {
    /// Stops on SIGINT only (SIGTERM keeps its default action).
    pub fn on_interrupt() -> Result<Self, CliError> {
        Ok(Self {
            int: register(SignalKind::interrupt(), "SIGINT")?,
            term: None,
        })
    }

    /// Stops on SIGINT or SIGTERM.
    pub fn on_interrupt_or_term() -> Result<Self, CliError> {
        Ok(Self {
            int: register(SignalKind::interrupt(), "SIGINT")?,
            term: Some(register(SignalKind::terminate(), "SIGTERM")?),
        })
    }

    /// Returns once one of the signals has arrived since creation (or the
    /// last return), at once if one already did.
    pub async fn received(&mut self) {
        match &mut self.term {
            Some(term) => {
                tokio::select! {
                    _ = self.int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            None => {
                self.int.recv().await;
            }
        }
    }
}
