//! Inputs and outputs of the information tools: `image_list`,
//! `host_doctor`, `contract`, `estimate_cost`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::doctor::{Report, Status};
use workspace::image::ImageInfo;

use super::StateName;
use crate::cost::PriceTable;
use crate::output::{bytes, Render};

/// One registered image.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageView {
    /// Its name (pass it as `image` to `workspace_create`).
    pub name: String,
    /// The guest kernel file.
    pub kernel: PathBuf,
    /// The root filesystem file (attached read-only).
    pub rootfs: PathBuf,
    /// Kernel bytes.
    pub kernel_bytes: u64,
    /// Root filesystem bytes.
    pub rootfs_bytes: u64,
    /// Unix milliseconds of the import.
    pub imported_at_ms: u64,
    /// Where it was imported from.
    pub source: PathBuf,
    /// The build manifest, when it had one.
    pub manifest: Option<serde_json::Value>,
    /// Workspaces that use it.
    pub used_by: Vec<String>,
}

impl ImageView {
    /// The view of `info`, used by `used_by`.
    pub fn new(info: ImageInfo, used_by: Vec<String>) -> Self {
        Self {
            name: info.name,
            kernel: info.kernel,
            rootfs: info.rootfs,
            kernel_bytes: info.kernel_bytes,
            rootfs_bytes: info.rootfs_bytes,
            imported_at_ms: info.imported_at_ms,
            source: info.source,
            manifest: info.manifest,
            used_by,
        }
    }
}

/// `image_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageListResult {
    /// Every registered image (built images are registered on first use).
    pub images: Vec<ImageView>,
}

impl Render for ImageListResult {
    fn render(&self) -> String {
        if self.images.is_empty() {
            return "no images; build them with `cargo xtask setup`".into();
        }
        self.images
            .iter()
            .map(|i| {
                format!(
                    "{}: root filesystem {}, used by {}",
                    i.name,
                    bytes(i.rootfs_bytes),
                    if i.used_by.is_empty() {
                        "no workspace".into()
                    } else {
                        i.used_by.join(", ")
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One host check.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckView {
    /// Stable check name.
    pub name: String,
    /// ok, warn or fail.
    pub status: String,
    /// What was found.
    pub detail: String,
    /// What to do (for warn and fail).
    pub fix: Option<String>,
}

/// `host_doctor`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DoctorResult {
    /// The worst check status: ok, warn or fail (workspaces cannot run).
    pub status: String,
    /// The checks, in order.
    pub checks: Vec<CheckView>,
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Warn => "warn",
        Status::Fail => "fail",
    }
}

impl From<Report> for DoctorResult {
    fn from(r: Report) -> Self {
        Self {
            status: status_name(r.status).into(),
            checks: r
                .checks
                .into_iter()
                .map(|c| CheckView {
                    name: c.name.into(),
                    status: status_name(c.status).into(),
                    detail: c.detail,
                    fix: c.fix,
                })
                .collect(),
        }
    }
}

impl Render for DoctorResult {
    fn render(&self) -> String {
        let mut text = format!("host: {}", self.status);
        for c in &self.checks {
            text.push_str(&format!("\n{:<4}  {:<13} {}", c.status, c.name, c.detail));
            if let Some(fix) = &c.fix {
                text.push_str(&format!("\n      {:<13} -> {fix}", ""));
            }
        }
        text
    }
}

/// One state of the contract.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateEntry {
    /// The state.
    pub state: StateName,
    /// Whether a VMM process runs in it.
    pub has_vmm: bool,
}

/// Input limits.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsView {
    /// Most vCPUs.
    pub max_vcpus: u8,
    /// Least guest memory, MiB.
    pub min_mem_mib: u64,
    /// Most guest memory, MiB.
    pub max_mem_mib: u64,
    /// Least writable disk, MiB.
    pub min_disk_mib: u64,
    /// Most writable disk, MiB.
    pub max_disk_mib: u64,
    /// Longest TTL, seconds.
    pub max_ttl_secs: u64,
    /// Most labels or env variables.
    pub max_entries: usize,
}

/// Defaults of `workspace_create`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DefaultsView {
    /// Image.
    pub image: String,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
    /// Writable disk, MiB.
    pub disk_mib: u64,
}

/// The runtime contract, as `microagent contract` prints it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LibraryContract {
    /// Version of the contract format.
    pub contract_version: u32,
    /// microagent's version.
    pub microagent_version: String,
    /// Guest agent protocol version.
    pub agent_protocol_version: u32,
    /// Every workspace state.
    pub states: Vec<StateEntry>,
    /// Legal state changes, as [from, to] pairs.
    pub transitions: Vec<(StateName, StateName)>,
    /// Every stable error code.
    pub error_codes: Vec<String>,
    /// Input limits.
    pub limits: LimitsView,
    /// Defaults of `workspace_create`.
    pub defaults: DefaultsView,
    /// Bytes of console log kept per file (two files).
    pub console_log_cap_bytes: u64,
    /// The agent's vsock port.
    pub agent_vsock_port: u32,
    /// Exit status the CLI's exec/run use when microagent itself failed.
    pub exec_failure_exit_code: u8,
}

