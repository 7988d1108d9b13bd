//! Seeds that once failed, kept as regression cases: each is run on the
//! correct build and must be clean. A seed is a run only for one version
//! of the simulator (a change to the fault mix or the workers draws other
//! numbers), so each finding also has a unit test where its cause could
//! be pinned down; the seed stays as the case the issue was found with.

use baton_sim::{run, Config};

/// (seed, what it found, and where the fix is).
const FAILED_ONCE: &[(u64, &str)] = &[
    (
        0,
        "livelock: an idle session worker whose open was in flight woke itself at one instant (client.rs schedule)",
    ),
    (
        3956,
        "livelock: a session lease's renewal time, never renewed, woke its worker at one instant (client.rs schedule)",
    ),
    (
        3966,
        "panic: a duplicated session open was refused as already open, which the engine took for a bug (engine.rs session)",
    ),
    (
        1955,
        "a duplicated acquire (no request id) of a permit waited and was granted a second slot under the same acquisition id while the first was held (core shape.rs holds_slot)",
    ),
];

#[test]
fn every_seed_that_once_failed_is_clean() {
    for (seed, finding) in FAILED_ONCE {
        let r = run(*seed, &Config::default());
        assert!(
            r.violations.is_empty(),
            "seed {seed} ({finding}) fails again: {:?}",
            r.violations
        );
    }
}
