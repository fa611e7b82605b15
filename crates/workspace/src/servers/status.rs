//! A server's health and resources, and how they are measured. Each host
//! measures its own (`Workspaces::server_report`); a remote server is asked
//! over SSH for its own report, so both have one shape.
//! An unreachable server is `offline` with no resources; one whose
//! microagent differs in major or minor version is `degraded`.

use serde::{Deserialize, Serialize};

use super::spec::ServerSpec;
use crate::host::budget::HostBudget;

/// The microagent version this build is.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Whether a server can take work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    /// Reached, and its microagent matches ours.
    Online,
    /// Reached, with a problem (`reason`): another microagent version.
    Degraded,
    /// Not reached (`reason` says why).
    Offline,
}

/// What works on a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Health {
    /// Reached over SSH (always true for `local`).
    pub ssh: bool,
    /// /dev/kvm can be opened.
    pub kvm: bool,
    /// Its microagent's version.
    pub microagent: String,
    /// Its `doctor` verdict: `ok`, `warn` or `fail`.
    pub doctor: String,
}

/// What a server has and uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Resources {
    /// CPUs online.
    pub total_cpus: u32,
    /// CPU in use over a short sample, percent of all CPUs.
    pub cpu_used_percent: f64,
    /// Memory.
    pub total_memory_bytes: u64,
    /// Memory in use (total less what is available).
    pub used_memory_bytes: u64,
    /// The state directory's filesystem.
    pub total_disk_bytes: u64,
    /// Of which used.
    pub used_disk_bytes: u64,
    /// Workspaces running.
    pub running_workspaces: u32,
    /// 0-100: how much room it has for one more workspace: the least of
    /// its free memory, its free disk and its host budget's room, halved
    /// when its CPUs are all busy (0 when its budget lets nothing more run).
    pub available_score: u32,
}

/// A server's status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ServerStatus {
    /// The server.
    pub name: String,
    /// The machine: this host's name for `local`, the `HOST` of a
    /// server's `USER@HOST[:PORT]` (devbox's `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Online, degraded or offline.
    pub status: Availability,
    /// Why it is degraded or offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its health (none when offline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// Its resources (none when offline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// One workspace of a server, as `server status` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WorkspaceUsage {
    /// Its name there.
    pub name: String,
    /// Its state.
    pub state: String,
    /// Its image.
    pub image: String,
    /// Its vCPUs.
    pub vcpus: u8,
    /// Its guest memory, MiB.
    pub mem_mib: u64,
    /// What it uses now (`server status` of one server; none in the
    /// reports a placement reads, and for a workspace this view may not
    /// use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<WorkspaceFigures>,
}

/// A workspace's figures in a server's report: guest CPU, memory, disk
/// and network, as `workspace_metrics` measures them (null where the guest
/// did not answer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WorkspaceFigures {
    /// Guest CPU busy over the sample, percent of one CPU.
    pub cpu_percent: Option<f64>,
    /// Guest memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Resident memory of its VMM on the host, bytes.
    pub host_rss_bytes: Option<u64>,
    /// Bytes used on the guest's root filesystem.
    pub disk_used_bytes: Option<u64>,
    /// Host bytes its writable disk takes.
    pub disk_allocated_bytes: u64,
    /// Bytes its guest received.
    pub net_rx_bytes: Option<u64>,
    /// Bytes its guest sent.
    pub net_tx_bytes: Option<u64>,
}

/// `server status`: a server and its workspaces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ServerReport {
    /// The server.
    pub server: ServerStatus,
    /// Its workspaces (none when offline).
    pub workspaces: Vec<WorkspaceUsage>,
    /// The images registered there (none when offline).
    #[serde(default)]
    pub images: Vec<String>,
}

/// The score, 0-100: the least of free memory, free disk (over the
/// budget's floor) and the budget's room for one more workspace, scaled
/// by CPU from 1 (idle) to 1/2 (all busy): a busy CPU slows a workspace,
/// a full memory or budget refuses it.
pub fn available_score(r: &Resources, budget: &HostBudget, running_mem_mib: u64) -> u32 {
    let fraction = |free: f64, total: f64| {
        if total <= 0.0 {
            0.0
        } else {
            (free / total).clamp(0.0, 1.0)
        }
    };
    let cpu = 1.0 - (r.cpu_used_percent / 100.0).clamp(0.0, 1.0);
    let mem = fraction(
        r.total_memory_bytes.saturating_sub(r.used_memory_bytes) as f64,
        r.total_memory_bytes as f64,
    );
    let floor = budget.min_free_disk_mib << 20;
    let disk = fraction(
        r.total_disk_bytes
            .saturating_sub(r.used_disk_bytes)
            .saturating_sub(floor) as f64,
        r.total_disk_bytes as f64,
    );
    let mut least = mem.min(disk);
    if let Some(max) = budget.max_running {
        least = least.min(fraction(
            f64::from(max) - f64::from(r.running_workspaces),
            f64::from(max.max(1)),
        ));
    }
    if let Some(max) = budget.max_guest_mem_mib {
        least = least.min(fraction(
            max as f64 - running_mem_mib as f64,
            max.max(1) as f64,
        ));
    }
    (least * (0.5 + cpu / 2.0) * 100.0).round() as u32
}

