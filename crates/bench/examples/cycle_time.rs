//! What an acquire and a release of a lease of its own cost the lease
//! table alone, with the server's allocator: `N_RESOURCES` resources taken
//! and released in turn (30 s TTL), beside `N_BACKGROUND` leases held for
//! an hour (their deadlines after every cycle's).
//!
//! ```sh
//! cargo run --release -p baton-bench --example cycle_time -- 16 0
//! cargo run --release -p baton-bench --example cycle_time -- 1000 1000000
//! ```

use std::time::Instant;

use baton_core::{
    AcquireOutcome, AcquireRequest, AcquisitionId, Claim, Epoch, LeaseTable, LeaseTerm, Limits,
    MonoMs, ReleaseOutcome, ResourceName, WaiterId,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CYCLES: u64 = 2_000_000;
/// Cycles in one millisecond of the table's clock.
const CYCLES_PER_MS: u64 = 200;

fn id(k: u64) -> AcquisitionId {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&k.to_le_bytes());
    AcquisitionId::from_bytes(bytes)
}

fn request(resource: ResourceName, k: u64, ttl_ms: u64) -> AcquireRequest {
    AcquireRequest {
        claims: vec![Claim::exclusive(resource, id(k))],
        term: LeaseTerm::Own { ttl_ms },
        wait_ms: 0,
        waiter: WaiterId(k),
        holder: None,
        attempt: None,
    }
}

fn main() {
    let usage = "usage: cycle_time N_RESOURCES N_BACKGROUND";
    let arg = |i: usize| -> usize {
        let a = std::env::args().nth(i).expect(usage);
        a.parse().expect(usage)
    };
    let (n_resources, n_background) = (arg(1), arg(2));
    let limits = Limits {
        ttl_ms_max: 3_600_000,
        ..Limits::default()
    };
    let mut table = LeaseTable::new(limits, Epoch::FIRST, 0);
    let mut k = 0;
    for b in 0..n_background {
        k += 1;
        let name = ResourceName::parse(&format!("background:{b:08}")).expect("a valid name");
        let out = table.acquire(MonoMs(1), request(name, k, 3_600_000));
        assert!(matches!(out, Ok(AcquireOutcome::Granted(_))));
        drop(table.take_effects());
    }
    let names: Vec<ResourceName> = (0..n_resources)
        .map(|r| ResourceName::parse(&format!("cycle:{r:06}")).expect("a valid name"))
        .collect();
    let started = Instant::now();
    for cycle in 0..CYCLES {
        let now = MonoMs(2 + cycle / CYCLES_PER_MS);
        let name = &names[cycle as usize % n_resources];
        k += 1;
        let out = table.acquire(now, request(name.clone(), k, 30_000));
        assert!(matches!(out, Ok(AcquireOutcome::Granted(_))));
        drop(table.take_effects());
        let out = table.release(now, name, &id(k));
        assert!(matches!(out, ReleaseOutcome::Released { .. }));
        drop(table.take_effects());
    }
    println!(
        "{n_resources} resources, {n_background} held beside them: {:.0} ns a cycle",
        started.elapsed().as_nanos() as f64 / CYCLES as f64
    );
}
