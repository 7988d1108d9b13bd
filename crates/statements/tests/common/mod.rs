//! Helpers shared by the statement service's process tests.

/// Whether process `pid` is stopped (SIGSTOP delivered and taken).
pub fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    })
}
