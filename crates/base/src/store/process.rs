//! Whether a recorded VMM process is still the one we started: pid plus its
//! start time from `/proc`, so a recycled pid never looks alive; and a
//! process's CPU time from its `/proc/PID/stat`.

use std::time::{Duration, Instant};

/// The start time of `pid` in clock ticks since boot, or `None` when it is
/// gone or a zombie (dead, not yet reaped).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = stat_fields(&stat)?;
    // starttime is field 22.
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// A process's CPU time in clock ticks, from its `/proc/PID/stat`: its
/// own and its waited-for children's, user and system (fields 14 to 17,
/// counted after the command's closing parenthesis, which the command
/// itself may contain).
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    stat_fields(stat)?
        .get(11..15)?
        .iter()
        .try_fold(0u64, |sum, f| {
            Some(sum.saturating_add(f.parse::<u64>().ok()?))
        })
}

/// The fields of a `/proc/PID/stat` line from field 3 (the state) on, so
/// field N is at N - 3: split after the command's closing parenthesis,
/// since the command, in parentheses, may itself hold spaces and `)`.
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// True while the process `pid` that started at `ticks` runs.
pub fn is_alive(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// A pidfd of `pid` (to wait on its end), when it is still the process
/// that started at `ticks`.
pub fn pidfd(pid: u32, ticks: u64) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let raw = i32::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor (it fits an i32) that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    // The pid may be another process by now: its start time tells.
    is_alive(pid, ticks).then_some(fd)
}

/// Waits until the process of `pidfd` (from [`pidfd`]) ends: true when it
/// did, false when waiting failed.
pub fn wait_for_end(pidfd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one live pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, -1) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Waits for this process's child `pid` to end and reaps it.
pub fn reap(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    loop {
        // SAFETY: waits for our own child; no status is read.
        let rc = unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        if rc >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Sends SIGKILL to `pid` if it is still the process that started at `ticks`.
pub fn kill(pid: u32, ticks: u64) {
    if is_alive(pid, ticks) {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: kill(2) takes plain integers and touches no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// True while `pid` is a dead thread-group leader (a zombie) whose other
/// threads are still exiting. Its descriptors (a published port's listener,
/// say) close only when the last thread is gone, so until then it still
/// holds them although it no longer counts as alive.
fn threads_still_exiting(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .and_then(|rest| rest.split_whitespace().next());
    if !matches!(state, Some("Z") | Some("X")) {
        return false;
    }
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| tasks.count() > 1)
}

/// True while the process runs or its threads are still exiting: its
/// files (sockets, ports) may still be open.
pub fn not_yet_gone(pid: u32, ticks: u64) -> bool {
    is_alive(pid, ticks) || threads_still_exiting(pid)
}

/// Waits until the process is gone with all its threads (so its files are
/// closed); false if it still runs after `timeout`.
pub fn wait_gone(pid: u32, ticks: u64, timeout: Duration) -> bool {
    let deadline = crate::host::settings::deadline_after(timeout);
    while not_yet_gone(pid, ticks) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_whatever_it_holds() {
        let stat = "812 (chrome) a) b) S 1 812 812 0 -1 4194560 9 0 0 0 150 25 3 2 20 0 1";
        assert_eq!(cpu_ticks(stat), Some(150 + 25 + 3 + 2));
        assert_eq!(cpu_ticks("812 (chrome) S 1 812"), None);
        assert_eq!(cpu_ticks("no parenthesis"), None);
        assert_eq!(
            cpu_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 nope 1 1 1"),
            None,
            "a field that is no number is no figure"
        );
        assert_eq!(
            cpu_ticks(&format!("1 (x) S 1 1 1 0 -1 0 0 0 0 0 {} 1 0 0", u64::MAX)),
            Some(u64::MAX),
            "sums saturate"
        );
    }

    #[test]
    fn a_missing_or_running_process_has_no_exiting_threads() {
        assert!(!threads_still_exiting(u32::MAX));
        assert!(!threads_still_exiting(std::process::id()));
    }

    #[test]
    fn tracks_a_child_from_start_to_end() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let ticks = start_ticks(pid).expect("a running child has a start time");
        assert!(is_alive(pid, ticks));
        assert!(
            !is_alive(pid, ticks + 1),
            "another start time is another process"
        );
        kill(pid, ticks);
        // Dead but unreaped: a zombie is not alive.
        assert!(wait_gone(pid, ticks, Duration::from_secs(5)));
        child.wait().unwrap();
        assert!(!is_alive(pid, ticks));
        assert_eq!(start_ticks(u32::MAX), None);
    }
}
