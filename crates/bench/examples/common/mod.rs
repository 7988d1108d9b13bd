//! What the memory examples share (a directory without `main.rs`, so
//! Cargo does not take it for an example of its own).

/// This process's resident size, from `/proc/self/status`.
pub fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status")
}
