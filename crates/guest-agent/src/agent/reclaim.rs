//! `reclaim`: an idle guest drops its page cache and reclaimable slab, so
//! the memory is free and the balloon reports it to the host. The host
//! asks periodically; the agent decides, since only it knows whether the
//! guest is in use.

use std::sync::atomic::Ordering;

use guest_agent::protocol::{InUse, ProcessRunState, ReclaimAnswer};

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

/// Serves `reclaim`. Connections are not counted: the host sees its own
/// open at once and asks only when none is, where a guest slowed by a
/// loaded host may still hold one the host gave up on (each such check
/// then found the next one busy, and no guest on a saturated host ever
/// paused).
pub fn run(state: &AgentState, idle_secs: u64) -> Result<ReclaimAnswer, ReclaimError> {
    let now = now_ms(state);
    let last = state.last_request_ms.load(Ordering::SeqCst);
    let idle_ms = now.saturating_sub(last);
    let busy_because = in_use(state);
    let busy = busy_because.is_some();
    let already = state.reclaimed_after_ms.load(Ordering::SeqCst) == last.max(1);
    let free_before = free_kib();
    let mut answer = ReclaimAnswer {
        dropped: false,
        idle_secs: idle_ms / 1000,
        free_kib_before: free_before,
        free_kib_after: free_before,
        busy: Some(busy),
        busy_because,
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

/// What keeps the guest in use, if anything: the cheapest look first (on
/// an emulating host each file read costs the guest kernel milliseconds);
/// the CPU's, which reads every process's, only when nothing else was
/// found (the next compares with the last that was made).
fn in_use(state: &AgentState) -> Option<InUse> {
    if state
        .processes
        .list()
        .iter()
        .any(|p| p.state == ProcessRunState::Running)
    {
        Some(InUse::Process)
    } else if talks_to_the_network() {
        Some(InUse::Network)
    } else {
        used_the_cpu(state).then_some(InUse::Cpu)
    }
}

/// Whether the guest's programs used the CPU since the last look: their
/// time beyond 2% of one CPU, so a daemon waiting for connections (a dev
/// server) lets the guest pause and a job left running in the background
/// (`nohup make &`) does not. Their time is what every live process but
/// the agent and the kernel's threads has used, plus what the agent's
/// reaped children used (orphans end as its children); the agent's own
/// time is left out, since answering costs it. The first ask compares
/// with the agent's start, when no program had run yet.
fn used_the_cpu(state: &AgentState) -> bool {
    let now = (std::time::Instant::now(), programs_ticks());
    let mut last = state
        .last_cpu_ticks
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let (at, ticks) = last.replace(now).unwrap_or((state.started, 0));
    busy_between(ticks, now.1, now.0.duration_since(at))
}

/// Whether a TCP connection to or from beyond the guest is open: a
/// download, a clone, a long poll or a peer's session waits on the
/// network with no CPU use, and a pause would stall it until the far end
/// gave up. Loopback connections are the guest's own (a published port's
/// arrive through the agent, counted as its connections).
fn talks_to_the_network() -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|t| t.lines().skip(1).any(is_outside_connection))
    })
}

/// A `/proc/net/tcp{,6}` row of an established connection whose far end
/// is not loopback (`127.0.0.0/8`, `::1`, `::ffff:127.0.0.0/104`; the
/// addresses are hex in the kernel's byte order).
fn is_outside_connection(row: &str) -> bool {
    let fields: Vec<&str> = row.split_whitespace().collect();
    let (Some(remote), Some(state)) = (fields.get(2), fields.get(3)) else {
        return false;
    };
    // 01: TCP_ESTABLISHED.
    if *state != "01" {
        return false;
    }
    let addr = remote.split(':').next().unwrap_or_default();
    let loopback = match addr.len() {
        8 => addr.ends_with("7F"),
        32 => {
            addr == "00000000000000000000000001000000"
                || (addr.starts_with("0000000000000000FFFF0000") && addr.ends_with("7F"))
        }
        _ => false,
    };
    !loopback
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
    use super::{busy_between, is_outside_connection, process_ticks};
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
    fn an_established_connection_beyond_loopback_is_network_use() {
        let row = |remote: &str, state: &str| {
            format!("   0: 0F02000A:A1B2 {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 1234")
        };
        // 10.0.2.15 to 140.82.112.3:443, established.
        assert!(is_outside_connection(&row("0370528C:01BB", "01")));
        // Listening, or to 127.0.0.1, or closing: not.
        assert!(!is_outside_connection(&row("00000000:0000", "0A")));
        assert!(!is_outside_connection(&row("0100007F:1F90", "01")));
        assert!(!is_outside_connection(&row("0370528C:01BB", "06")));
        // IPv6: ::1 and ::ffff:127.0.0.1 are loopback; 2001:db8::1 is not.
        assert!(!is_outside_connection(&row(
            "00000000000000000000000001000000:1F90",
            "01"
        )));
        assert!(!is_outside_connection(&row(
            "0000000000000000FFFF00000100007F:1F90",
            "01"
        )));
        assert!(is_outside_connection(&row(
            "B80D0120000000000000000001000000:01BB",
            "01"
        )));
        assert!(!is_outside_connection("garbage"));
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
