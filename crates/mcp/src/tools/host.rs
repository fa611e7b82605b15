//! Host tools: the host changes, each preview-then-confirm
//! (kernel_install, image_build), and the servers workspaces can go on
//! (server_list, server_status).

use std::sync::{Arc, Mutex};

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::images::build::{BuildBase, CopyStep, ImageBuild, ImageBuildRequest};
use workspace::kernels::{KernelInstall, KernelSource};

use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::host::*;
use crate::MicroagentServer;
use workspace::servers::ServerReport;

/// The newest step a long host change reported, for progress messages.
fn step_tracker(first: &str) -> (Arc<Mutex<String>>, workspace::host::plan::ProgressFn) {
    let status = Arc::new(Mutex::new(first.to_owned()));
    let latest = status.clone();
    let progress = Arc::new(move |step: &str| {
        if let Ok(mut s) = latest.lock() {
            *s = step.to_owned();
        }
    });
    (status, progress)
}

#[tool_router(router = host_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Install the guest kernel this host needs: build it from Debian's
    /// kernel source (several minutes; installs build packages, as root,
    /// when missing), or install a kernel file after checking it boots the
    /// `minimal` image. Called without `confirm` it changes nothing and
    /// returns the exact plan (packages, disk, time, files written) and a
    /// token; called with that token (once) it applies the plan, sending
    /// progress when asked. Applying needs a server started with
    /// --allow-host-changes (FORBIDDEN otherwise).
    #[tool(
        output_schema = crate::output::schema::<KernelInstall>(),
        annotations(
        title = "Install a guest kernel",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    )
    )]
    async fn kernel_install(
        &self,
        Parameters(p): Parameters<KernelInstallParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<KernelInstall> {
        self.grants
            .check_host_change(p.confirm.is_some(), "kernel_install", "kernel install")?;
        let source = match &p.file {
            Some(f) => KernelSource::File(self.host_roots.existing(f)?),
            None => KernelSource::FromSource,
        };
        let (status, steps) = step_tracker("planning");
        let mut progress = Progress::new(&ctx);
        let done = progress
            .drive(
                self.ws.kernels().install(
                    &source,
                    p.variant.map(VariantParam::variant),
                    p.confirm.as_deref(),
                    steps,
                ),
                |_| status.lock().map(|s| s.clone()).unwrap_or_default(),
            )
            .await?;
        Ok(Out(done))
    }

    /// Build an image: from Debian packages (`from: "debian:bookworm"`, by
    /// mmdebstrap; the server must run as root) or on top of an image (it
    /// boots in a throwaway workspace; `copy` files go in, `run` commands
    /// run as root, then its root filesystem is saved as the new image).
    /// Called without `confirm` it changes nothing and returns the plan and
    /// a token; with the token (once) it builds, sending progress when
    /// asked. Applying a `debian:*` build needs a server started with
    /// --allow-host-changes (FORBIDDEN otherwise).
    /// Nothing is registered when a step fails (INVALID_INPUT with the
    /// step's stderr).
    #[tool(
        output_schema = crate::output::schema::<ImageBuild>(),
        annotations(
        title = "Build an image",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    )
    )]
    async fn image_build(
        &self,
        Parameters(p): Parameters<ImageBuildParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<ImageBuild> {
        let from = BuildBase::parse(&p.from).map_err(workspace::Error::from)?;
        if matches!(from, BuildBase::Debian(_)) {
            self.grants.check_host_change(
                p.confirm.is_some(),
                "image_build from debian:*",
                &format!("image build {} --from {}", p.name, p.from),
            )?;
        }
        let mut copy = Vec::with_capacity(p.copy.len());
        for c in p.copy {
            copy.push(CopyStep {
                from: self.host_roots.existing(&c.from)?,
                to: c.to,
            });
        }
        let req = ImageBuildRequest {
            name: p.name,
            from: Some(from),
            packages: p.packages,
            run: p.run,
            copy,
            description: p.description,
            vcpus: p.vcpus,
            mem_mib: p.mem_mib,
            min_mem_mib: None,
        };
        let (status, steps) = step_tracker("planning");
        let mut progress = Progress::new(&ctx);
        let done = progress
            .drive(
                self.ws.images().build(&req, p.confirm.as_deref(), steps),
                |_| status.lock().map(|s| s.clone()).unwrap_or_default(),
            )
            .await?;
        Ok(Out(done))
    }

    /// Every server workspaces can go on: this host (`local`) and those
    /// added with `microagent server add`, each with its health (ssh, kvm,
    /// microagent version, doctor) and resources (CPUs, CPU used, memory,
    /// disk, running workspaces, an available score). An unreachable one
    /// is `offline` with the reason.
    #[tool(
        output_schema = crate::output::schema::<ServerList>(),
        annotations(
        title = "List servers",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn server_list(
        &self,
        Parameters(_): Parameters<ServerListParams>,
    ) -> ToolResult<ServerList> {
        let servers = self.workspaces().server_pool().server_reports().await?;
        Ok(Out(ServerList {
            servers: servers.into_iter().map(|r| r.server).collect(),
        }))
    }

    /// One server's health, resources and workspaces (name, state, image,
    /// vCPUs, memory, and what each uses now: CPU, memory, disk, network,
    /// sampled there within 10 s).
    #[tool(
        output_schema = crate::output::schema::<ServerReport>(),
        annotations(
        title = "Show a server",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn server_status(
        &self,
        Parameters(p): Parameters<ServerStatusParams>,
    ) -> ToolResult<ServerReport> {
        Ok(Out(self
            .workspaces()
            .server_pool()
            .server_report(&p.name, true)
            .await?))
    }
}
