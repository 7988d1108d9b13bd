//! Real signals to real processes: the pauses and kills of the demo, the
//! drills and the chaos run are delivered by the kernel, as in production.
//! Linux: whether a process is stopped is read from `/proc`.

pub use nix::sys::signal::Signal;

/// Sends `signal` to process `pid`.
pub fn send(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid =
        i32::try_from(pid).map_err(|_| std::io::Error::other(format!("pid {pid} out of range")))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).map_err(std::io::Error::from)
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    })
}
