//! What /proc says about a node's process.

use std::path::Path;

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists() && state(pid).is_some_and(|s| s != "Z")
}

/// Whether process `pid` is stopped by a signal (SIGSTOP), as the kernel
/// reports it.
pub fn is_stopped(pid: u32) -> bool {
    state(pid).is_some_and(|s| s == "T")
}

/// The process state letter of `/proc/<pid>/stat`.
fn state(pid: u32) -> Option<String> {
    stat_fields(pid)?.into_iter().next()
}

/// The fields of `/proc/<pid>/stat` from the state on: the state is the
/// first, so field N of proc(5) is at index N - 3.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the state follows
    // the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A size field of `/proc/<pid>/status` in KiB, e.g. `VmRSS` (resident
/// memory) or `VmHWM` (its peak).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn this_process_is_alive_running_and_has_memory() {
        let me = std::process::id();
        assert!(pid_alive(me));
        assert!(!is_stopped(me));
        let rss = status_kib(me, "VmRSS").unwrap();
        assert!(rss > 0 && rss <= status_kib(me, "VmHWM").unwrap());
        assert_eq!(status_kib(me, "NoSuchField"), None);
        assert!(!pid_alive(u32::MAX));
    }
}
