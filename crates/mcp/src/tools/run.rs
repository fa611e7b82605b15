//! `run`: a command in a one-shot workspace (created, started, used,
//! deleted; with a TTL, so a killed client leaves nothing running long).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::{ExecRequest, OneShot, WorkspaceSpec};

use super::exec::{command_request, input, limits};
use super::{guest_path, seconds};
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::exec::*;
use crate::schema::lifecycle::{DEFAULT_START_TIMEOUT_SECS, MAX_START_TIMEOUT_SECS};
use crate::{MicroagentServer, ToolError};

/// Most files `run` writes first.
pub const MAX_RUN_FILES: usize = 16;
/// Most bytes of them in all.
pub const MAX_RUN_FILE_BYTES: usize = 1 << 20;

fn request(p: &RunParams) -> Result<ExecRequest, ToolError> {
    let req = command_request(p.command.clone(), p.shell.clone())?;
    Ok(p.env
        .iter()
        .fold(req, |r, (k, v)| r.env(k.clone(), v.clone()))
        .secrets(p.secrets.iter().cloned()))
}

fn check_files(files: &[RunFile]) -> Result<(), ToolError> {
    if files.len() > MAX_RUN_FILES {
        return Err(ToolError::InvalidInput(format!(
            "{} files; at most {MAX_RUN_FILES}",
            files.len()
        )));
    }
    let total: usize = files.iter().map(|f| f.content.len()).sum();
    if total > MAX_RUN_FILE_BYTES {
        return Err(ToolError::InvalidInput(format!(
            "the files hold {total} bytes; at most {MAX_RUN_FILE_BYTES} in all (copy larger ones in with copy_in)"
        )));
    }
    for f in files {
        guest_path("files[].path", &f.path)?;
    }
    Ok(())
}

#[tool_router(router = run_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Run a command in a fresh one-shot workspace: created (image
    /// `minimal` unless given), started, files written, the command run,
    /// then deleted whatever happened. It carries a TTL of 1 h. Progress
    /// is reported while it boots and runs.
    #[tool(
        output_schema = crate::output::schema::<RunResult>(),
        annotations(
        title = "Run a command in a one-shot workspace",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn run(
        &self,
        Parameters(p): Parameters<RunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<RunResult> {
        self.grants.check_egress_rules(&p.allow)?;
        let limits = limits(p.timeout_secs, p.output_cap)?;
        let start_timeout = seconds(
            "start_timeout_secs",
            p.start_timeout_secs,
            DEFAULT_START_TIMEOUT_SECS,
            MAX_START_TIMEOUT_SECS,
        )?;
        self.grants.check_secrets(&p.secrets)?;
        let req = request(&p)?;
        check_files(&p.files)?;
        // An unknown secret fails before a workspace is made for nothing.
        self.ws
            .secrets()
            .require(&p.secrets)
            .map_err(workspace::Error::from)?;
        workspace::guest::check_patterns(&p.outputs)?;
        let image = self.image_for(p.image.as_deref(), p.pull, &ctx).await?;
        let spec = WorkspaceSpec {
            image,
            network: p
                .network
                .clone()
                .unwrap_or_else(|| workspace::store::name::DEFAULT_NETWORK.into()),
            egress: p.egress,
            allow: p.allow.clone(),
            volumes: crate::schema::volumes::mounts(&p.volumes),
            ..WorkspaceSpec::default()
        };
        spec.validate()?;
        let mut progress = Progress::new(&ctx);
        let progress = &tokio::sync::Mutex::new(&mut progress);
        let (ctx, limits, files) = (&ctx, &limits, &p.files);
        let end = self
            .ws
            .run_once(
                &OneShot::new("run", spec),
                |name| async move {
                    let mut progress = progress.lock().await;
                    self.start_workspace(&name, false, start_timeout, ctx, &mut progress)
                        .await
                        .map(|_| true)
                },
                |name| async move {
                    for f in files {
                        self.ws
                            .workspace(&name)?
                            .files()
                            .write_file(
                                &f.path,
                                f.content.as_bytes(),
                                workspace::WriteOptions {
                                    append: false,
                                    perm: None,
                                },
                            )
                            .await?;
                    }
                    let mut progress = progress.lock().await;
                    let reply = self
                        .run_command(&name, req, input(p.stdin), limits, ctx, &mut progress)
                        .await?;
                    // Before the one-shot workspace goes.
                    self.bring_outputs(&name, &p.outputs, reply, &ctx.ct).await
                },
            )
            .await?;
        if let Err(e) = end.cleanup {
            tracing::warn!(name = %end.workspace, %e, "deleting run's one-shot workspace failed");
        }
        let result = end.outcome?.ok_or_else(|| {
            ToolError::Cancelled(format!("workspace {} did not start", end.workspace))
        })?;
        Ok(Out(RunResult {
            workspace: end.workspace,
            result,
        }))
    }
}