/// Busy and total jiffies of all CPUs, from /proc/stat.
pub(crate) fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle + iowait are not busy.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Total and available memory, bytes, from /proc/meminfo.
pub(crate) fn memory() -> (u64, u64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// Whether versions `a` and `b` agree in major and minor.
pub fn same_minor(a: &str, b: &str) -> bool {
    let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    minor(a) == minor(b)
}

/// The status a remote's own report gives, checked against our version.
pub fn remote_status(spec: &ServerSpec, mut report: ServerReport) -> ServerReport {
    report.server.name = spec.name.clone();
    report.server.host = ssh_host(spec);
    if let Some(health) = &report.server.health {
        if !same_minor(&health.microagent, VERSION) {
            report.server.status = Availability::Degraded;
            report.server.reason = Some(format!(
                "it runs microagent {}, this host {VERSION}; install the same version on both",
                health.microagent
            ));
        }
    }
    report
}

/// The machine a server's `USER@HOST[:PORT]` names.
fn ssh_host(spec: &ServerSpec) -> Option<String> {
    super::spec::SshTarget::parse(&spec.ssh)
        .ok()
        .map(|t| t.host)
}

/// This machine's host name.
pub fn this_host() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().to_owned()).filter(|n| !n.is_empty())
}

/// An offline server's report.
pub fn offline(spec: &ServerSpec, reason: String) -> ServerReport {
    ServerReport {
        server: ServerStatus {
            name: spec.name.clone(),
            host: ssh_host(spec),
            status: Availability::Offline,
            reason: Some(reason),
            health: None,
            resources: None,
        },
        workspaces: Vec::new(),
        images: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(cpu: f64, mem_used: u64, running: u32) -> Resources {
        Resources {
            total_cpus: 4,
            cpu_used_percent: cpu,
            total_memory_bytes: 100 << 20,
            used_memory_bytes: mem_used << 20,
            total_disk_bytes: 100 << 30,
            used_disk_bytes: 10 << 30,
            running_workspaces: running,
            available_score: 0,
        }
    }

    #[test]
    fn the_score_is_the_scarcest_resource() {
        let budget = HostBudget::default();
        assert_eq!(available_score(&resources(0.0, 20, 0), &budget, 0), 80);
        assert_eq!(available_score(&resources(100.0, 20, 0), &budget, 0), 40);
        assert_eq!(available_score(&resources(0.0, 95, 0), &budget, 0), 5);
        let full = HostBudget {
            max_running: Some(2),
            ..HostBudget::default()
        };
        assert_eq!(available_score(&resources(0.0, 0, 2), &full, 0), 0);
        assert_eq!(available_score(&resources(0.0, 0, 1), &full, 0), 50);
        let closed = HostBudget {
            max_running: Some(0),
            ..HostBudget::default()
        };
        assert_eq!(available_score(&resources(0.0, 0, 0), &closed, 0), 0);
        let mem = HostBudget {
            max_guest_mem_mib: Some(1024),
            ..HostBudget::default()
        };
        assert_eq!(available_score(&resources(0.0, 0, 1), &mem, 768), 25);
    }

    #[test]
    fn versions_match_by_major_and_minor() {
        assert!(same_minor("0.4.1", "0.4.9"));
        assert!(!same_minor("0.4.1", "0.5.0"));
        assert!(!same_minor("1.4.1", "0.4.1"));
    }

    #[test]
    fn this_host_is_measured() {
        let (busy, total) = cpu_times().unwrap();
        assert!(total >= busy && total > 0);
        let (mem_total, available) = memory();
        assert!(mem_total > 0 && available <= mem_total);
        let (disk_total, free) =
            base::host::settings::disk_bytes(std::path::Path::new("/")).unwrap();
        assert!(disk_total > 0 && free <= disk_total);
    }
}
