//! The simulator's own promises: a seed is a run, byte for byte; a run
//! reaches the scale it claims and is clean on the correct build; and, in
//! a build with the known-bad variants, each variant is found.

use std::process::Command;

use baton_sim::{run, Config};

#[test]
fn the_same_seed_gives_the_same_trace_in_one_process_and_across_two() {
    let config = Config {
        keep_trace: true,
        ..Config::default()
    };
    for seed in [0, 1, 7, 1_844, 10_821] {
        let (a, b) = (run(seed, &config), run(seed, &config));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed} ran two ways");
        assert_eq!(a.trace, b.trace, "seed {seed}: the readable traces differ");
        assert_eq!(a.n_events, b.n_events);
    }
    // Another seed is another run.
    assert_ne!(run(0, &config).trace_hash, run(2, &config).trace_hash);
    // Two threads at once share nothing (the variant and the generators
    // are per run).
    let hashes: Vec<u64> = std::thread::scope(|s| {
        let h: Vec<_> = (0..2)
            .map(|_| s.spawn(|| run(3, &Config::default()).trace_hash))
            .collect();
        h.into_iter().map(|h| h.join().expect("a run")).collect()
    });
    assert_eq!(hashes[0], hashes[1]);
    // Another process: its hash maps and thread ids differ, the run does not.
    let printed = |seed: u64| {
        let out = Command::new(env!("CARGO_BIN_EXE_baton-sim"))
            .args(["--seed", &seed.to_string()])
            .output()
            .expect("baton-sim runs");
        assert!(
            out.status.success(),
            "seed {seed} failed in a process of its own"
        );
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let summary = text
            .lines()
            .rev()
            .find(|l| l.starts_with("seed "))
            .expect("a summary")
            .to_string();
        summary
    };
    let one = printed(5);
    assert_eq!(one, printed(5));
    assert!(
        one.contains(&format!("{:016x}", run(5, &Config::default()).trace_hash)),
        "{one}"
    );
}

#[test]
fn a_seed_simulates_a_minute_with_thousands_of_operations_and_dozens_of_faults() {
    for seed in 0..8 {
        let r = run(seed, &Config::default());
        let faults: u64 = r.faults.values().sum();
        assert!(r.n_ops >= 1_000, "seed {seed}: {} operations", r.n_ops);
        assert!(faults >= 24, "seed {seed}: {faults} faults");
        assert!(
            r.n_recoveries >= 2,
            "seed {seed}: {} recoveries",
            r.n_recoveries
        );
        assert!(
            r.n_claims > 100 && r.n_writes_accepted > 100,
            "seed {seed}: {r:?}"
        );
        // Half the workers hold their leases in sessions.
        assert!(
            r.n_sessions_opened >= 4 && r.n_heartbeats >= 50 && r.n_session_claims >= 30,
            "seed {seed}: {r:?}"
        );
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
    // Both shapes run: even seeds are a single server, odd ones a cluster.
    assert!(!run(0, &Config::default()).cluster);
    assert!(run(1, &Config::default()).cluster);
}

#[cfg(feature = "known-bad")]
#[test]
fn every_known_bad_variant_is_found_within_a_few_thousand_seeds() {
    use baton_sim::Variant;
    for v in Variant::ALL {
        let config = Config {
            variant: Some(v),
            ..Config::default()
        };
        let found = (0..20_000).find(|seed| !run(*seed, &config).violations.is_empty());
        assert!(found.is_some(), "variant {} was not found", v.name());
    }
}