/// Limits of the MCP tools themselves.
#[derive(Debug, Serialize, JsonSchema)]
pub struct McpLimits {
    /// Bytes of each output stream exec and run_code return by default.
    pub default_output_cap: u64,
    /// Largest output_cap.
    pub max_output_cap: u64,
    /// Bytes file_read returns by default.
    pub default_read_length: u64,
    /// Largest file_read length.
    pub max_read_length: u64,
    /// Largest file_write content, bytes.
    pub max_write_bytes: u64,
    /// Longest workspace_events wait, seconds.
    pub max_event_wait_secs: u64,
    /// Longest workspace_start timeout, seconds.
    pub max_start_timeout_secs: u64,
}

/// `contract`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ContractResult {
    /// The runtime contract of the library.
    #[serde(flatten)]
    pub contract: LibraryContract,
    /// Limits of the MCP tools.
    pub mcp: McpLimits,
}

impl Render for ContractResult {
    fn render(&self) -> String {
        let c = &self.contract;
        format!(
            "microagent {} (contract {}, agent protocol {}); error codes: {}; limits: 1-{} vCPUs, {}-{} MiB memory, {}-{} MiB disk; exec output cap {} per stream by default, at most {}",
            c.microagent_version,
            c.contract_version,
            c.agent_protocol_version,
            c.error_codes.join(", "),
            c.limits.max_vcpus,
            c.limits.min_mem_mib,
            c.limits.max_mem_mib,
            c.limits.min_disk_mib,
            c.limits.max_disk_mib,
            bytes(self.mcp.default_output_cap),
            bytes(self.mcp.max_output_cap),
        )
    }
}

/// `estimate_cost`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EstimateCostParams {
    /// How long the workspaces run, in seconds (1 to 31536000).
    pub duration_secs: u64,
    /// vCPUs per workspace, 1 to 8; default 1.
    pub vcpus: Option<u32>,
    /// Guest memory per workspace in MiB, 64 to 16384; default 256.
    pub mem_mib: Option<u64>,
    /// How many such workspaces, 1 to 10000; default 1.
    pub count: Option<u64>,
}

/// `estimate_cost`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CostResult {
    /// vCPUs per workspace.
    pub vcpus: u32,
    /// Guest memory per workspace, MiB.
    pub mem_mib: u64,
    /// Seconds each runs.
    pub duration_secs: u64,
    /// Workspaces.
    pub count: u64,
    /// vCPUs x hours x count.
    pub vcpu_hours: f64,
    /// GiB of memory x hours x count.
    pub gib_hours: f64,
    /// The prices used.
    pub price: PriceTable,
    /// Where the prices came from: the config file, or "defaults".
    pub price_source: String,
    /// Price of the vCPU-hours.
    pub vcpu_cost: f64,
    /// Price of the GiB-hours.
    pub memory_cost: f64,
    /// vcpu_cost + memory_cost.
    pub total: f64,
}

impl Render for CostResult {
    fn render(&self) -> String {
        format!(
            "{} x {} vCPU / {} MiB for {} s: {:.4} vCPU-h ({:.4} {}) + {:.4} GiB-h ({:.4} {}) = {:.4} {} (prices from {})",
            self.count,
            self.vcpus,
            self.mem_mib,
            self.duration_secs,
            self.vcpu_hours,
            self.vcpu_cost,
            self.price.currency,
            self.gib_hours,
            self.memory_cost,
            self.price.currency,
            self.total,
            self.price.currency,
            self.price_source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_contract_round_trips_exactly() {
        let original = serde_json::to_value(workspace::contract::contract()).unwrap();
        let mirrored: LibraryContract = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(serde_json::to_value(mirrored).unwrap(), original);
    }
}
