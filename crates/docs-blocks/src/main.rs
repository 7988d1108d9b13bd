//! `baton-docs-blocks FILE:LINE` runs the docs' Rust block that starts at
//! that line (see build.rs); scripts/docs-test calls it for every block
//! marked `rust`. `--list` prints the blocks it has.

use std::process::ExitCode;

include!(concat!(env!("OUT_DIR"), "/blocks.rs"));

/// A block's program, run by name.
type Block = fn() -> Result<(), BlockFailed>;

/// The error a block's `main` returned, as it prints with `{:?}`.
struct BlockFailed(String);

/// What a block's `main` returns: nothing, or a `Result`.
trait Outcome {
    fn into_result(self) -> Result<(), BlockFailed>;
}

impl Outcome for () {
    fn into_result(self) -> Result<(), BlockFailed> {
        Ok(())
    }
}

impl<E: std::fmt::Debug> Outcome for Result<(), E> {
    fn into_result(self) -> Result<(), BlockFailed> {
        self.map_err(|e| BlockFailed(format!("{e:?}")))
    }
}

fn main() -> ExitCode {
    let Some(wanted) = std::env::args().nth(1) else {
        eprintln!("usage: baton-docs-blocks FILE:LINE | --list");
        return ExitCode::from(2);
    };
    if wanted == "--list" {
        BLOCKS.iter().for_each(|(at, _)| println!("{at}"));
        return ExitCode::SUCCESS;
    }
    let Some((_, block)) = BLOCKS.iter().find(|(at, _)| *at == wanted) else {
        eprintln!(
            "no Rust block marked `rust` starts at {wanted} (rebuild after editing the docs)"
        );
        return ExitCode::from(2);
    };
    match block() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{wanted}: {}", e.0);
            ExitCode::FAILURE
        }
    }
}
