//! The fault schedule: a pure function of the seed, the worker count, the
//! duration, the TTL and the backend.

use std::time::Duration;

use baton_client::rng::Rng;

/// One scheduled fault. Durations are in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP a worker, SIGCONT it `ms` later.
    Pause {
        worker: usize,
        ms: u64,
    },
    /// SIGKILL a worker, start it again `ms` later.
    KillWorker {
        worker: usize,
        ms: u64,
    },
    /// SIGKILL the Baton server, start it again `ms` later.
    KillServer {
        ms: u64,
    },
    /// Hold one direction of a worker's Baton traffic for `ms`.
    HoldBaton {
        worker: usize,
        to_server: bool,
        ms: u64,
    },
    /// Drop the response to the worker's next Baton request.
    DropBatonResponse {
        worker: usize,
    },
    ResetBaton {
        worker: usize,
    },
    HoldPostgres {
        worker: usize,
        to_server: bool,
        ms: u64,
    },
    DropPostgresResponse {
        worker: usize,
    },
    ResetPostgres {
        worker: usize,
    },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pause { .. } => "pause",
            Fault::KillWorker { .. } => "kill_worker",
            Fault::KillServer { .. } => "kill_server",
            Fault::HoldBaton { .. } => "hold_baton",
            Fault::DropBatonResponse { .. } => "drop_baton_response",
            Fault::ResetBaton { .. } => "reset_baton",
            Fault::HoldPostgres { .. } => "hold_postgres",
            Fault::DropPostgresResponse { .. } => "drop_postgres_response",
            Fault::ResetPostgres { .. } => "reset_postgres",
        }
    }
}

/// The fault schedule: (offset from the start in ms, fault). A pure
/// function of its arguments, so the same seed gives the same schedule.
pub fn schedule(
    seed: u64,
    workers: usize,
    duration: Duration,
    ttl: Duration,
    postgres: bool,
) -> Vec<(u64, Fault)> {
    let mut rng = Rng::new(seed);
    let ttl_ms = ttl.as_millis() as u64;
    let end_ms = duration.as_millis() as u64;
    let n = workers as u64;
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        at += rng.between(150, 650);
        if at >= end_ms {
            return out;
        }
        let worker = rng.below(n) as usize;
        let pause_ms = rng.between(ttl_ms / 2, 3 * ttl_ms);
        let to_server = rng.below(2) == 0;
        let roll = rng.below(100);
        let fault = match roll {
            0..=24 => Fault::Pause {
                worker,
                ms: pause_ms,
            },
            25..=36 => Fault::KillWorker {
                worker,
                ms: rng.between(0, 1_000),
            },
            37..=40 => Fault::KillServer {
                ms: rng.between(100, 1_500),
            },
            41..=55 => Fault::HoldBaton {
                worker,
                to_server,
                ms: pause_ms,
            },
            56..=65 => Fault::DropBatonResponse { worker },
            66..=71 => Fault::ResetBaton { worker },
            _ if !postgres => Fault::Pause {
                worker,
                ms: pause_ms,
            },
            72..=83 => Fault::HoldPostgres {
                worker,
                to_server,
                ms: rng.between(ttl_ms / 5, 2 * ttl_ms),
            },
            84..=93 => Fault::DropPostgresResponse { worker },
            _ => Fault::ResetPostgres { worker },
        };
        out.push((at, fault));
    }
}

/// A fingerprint of a schedule, printed so two runs can be compared.
pub fn fingerprint(schedule: &[(u64, Fault)]) -> String {
    let text: String = schedule
        .iter()
        .map(|(at, fault)| format!("{at}{fault:?}"))
        .collect();
    format!("{:016x}", baton_client::rng::hash(0, text.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let a = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        let b = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        let c = schedule(8, 8, Duration::from_secs(60), Duration::from_secs(1), true);
        assert_eq!(a, b);
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert!(a.len() > 60, "about one fault every 400 ms");
        let kinds: std::collections::BTreeSet<_> = a.iter().map(|(_, f)| f.kind()).collect();
        assert_eq!(
            kinds.len(),
            9,
            "every kind of fault is scheduled: {kinds:?}"
        );
        let sqlite = schedule(7, 8, Duration::from_secs(60), Duration::from_secs(1), false);
        assert!(sqlite.iter().all(|(_, f)| !f.kind().contains("postgres")));
        assert!(a.windows(2).all(|w| w[0].0 < w[1].0) && a.last().unwrap().0 < 60_000);
    }
}
