//! What a workspace uses now: guest figures from its agent (`info`, read
//! twice a moment apart for the CPU usage in between), host figures from
//! /proc and the disk file.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use guest_agent::protocol::{CpuTicks, SystemInfo};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::workspaces::manager::ListFilter;
use crate::workspaces::services::Metrics;
use base::store::spec::Meta;
use base::store::state::State;

/// How long the guest's CPU usage is measured over.
pub const CPU_SAMPLE: Duration = Duration::from_secs(1);

/// One workspace's figures; the guest's are null when it does not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WorkspaceMetrics {
    /// The workspace.
    pub name: String,
    /// Where it is in its life.
    pub state: State,
    /// Virtual CPUs.
    pub vcpus: u8,
    /// Seconds since the guest booted.
    pub uptime_secs: Option<u64>,
    /// Guest CPU busy over the sample, in percent of one CPU (0 to 100 x
    /// vCPUs).
    pub cpu_percent: Option<f64>,
    /// Guest memory in use (total minus available), bytes.
    pub memory_used_bytes: Option<u64>,
    /// Guest memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Resident memory of its VMM process on the host, bytes.
    pub host_rss_bytes: Option<u64>,
    /// Bytes used on the guest's root filesystem.
    pub disk_used_bytes: Option<u64>,
    /// Size of the writable disk as the guest sees it, bytes.
    pub disk_size_bytes: u64,
    /// Host bytes allocated to the writable disk file (it is sparse).
    pub disk_allocated_bytes: u64,
    /// Bytes received by the guest's network interfaces.
    pub net_rx_bytes: Option<u64>,
    /// Bytes sent by the guest's network interfaces.
    pub net_tx_bytes: Option<u64>,
    /// What the memory balloon reports (None when the workspace does not
    /// run, or its machine has no balloon).
    pub balloon: Option<BalloonMetrics>,
}

/// Memory the guest gave back, and its memory as its balloon driver sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct BalloonMetrics {
    /// Free memory the guest reported and the host took back since the VMM
    /// started, bytes (memory freed, reused and freed again counts again).
    pub given_back_bytes: u64,
    /// Reports served.
    pub reports: u64,
    /// Free guest memory, bytes.
    pub guest_free_bytes: Option<u64>,
    /// Guest memory available for new work, bytes.
    pub guest_available_bytes: Option<u64>,
    /// The guest's page cache (dropped when it sits idle), bytes.
    pub guest_cache_bytes: Option<u64>,
}

impl From<vmm_core::devices::virtio::balloon::BalloonFigures> for BalloonMetrics {
    fn from(f: vmm_core::devices::virtio::balloon::BalloonFigures) -> Self {
        let stats = f.stats.unwrap_or_default();
        Self {
            given_back_bytes: f.reported_bytes,
            reports: f.reports,
            guest_free_bytes: stats.free_bytes,
            guest_available_bytes: stats.available_bytes,
            guest_cache_bytes: stats.disk_caches_bytes,
        }
    }
}

/// The balloon's figures from the VMM of a running workspace (None when it
/// has no balloon or does not answer).
fn balloon_of(control: std::path::PathBuf) -> Option<BalloonMetrics> {
    use base::vmm::control::{call, ControlRequest, ControlResponse};
    match call(&control, &ControlRequest::Memory, BALLOON_WAIT) {
        Ok(ControlResponse::Memory { balloon }) => Some(balloon.into()),
        _ => None,
    }
}

/// How long the VMM may take to answer with fresh statistics (it waits up
/// to 2 s for the guest).
const BALLOON_WAIT: Duration = Duration::from_secs(5);

/// Busy share between two samples, in percent of one CPU.
pub(crate) fn cpu_percent(before: CpuTicks, after: CpuTicks, cpus: u32) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 || busy > total {
        return None;
    }
    Some(busy as f64 / total as f64 * 100.0 * f64::from(cpus.max(1)))
}

