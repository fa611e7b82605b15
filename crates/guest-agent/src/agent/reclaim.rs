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
            .any(|p| p.state == ProcessRunState::Running);
    let already = state.reclaimed_after_ms.load(Ordering::SeqCst) == last.max(1);
    let free_before = free_kib();
    let mut answer = ReclaimAnswer {
        dropped: false,
        idle_secs: idle_ms / 1000,
        free_kib_before: free_before,
        free_kib_after: free_before,
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

/// MemFree, KiB (0 when /proc is unreadable).
fn free_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .map(|m| super::sysinfo::meminfo_kib(&m, "MemFree"))
        .unwrap_or(0)
}
