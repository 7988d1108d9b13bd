//! The flags both load generators share (`baton bench` and `baton-bench`),
//! one definition for both, so a measurement is written the same way
//! whichever binary runs it.

use std::time::Duration;

use baton_client::flags::parse_positive_duration;

use crate::Modes;

/// Client counts, the time per measurement, the lease TTL and the modes.
#[derive(Clone, Debug, clap::Args)]
pub struct CycleFlags {
    /// Client counts to run, comma-separated (each 1 to 4096).
    #[arg(long, default_value = "1,16,64", value_parser = parse_clients)]
    pub clients: ClientCounts,
    /// Time per measurement (like 3s, 500ms).
    #[arg(long, default_value = "3s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// TTL of every lease the benchmark takes (like 30s).
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub ttl: Duration,
    /// distinct (each client its own resource), shared (all on one), or both.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    pub modes: Modes,
    /// Every name the cycles use starts with this (a principal's or a
    /// tenant's prefix, for servers with rules or quotas on names).
    #[arg(long, default_value = "bench:", value_parser = parse_prefix)]
    pub prefix: String,
}

impl CycleFlags {
    /// What this process's cycle names start with: the prefix, then an id
    /// of the run (`tag` tells rounds apart).
    pub fn run_id(&self, tag: &str) -> String {
        format!("{}{}{tag}", self.prefix, std::process::id())
    }
}

/// A prefix that makes valid names: the first name it makes must pass the
/// name rules (at most 256 bytes of prefix leaves room for the rest).
pub fn parse_prefix(s: &str) -> Result<String, String> {
    if s.len() > 256 {
        return Err(format!("--prefix is {} bytes; at most 256", s.len()));
    }
    let name = format!("{s}0:c1:r0");
    baton_client::baton_core::ResourceName::parse(&name).map_err(|e| {
        format!("--prefix {s:?} makes names such as {name:?}, which break a rule: {e}")
    })?;
    Ok(s.to_string())
}

/// The client counts of `--clients`, in the order given; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCounts(Vec<usize>);

impl ClientCounts {
    /// Every count, in order.
    pub fn all(&self) -> &[usize] {
        &self.0
    }

    /// The first count: the one a single-count run (scaling, overheads,
    /// events) uses.
    pub fn first(&self) -> usize {
        self.0[0]
    }
}

/// Parses `1,16,64` into client counts.
pub fn parse_clients(s: &str) -> Result<ClientCounts, String> {
    s.split(',')
        .map(|p| match p.trim().parse::<usize>() {
            Ok(n) if (1..=4096).contains(&n) => Ok(n),
            _ => Err(format!(
                "client count {p:?} must be a whole number from 1 to 4096"
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ClientCounts)
}

/// How the benchmark's clients hold what they acquire, as `--lock` names
/// it: `exclusive` (the default), `permits:N` (a permit of a semaphore of
/// N), `readers:N` (N shared holders to each exclusive one: every
/// (N+1)th connection writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LockShape {
    /// One holder.
    #[default]
    Exclusive,
    /// Permits of a semaphore of N.
    Permits(u32),
    /// N readers (shared) to each writer (exclusive).
    Readers(u32),
}

impl LockShape {
    /// The shape of the `i`th connection.
    pub(crate) fn of(self, i: usize) -> baton_client::Shape {
        match self {
            LockShape::Exclusive => baton_client::Shape::Exclusive,
            LockShape::Permits(n) => baton_client::Shape::Permits(n),
            LockShape::Readers(n) if (i + 1).is_multiple_of(n as usize + 1) => {
                baton_client::Shape::Exclusive
            }
            LockShape::Readers(_) => baton_client::Shape::Shared,
        }
    }
}

/// `--lock`: `exclusive`, `permits:N` (1 to 4096) or `readers:N` (1 or more).
pub fn parse_lock(raw: &str) -> Result<LockShape, String> {
    let bad = || {
        format!("{raw:?} is not a lock shape: write exclusive, permits:N (1 to 4096) or readers:N (1 or more)")
    };
    match raw.split_once(':') {
        None if raw == "exclusive" => Ok(LockShape::Exclusive),
        Some(("permits", n)) => match n.parse::<u32>() {
            Ok(n) if (1..=baton_client::PERMITS_MAX).contains(&n) => Ok(LockShape::Permits(n)),
            _ => Err(bad()),
        },
        Some(("readers", n)) => match n.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(LockShape::Readers(n)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_counts_are_whole_numbers_from_1_to_4096() {
        assert_eq!(parse_clients("1, 16,64").unwrap().all(), &[1, 16, 64]);
        assert_eq!(parse_clients("8").unwrap().first(), 8);
        for bad in ["", "0", "4097", "1,,2", "x"] {
            assert!(parse_clients(bad).is_err(), "{bad:?} accepted");
        }
    }
}
