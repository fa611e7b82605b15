//! `Stats`: a workspace's metrics in the shape containerd reads from a
//! cgroup v1 (`io.containerd.cgroups.v1.Metrics`): memory in use and the
//! guest's size as its limit, the guest's page cache, the VMM process's
//! CPU time (every vCPU runs in it), and the network counters.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, NetworkStat,
};
use workspace::guest::WorkspaceMetrics;

/// The cgroup-shaped metrics of `m`, with `cpu_ns` the VMM's CPU time.
pub fn metrics(m: &WorkspaceMetrics, cpu_ns: Option<u64>) -> Metrics {
    let mut out = Metrics::new();
    let mut memory = MemoryStat::new();
    let mut usage = MemoryEntry::new();
    usage.usage = m.memory_used_bytes.unwrap_or(0);
    usage.limit = m.memory_total_bytes.unwrap_or(0);
    memory.usage = Some(usage).into();
    if let Some(cache) = m.balloon.and_then(|b| b.guest_cache_bytes) {
        memory.cache = cache;
        memory.total_cache = cache;
    }
    out.memory = Some(memory).into();
    if let Some(total) = cpu_ns {
        let mut cpu = CPUStat::new();
        let mut usage = CPUUsage::new();
        usage.total = total;
        cpu.usage = Some(usage).into();
        out.cpu = Some(cpu).into();
    }
    if m.net_rx_bytes.is_some() || m.net_tx_bytes.is_some() {
        let mut net = NetworkStat::new();
        net.name = "eth0".into();
        net.rx_bytes = m.net_rx_bytes.unwrap_or(0);
        net.tx_bytes = m.net_tx_bytes.unwrap_or(0);
        out.network.push(net);
    }
    out
}

/// CPU time of process `pid` (user and system), ns; None when it is gone.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted
    // after its closing one (utime and stime are fields 14 and 15).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_sec = u64::try_from(per_sec).ok().filter(|t| *t > 0)?;
    Some(ticks * (1_000_000_000 / per_sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_cpu_time_and_a_missing_one_none() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(process_cpu_ns(std::process::id()).is_some());
        assert_eq!(process_cpu_ns(u32::MAX), None);
    }
}
