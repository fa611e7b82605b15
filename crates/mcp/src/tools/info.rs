//! Information tools: images, host checks, the runtime contract, cost
//! estimates. None changes anything.

use std::collections::BTreeMap;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::guest::MAX_EVENT_WAIT;
use workspace::host::doctor::Report;
use workspace::ListFilter;
use workspace::{store::spec::defaults, LIMITS};

use super::{in_range, vcpus};
use crate::output::{Out, ToolResult};
use crate::schema::exec::{DEFAULT_OUTPUT_CAP, MAX_OUTPUT_CAP};
use crate::schema::files::{DEFAULT_READ_LENGTH, MAX_READ_LENGTH, MAX_WRITE_BYTES};
use crate::schema::info::*;
use crate::schema::lifecycle::MAX_START_TIMEOUT_SECS;
use crate::schema::NoParams;
use crate::MicroagentServer;

/// Most workspaces `estimate_cost` prices at once.
pub const MAX_COST_COUNT: u64 = 10_000;

/// The contract tool's document, for a server with `grants`.
pub fn contract(grants: &crate::Grants) -> ContractResult {
    ContractResult {
        grants: grants
            .listing()
            .into_iter()
            .map(|(flag, granted, allows)| McpGrant {
                flag: flag.into(),
                granted,
                allows: allows.into(),
            })
            .collect(),
        contract: workspace::contract(),
        mcp: McpLimits {
            default_output_cap: DEFAULT_OUTPUT_CAP,
            max_output_cap: MAX_OUTPUT_CAP,
            default_read_length: DEFAULT_READ_LENGTH,
            max_read_length: MAX_READ_LENGTH,
            max_write_bytes: MAX_WRITE_BYTES as u64,
            max_event_wait_secs: MAX_EVENT_WAIT.as_secs(),
            max_start_timeout_secs: MAX_START_TIMEOUT_SECS,
        },
        transports: transports(),
    }
}

/// stdio and Streamable HTTP, with the versions rmcp negotiates.
fn transports() -> Vec<McpTransport> {
    let versions: Vec<String> = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(|v| v.to_string())
        .collect();
    vec![
        McpTransport {
            name: "stdio".into(),
            protocol_versions: versions.clone(),
            auth: "none: the client starts the server".into(),
        },
        McpTransport {
            name: "streamable-http".into(),
            protocol_versions: versions,
            auth: "bearer token (none with --dev, loopback only)".into(),
        },
    ]
}

