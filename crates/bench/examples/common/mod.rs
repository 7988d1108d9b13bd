//! What the memory examples share (a directory without `main.rs`, so
//! Cargo does not take it for an example of its own).

// Each example uses part of it.
#![allow(dead_code)]

/// This process's resident size, from `/proc/self/status`.
pub fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// `0..n` in a fixed random order (Fisher-Yates with a xorshift generator:
/// the same order every run, no generator crate for an example).
pub fn random_order(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..u32::try_from(n).expect("at most 2^32")).collect();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}
