//! Inputs and outputs of the information tools: `image_list`,
//! `host_doctor`, `contract`, `workspace_metrics`, `estimate_cost`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::host::doctor::Report;
use workspace::images::ImageInfo;
use workspace::{guest::WorkspaceMetrics, Contract};

use crate::output::Render;
use workspace::guest::copy::human_bytes;
use workspace::host::cost::PriceTable;

/// One registered image and the workspaces that use it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageEntry {
    /// The image (its `name` is what `workspace_create` takes as `image`).
    #[serde(flatten)]
    pub image: ImageInfo,
    /// Workspaces that use it.
    pub used_by: Vec<String>,
}

/// `kernel_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct KernelListResult {
    /// The built kernels (one per variant) and those only imported images carry.
    pub kernels: Vec<workspace::images::kernels::KernelInfo>,
}

impl Render for KernelListResult {
    fn render(&self) -> String {
        if self.kernels.is_empty() {
            return "no guest kernels; build them on the host with `microagent setup --yes`, or install one with `microagent kernel install`".into();
        }
        self.kernels
            .iter()
            .map(|k| {
                format!(
                    "{} {}: {}{}",
                    k.variant.as_deref().unwrap_or("imported"),
                    k.path.display(),
                    k.version.as_deref().unwrap_or("no version banner"),
                    if k.this_host { " (this host)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `image_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageListResult {
    /// Every registered image (built images are registered on first use).
    pub images: Vec<ImageEntry>,
}

impl Render for ImageListResult {
    fn render(&self) -> String {
        if self.images.is_empty() {
            return "no images; build minimal and debian on the host with `microagent setup --yes`, or pull one (the image_pull tool)".into();
        }
        self.images
            .iter()
            .map(|i| {
                format!(
                    "{}: root filesystem {}, used by {}",
                    i.image.name,
                    human_bytes(i.image.rootfs_bytes),
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

// `host_doctor`'s result.
impl Render for Report {
    fn render(&self) -> String {
        let mut text = format!("host: {}", self.status.as_str());
        for c in &self.checks {
            let status = c.status.as_str();
            text.push_str(&format!("\n{status:<4}  {:<13} {}", c.name, c.detail));
            if let Some(fix) = &c.fix {
                text.push_str(&format!("\n      {:<13} -> {fix}", ""));
            }
        }
        text
    }
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
    /// The runtime contract of the library, as `microagent contract`
    /// prints it.
    #[serde(flatten)]
    pub contract: Contract,
    /// Limits of the MCP tools.
    pub mcp: McpLimits,
    /// How the server can be reached, and the MCP versions it speaks.
    pub transports: Vec<McpTransport>,
    /// What the human who started the server allowed beyond the defaults
    /// (`serve mcp --allow-*`): without a grant, its tools answer FORBIDDEN.
    pub grants: Vec<McpGrant>,
}

/// One grant `serve mcp` can be started with.
#[derive(Debug, Serialize, JsonSchema)]
pub struct McpGrant {
    /// The flag: `--allow-host-egress`, ...
    pub flag: String,
    /// Whether this server was started with it.
    pub granted: bool,
    /// What it lets tools do.
    pub allows: String,
}

/// One way to reach the MCP server.
#[derive(Debug, Serialize, JsonSchema)]
pub struct McpTransport {
    /// `stdio` (`serve mcp`) or `streamable-http` (`serve mcp --http`).
    pub name: String,
    /// MCP protocol versions it negotiates.
    pub protocol_versions: Vec<String>,
    /// How a client proves itself.
    pub auth: String,
}

impl Render for ContractResult {
    fn render(&self) -> String {
        let c = &self.contract;
        format!(
            "microagent {} (contract {}, agent protocol {}); error codes: {}; limits: 1-{} vCPUs, {}-{} MiB memory, {}-{} MiB disk; exec output cap {} per stream by default, at most {}; MCP over {}",
            c.microagent_version,
            c.contract_version,
            c.agent_protocol_version,
            c.error_codes
                .iter()
                .map(|code| code.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            c.limits.max_vcpus,
            c.limits.min_mem_mib,
            c.limits.max_mem_mib,
            c.limits.min_disk_mib,
            c.limits.max_disk_mib,
            human_bytes(self.mcp.default_output_cap),
            human_bytes(self.mcp.max_output_cap),
            self.transports
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(" and "),
        )
    }
}

/// Longest duration `estimate_cost` prices: a year.
pub const MAX_COST_SECS: u64 = 365 * 24 * 3600;

/// `estimate_cost`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EstimateCostParams {
    /// How long the workspaces run, in seconds (1 to 31536000).
    #[schemars(range(min = 1, max = MAX_COST_SECS))]
    pub duration_secs: u64,
    /// vCPUs per workspace, 1 to 8; default 1.
    #[schemars(range(min = 1, max = workspace::LIMITS.max_vcpus))]
    pub vcpus: Option<u32>,
    /// Guest memory per workspace in MiB, 64 to 16384, or with a unit
    /// (`"1g"`); default 256.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub mem_mib: Option<u64>,
    /// How many such workspaces, 1 to 10000; default 1.
    #[schemars(range(min = 1, max = 10000))]
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

/// `workspace_metrics`'s input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MetricsParams {
    /// The workspace; every workspace when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Without `name`, the namespace measured (default: the session's);
    /// `*` measures every namespace (as microsandbox's
    /// `sandbox_get_metrics` takes it).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The server whose workspaces these are (see `server_list`; default
    /// this host, or the server `name` lives on).
    #[serde(default)]
    pub server: Option<String>,
}

/// `workspace_metrics`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MetricsResult {
    /// One entry per workspace, by name.
    pub workspaces: Vec<WorkspaceMetrics>,
}

impl Render for MetricsResult {
    fn render(&self) -> String {
        if self.workspaces.is_empty() {
            return "no workspaces".into();
        }
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), human_bytes);
        self.workspaces
            .iter()
            .map(|m| {
                let cpu = m
                    .cpu_percent
                    .map_or_else(|| "-".to_owned(), |c| format!("{c:.0}%"));
                format!(
                    "{}: {}, {} vCPU, cpu {cpu}, memory {}/{}, host rss {}, given back {}, cache {}, disk {} used, {} allocated of {}",
                    m.name,
                    m.state.as_str(),
                    m.vcpus,
                    opt(m.memory_used_bytes),
                    opt(m.memory_total_bytes),
                    opt(m.host_rss_bytes),
                    opt(m.balloon.map(|b| b.given_back_bytes)),
                    opt(m.balloon.and_then(|b| b.guest_cache_bytes)),
                    opt(m.disk_used_bytes),
                    human_bytes(m.disk_allocated_bytes),
                    human_bytes(m.disk_size_bytes),
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
