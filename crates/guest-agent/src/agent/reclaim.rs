//! `reclaim`: an idle guest drops its page cache and reclaimable slab, so
//! the memory is free and the balloon reports it to the host. The host
//! asks periodically; the agent decides, since only it knows whether the
//! guest is in use.

use std::sync::atomic::Ordering;

use guest_agent::protocol::{ProcessRunState, ReclaimAnswer};

use super::AgentState;

/// Where the kernel takes the order (3: page cache, dentries and inodes).
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Why the caches could not be dropped.
#[derive(Debug, thiserror::Error)]
#[error("writing {DROP_CACHES}")]
pub struct ReclaimError(#[source] std::io::Error);

/// Milliseconds since the agent started (the clock requests are stamped on).
pub fn now_ms(state: &AgentState) -> u64 {
    state.started.elapsed().as_millis() as u64
}

/// Serves `reclaim`; the calling connection is the only one open when the
/// guest is idle.
pub fn run(state: &AgentState, idle_secs: u64) -> Result<ReclaimAnswer, ReclaimError> {
    let now = now_ms(state);
    let last = state.last_request_ms.load(Ordering::SeqCst);
    let idle_ms = now.saturating_sub(last);
    let busy = state.connections.load(Ordering::SeqCst) > 1
        || state
            .processes
            .list()
            .iter()
            .any(|p| p.state == ProcessRunState::Running)
        || used_the_cpu(state);
    let already = state.reclaimed_after_ms.load(Ordering::SeqCst) == last.max(1);
    let free_before = free_kib();
    let mut answer = ReclaimAnswer {
        dropped: false,
        idle_secs: idle_ms / 1000,
        free_kib_before: free_before,
        free_kib_after: free_before,
        busy: Some(busy),
    };
    if busy || already || idle_ms < idle_secs.saturating_mul(1000) {
        return Ok(answer);
    }
    // Dirty pages are not dropped: written back first, they are.
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write(DROP_CACHES, b"3\n").map_err(ReclaimError)?;
    state
        .reclaimed_after_ms
        .store(last.max(1), Ordering::SeqCst);
    answer.dropped = true;
    answer.free_kib_after = free_kib();
    Ok(answer)
}

/// Whether the guest's programs used the CPU since the last ask: their
/// time beyond 2% of one CPU, so a daemon waiting for connections (a dev
/// server) lets the guest pause and a job left running in the background
/// (`nohup make &`) does not. Their time is what every live process but
/// the agent and the kernel's threads has used, plus what the agent's
/// reaped children used (orphans end as its children); the agent's own
/// time is left out, since answering costs it. The first ask has nothing
/// to compare with and counts as busy.
fn used_the_cpu(state: &AgentState) -> bool {
    let now = (std::time::Instant::now(), programs_ticks());
    let mut last = state
        .last_cpu_ticks
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    match last.replace(now) {
        Some((at, ticks)) => busy_between(ticks, now.1, now.0.duration_since(at)),
        None => true,
    }
}

/// CPU ticks (1/100 s) the guest's programs have used, as
/// [`used_the_cpu`] counts them.
fn programs_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != 2)
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            process_ticks(&stat, pid == 1)
        })
        .sum()
}

/// A process's ticks from its `/proc/PID/stat`: utime + stime, or for the
/// agent its reaped children's cutime + cstime; None for a kernel thread
/// (whose parent is kthreadd, PID 2). The command name may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn process_ticks(stat: &str, agent: bool) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: state (3), ppid (4), ... utime (14), stime (15),
    // cutime (16), cstime (17).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    if field(4)? == 2 {
        return None;
    }
    if agent {
        Some(field(16)? + field(17)?)
    } else {
        Some(field(14)? + field(15)?)
    }
}

/// Whether programs used more than 2% of one CPU over `elapsed`.
fn busy_between(before: u64, now: u64, elapsed: std::time::Duration) -> bool {
    let used_ms = now.saturating_sub(before).saturating_mul(10);
    used_ms.saturating_mul(50) > elapsed.as_millis() as u64
}

/// MemFree, KiB (0 when /proc is unreadable).
fn free_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .map(|m| super::sysinfo::meminfo_kib(&m, "MemFree"))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{busy_between, process_ticks};
    use std::time::Duration;

    #[test]
    fn a_process_counts_its_own_time_and_the_agent_its_reaped_childrens() {
        let stat = |name: &str, ppid: u32| {
            format!("57 ({name}) S {ppid} 57 57 0 -1 4194304 100 0 0 0 30 12 5 4 20 0 1 0")
        };
        assert_eq!(process_ticks(&stat("make", 1), false), Some(42));
        assert_eq!(process_ticks(&stat("a) b (c", 1), false), Some(42));
        assert_eq!(process_ticks(&stat("microagent-agent", 0), true), Some(9));
        assert_eq!(process_ticks(&stat("kworker/0:1", 2), false), None);
        assert_eq!(process_ticks("garbage", false), None);
        assert_eq!(process_ticks("1 (x) S", false), None);
    }

    #[test]
    fn programs_using_over_two_percent_of_a_cpu_are_busy() {
        let ten_secs = Duration::from_secs(10);
        // 100 ms of 10 s (1%): idle; 1 s (10%): busy.
        assert!(!busy_between(100, 110, ten_secs));
        assert!(busy_between(100, 200, ten_secs));
        // A process that ended takes its ticks along: not busy.
        assert!(!busy_between(100, 50, ten_secs));
    }
}