/// VmRSS of a /proc/PID/status text, in bytes.
pub(crate) fn vm_rss_bytes(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

impl Metrics<'_> {
    /// Figures for workspace `name`, or for every workspace when None. All
    /// running workspaces are sampled over the same [`CPU_SAMPLE`]. For one
    /// named workspace an agent that does not answer is an error; in the
    /// list of all, that workspace's guest figures are null.
    pub async fn figures(self, name: Option<&str>) -> Result<Vec<WorkspaceMetrics>> {
        // One on a server is measured there.
        if let Some(remote) = name.map(|n| self.all.at(n).remote()).transpose()?.flatten() {
            let one = remote
                .call(crate::servers::WorkspaceCall::Metrics {})
                .await?;
            return Ok(vec![one]);
        }
        let metas = match name {
            Some(name) => vec![self.all.at(name).get_here()?],
            None => self.all.list(&ListFilter::default())?,
        };
        let mut all = Vec::with_capacity(metas.len());
        for meta in &metas {
            let mut m = self.host_figures(meta)?;
            if meta.state == State::Running && meta.runtime.is_some() {
                let control = self.all.dir(&meta.name)?.control();
                m.balloon = tokio::task::spawn_blocking(move || balloon_of(control))
                    .await
                    .ok()
                    .flatten();
            }
            all.push(m);
        }
        let mut first = Vec::with_capacity(metas.len());
        for meta in &metas {
            first.push(self.guest_info(meta, name.is_some()).await?);
        }
        if first.iter().any(Option::is_some) {
            tokio::time::sleep(CPU_SAMPLE).await;
        }
        for ((meta, m), before) in metas.iter().zip(&mut all).zip(first) {
            let Some(before) = before else { continue };
            let Some(after) = self.guest_info(meta, name.is_some()).await? else {
                continue;
            };
            m.add_guest(&before, &after);
        }
        Ok(all)
    }

    /// The figures the host knows.
    fn host_figures(self, meta: &Meta) -> Result<WorkspaceMetrics> {
        let ws = self.all.dir(&meta.name)?;
        let disk = std::fs::metadata(ws.disk()).map_err(Error::host_io(format!(
            "reading the size of {}",
            ws.disk().display()
        )))?;
        let host_rss_bytes = match (meta.state, &meta.runtime) {
            (State::Running, Some(r)) => std::fs::read_to_string(format!("/proc/{}/status", r.pid))
                .ok()
                .and_then(|status| vm_rss_bytes(&status)),
            _ => None,
        };
        Ok(WorkspaceMetrics {
            name: meta.name.clone(),
            state: meta.state,
            vcpus: meta.spec.vcpus,
            uptime_secs: None,
            cpu_percent: None,
            memory_used_bytes: None,
            memory_total_bytes: None,
            host_rss_bytes,
            disk_used_bytes: None,
            disk_size_bytes: disk.len(),
            disk_allocated_bytes: disk.blocks() * 512,
            net_rx_bytes: None,
            net_tx_bytes: None,
            balloon: None,
        })
    }

    /// The agent's `info` of a running workspace (None when it is not
    /// running, or when it fails and `strict` is false).
    async fn guest_info(self, meta: &Meta, strict: bool) -> Result<Option<SystemInfo>> {
        if meta.state != State::Running {
            return Ok(None);
        }
        let info = match self.all.at(&meta.name).agent().await {
            Ok(client) => client.info().await.map_err(Error::agent("info")),
            Err(e) => Err(e),
        };
        match info {
            Ok(info) => Ok(Some(info)),
            Err(e) if strict => Err(e),
            Err(_) => Ok(None),
        }
    }
}

impl WorkspaceMetrics {
    /// The guest's figures from two `info` answers a sample apart.
    fn add_guest(&mut self, before: &SystemInfo, now: &SystemInfo) {
        if let (Some(a), Some(b)) = (before.cpu_ticks, now.cpu_ticks) {
            self.cpu_percent = cpu_percent(a, b, now.cpus);
        }
        self.uptime_secs = Some(now.uptime_s);
        self.memory_total_bytes = Some(now.mem_total_kib * 1024);
        self.memory_used_bytes =
            Some(now.mem_total_kib.saturating_sub(now.mem_available_kib) * 1024);
        self.disk_used_bytes = now
            .disks
            .iter()
            .find(|d| d.mount == "/")
            .map(|d| d.total_bytes.saturating_sub(d.avail_bytes));
        if let Some(net) = now.net {
            self.net_rx_bytes = Some(net.rx_bytes);
            self.net_tx_bytes = Some(net.tx_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_is_busy_share_times_cpus() {
        let a = CpuTicks {
            busy: 10,
            total: 100,
        };
        let b = CpuTicks {
            busy: 60,
            total: 200,
        };
        assert_eq!(cpu_percent(a, b, 2), Some(100.0));
        assert_eq!(cpu_percent(a, a, 1), None);
        assert_eq!(cpu_percent(b, a, 1), None);
    }

    #[test]
    fn vm_rss_reads_kib_as_bytes() {
        let status = "Name:\tmicroagent-vmm\nVmPeak:\t 9 kB\nVmRSS:\t  2048 kB\n";
        assert_eq!(vm_rss_bytes(status), Some(2 << 20));
        assert_eq!(vm_rss_bytes("Name: x\n"), None);
    }
}