#[tool_router(router = info_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// List the guest kernels: the built ones (version, size, which variant
    /// this host boots) and those only imported images carry, with the
    /// images that use each.
    #[tool(
        output_schema = crate::output::schema::<KernelListResult>(),
        annotations(
        title = "List guest kernels",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn kernel_list(
        &self,
        Parameters(_): Parameters<NoParams>,
    ) -> ToolResult<KernelListResult> {
        let kernels = self
            .blocking(|ws| {
                Ok(workspace::images::kernels::list(ws.image_registry())
                    .map_err(workspace::Error::from)?)
            })
            .await?;
        Ok(Out(KernelListResult { kernels }))
    }

    /// List the images workspaces can be created from, with the workspaces
    /// that use each.
    #[tool(
        output_schema = crate::output::schema::<ImageListResult>(),
        annotations(
        title = "List images",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn image_list(&self, Parameters(_): Parameters<NoParams>) -> ToolResult<ImageListResult> {
        let images = self
            .blocking(|ws| {
                let images = ws.image_registry().list().map_err(workspace::Error::from)?;
                let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for meta in ws.list(&ListFilter::default())? {
                    users.entry(meta.spec.image).or_default().push(meta.name);
                }
                Ok(images
                    .into_iter()
                    .map(|image| {
                        let used_by = users.remove(&image.name).unwrap_or_default();
                        ImageEntry { image, used_by }
                    })
                    .collect())
            })
            .await?;
        Ok(Out(ImageListResult { images }))
    }

    /// Check that this host can run workspaces: KVM, its speed, guest
    /// kernel and images, state directory, free disk; with what to do
    /// about each problem.
    #[tool(
        output_schema = crate::output::schema::<Report>(),
        annotations(
        title = "Check the host",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn host_doctor(&self, Parameters(_): Parameters<NoParams>) -> ToolResult<Report> {
        let report = self
            .blocking(|ws| Ok(Report::check_host(ws.state_dir(), ws.assets())))
            .await?;
        Ok(Out(report))
    }

    /// The runtime contract: workspace states and transitions, every error
    /// code, input limits and defaults, and the limits of these tools.
    #[tool(
        output_schema = crate::output::schema::<ContractResult>(),
        annotations(
        title = "Runtime contract",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn contract(&self, Parameters(_): Parameters<NoParams>) -> ToolResult<ContractResult> {
        Ok(Out(contract(&self.grants)))
    }

    /// What one workspace (`name`) or every workspace uses now: state,
    /// vCPUs, guest CPU % over a 1 s sample (0 to 100 x vCPUs), guest
    /// memory used/total, the VMM's resident memory on the host, disk used
    /// in the guest and allocated on the host, uptime, network bytes.
    /// Guest figures are null while a workspace is not running.
    #[tool(
        output_schema = crate::output::schema::<MetricsResult>(),
        annotations(
        title = "Workspace metrics",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn workspace_metrics(
        &self,
        Parameters(p): Parameters<MetricsParams>,
    ) -> ToolResult<MetricsResult> {
        // A workspace on a server is measured there by its handle.
        let workspaces = match p.server {
            Some(server) if server != workspace::servers::LOCAL_SERVER => {
                self.ws
                    .server_pool()
                    .metrics_on_server(&server, p.name.as_deref())
                    .await?
            }
            _ => {
                crate::tools::seen_from(&self.ws, p.namespace.as_deref())?
                    .metrics()
                    .figures(p.name.as_deref())
                    .await?
            }
        };
        Ok(Out(MetricsResult { workspaces }))
    }

    /// Estimate what workspaces cost: vCPU-hours and GiB-hours of memory
    /// for a spec, a duration and a count, priced by the table in
    /// $MICROAGENT_HOME/config.json (key "price") or the defaults (0.04 per
    /// vCPU-hour, 0.005 per GiB-hour). Pure computation: nothing is
    /// started.
    #[tool(
        output_schema = crate::output::schema::<CostResult>(),
        annotations(
        title = "Estimate cost",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn estimate_cost(
        &self,
        Parameters(p): Parameters<EstimateCostParams>,
    ) -> ToolResult<CostResult> {
        let vcpus = vcpus(p.vcpus, defaults::VCPUS)?;
        in_range("vcpus", vcpus.into(), 1, LIMITS.max_vcpus.into())?;
        let mem_mib = in_range(
            "mem_mib",
            p.mem_mib.unwrap_or(defaults::MEM_MIB),
            LIMITS.min_mem_mib,
            LIMITS.max_mem_mib,
        )?;
        let secs = in_range(
            "duration_secs",
            p.duration_secs,
            1,
            crate::schema::info::MAX_COST_SECS,
        )?;
        let count = in_range("count", p.count.unwrap_or(1), 1, MAX_COST_COUNT)?;
        let (price, source) = workspace::host::cost::load(self.ws.state_dir().root())?;
        let e = workspace::host::cost::estimate(&price, vcpus.into(), mem_mib, secs, count);
        Ok(Out(CostResult {
            vcpus: vcpus.into(),
            mem_mib,
            duration_secs: secs,
            count,
            vcpu_hours: e.vcpu_hours,
            gib_hours: e.gib_hours,
            price,
            price_source: source.map_or_else(|| "defaults".into(), |p| p.display().to_string()),
            vcpu_cost: e.vcpu_cost,
            memory_cost: e.memory_cost,
            total: e.total,
        }))
    }
}
