//! What the lease table alone costs per lease, in this process, with the
//! server's allocator: a table filled by acquires (in name order, as
//! `baton bench --fill-leases` fills a server) and one rebuilt by
//! `LeaseTable::recover` from the same leases, as a restart does. With
//! `shuffled`, the table is filled by acquires in a random order of the
//! same names instead.
//!
//! With `expire`, the leases (granted in the same millisecond) then all
//! expire: how long the step that reaches them holds the table, and the
//! steps after it that drop them.
//!
//! ```sh
//! cargo run --release -p baton-bench --example table_memory -- 10000000
//! cargo run --release -p baton-bench --example table_memory -- 10000000 shuffled
//! cargo run --release -p baton-bench --example table_memory -- 1000000 expire
//! ```

use std::time::Instant;

use baton_core::{
    AcquireRequest, AcquisitionId, Epoch, FencingToken, LeaseRecord, LeaseTable, LeaseTerm, Limits,
    MonoMs, ResourceName, WaiterId,
};

mod common;
use common::{random_order, resident_kib};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TTL_MS: u64 = 3_600_000;

fn name(k: usize) -> ResourceName {
    ResourceName::parse(&format!("fill:a1b2c3d4e5f6:{k:08}")).expect("a valid name")
}

fn id(k: usize) -> AcquisitionId {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(k as u64).to_le_bytes());
    AcquisitionId::from_bytes(bytes)
}

fn limits() -> Limits {
    Limits {
        ttl_ms_max: TTL_MS,
        ..Limits::default()
    }
}

fn report(what: &str, n: usize, before_kib: u64, started: Instant) {
    let grown_kib = resident_kib().saturating_sub(before_kib);
    println!(
        "{what}: {n} leases in {:.1} s, {} MiB, {:.0} bytes a lease",
        started.elapsed().as_secs_f64(),
        grown_kib / 1024,
        grown_kib as f64 * 1024.0 / n.max(1) as f64
    );
}

/// Grants `n` leases, 64 to an acquire, in name order.
fn filled(n: usize) -> LeaseTable {
    filled_in(n, |k| k, "filled by acquires")
}

/// Grants `n` leases, 64 to an acquire, the k-th to the name `order(k)`.
fn filled_in(n: usize, order: impl Fn(usize) -> usize, what: &str) -> LeaseTable {
    let mut table = LeaseTable::new(limits(), Epoch::FIRST, 0);
    let (before_kib, started) = (resident_kib(), Instant::now());
    for first in (0..n).step_by(64) {
        let claims = (first..(first + 64).min(n))
            .map(|k| baton_core::Claim::exclusive(name(order(k)), id(k)))
            .collect();
        let request = AcquireRequest {
            claims,
            term: LeaseTerm::Own { ttl_ms: TTL_MS },
            wait_ms: 0,
            waiter: WaiterId(first as u64),
            holder: None,
            attempt: None,
        };
        table.acquire(MonoMs(1), request).expect("granted");
        drop(table.take_effects());
    }
    report(what, table.n_leases(), before_kib, started);
    table
}

/// Fills a table with `n` leases granted in one millisecond, then steps
/// it at their deadline until every one is dropped, timing each step.
fn expired(n: usize) {
    let mut table = filled(n);
    let mut now = MonoMs(1 + TTL_MS + 1);
    let mut steps_ms = Vec::new();
    let mut dropped = 0;
    while table.n_overdue() > 0 || steps_ms.is_empty() {
        let started = Instant::now();
        table.tick(now);
        let fx = table.take_effects();
        steps_ms.push(started.elapsed().as_secs_f64() * 1e3);
        dropped += fx.writes.len();
        drop(fx);
        now = table.next_deadline().unwrap_or(now);
    }
    let first_ms = steps_ms[0];
    let rest_max_ms = steps_ms[1..].iter().copied().fold(0.0, f64::max);
    println!(
        "expired: {n} leases ending in one millisecond: {} steps, the first {first_ms:.1} ms, \
         the longest after it {rest_max_ms:.2} ms, {:.0} ms in all; {dropped} deletions written, \
         {} leases left",
        steps_ms.len(),
        steps_ms.iter().sum::<f64>(),
        table.n_leases()
    );
}

/// Rebuilds a table of `n` stored leases (the records' own memory is
/// counted before the clock starts).
fn recovered(n: usize) {
    let records: Vec<_> = (0..n)
        .map(|k| {
            let record = LeaseRecord {
                acquisition_digest: id(k).digest(),
                token: FencingToken::new(Epoch::FIRST, k as u64 + 1).expect("in range"),
                ttl_ms: TTL_MS,
                session: None,
                holder: None,
                shape: baton_core::Shape::Exclusive,
            };
            (name(k), record)
        })
        .collect();
    let (before_kib, started) = (resident_kib(), Instant::now());
    let table = LeaseTable::recover(limits(), MonoMs(1), Epoch::FIRST, n as u64, records, []);
    report("recovered", table.n_leases(), before_kib, started);
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| {
            a.parse()
                .expect("usage: table_memory N_LEASES [fill|shuffled|recover|expire]")
        })
        .unwrap_or(1_000_000);
    match std::env::args().nth(2).as_deref() {
        Some("fill") => drop(filled(n)),
        Some("shuffled") => {
            let order = random_order(n);
            drop(filled_in(
                n,
                |k| order[k] as usize,
                "filled by acquires, shuffled",
            ));
        }
        Some("recover") => recovered(n),
        Some("expire") => expired(n),
        _ => {
            drop(filled(n));
            recovered(n);
        }
    }
}
