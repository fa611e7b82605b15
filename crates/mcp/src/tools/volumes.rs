//! Volume tools: volume_create, volume_list, volume_inspect,
//! volume_delete. A volume's files are reached through a workspace that
//! mounts it (`workspace_create` with `volumes`).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::volumes::VolumeSource;

use super::would_or_did;
use crate::output::{Out, ToolResult};
use crate::schema::volumes::*;
use crate::{MicroagentServer, ToolError};

#[tool_router(router = volumes_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Make a named volume: a persistent ext4 disk that outlives
    /// workspaces, empty or filled from a host directory or tar file.
    /// Mount it with workspace_create's `volumes` (read-write to one
    /// running workspace, read-only to any number).
    #[tool(
        output_schema = crate::output::schema::<VolumeResult>(),
        annotations(
        title = "Create a volume",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn volume_create(
        &self,
        Parameters(p): Parameters<CreateVolumeParams>,
    ) -> ToolResult<VolumeResult> {
        let source = match (&p.from_dir, &p.from_tar) {
            (Some(_), Some(_)) => {
                return Err(ToolError::InvalidInput(
                    "give from_dir or from_tar, not both".into(),
                ))
            }
            (Some(dir), None) => VolumeSource::Dir(self.host_roots.existing(dir)?),
            (None, Some(tar)) => VolumeSource::Tar(self.host_roots.existing(tar)?),
            (None, None) => VolumeSource::Empty,
        };
        let (size, namespace) = (p.size_mib, p.namespace);
        let volume = self
            .on_workspace(&p.name, move |ws, name| {
                super::seen_from(ws, namespace.as_deref())?
                    .volumes()
                    .create(name, size, &source)
            })
            .await?;
        Ok(Out(VolumeResult { volume }))
    }

    /// Every volume of this namespace (namespace: "*" for all) this
    /// session may use (all_agents: true for every agent's): size, host
    /// space used, and the workspaces that mount it.
    #[tool(
        output_schema = crate::output::schema::<VolumeList>(),
        annotations(
        title = "List volumes",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn volume_list(
        &self,
        Parameters(p): Parameters<VolumeListParams>,
    ) -> ToolResult<VolumeList> {
        let volumes = self
            .blocking(move |ws| {
                let ws = super::seen_from(ws, p.namespace.as_deref())?;
                Ok(ws.volumes().list(p.all_agents)?)
            })
            .await?;
        Ok(Out(VolumeList { volumes }))
    }

    /// One volume: size, host space used, what filled it, and the
    /// workspaces that mount it (where, read-only or not, running or not).
    #[tool(
        output_schema = crate::output::schema::<VolumeResult>(),
        annotations(
        title = "Inspect a volume",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn volume_inspect(
        &self,
        Parameters(p): Parameters<VolumeNameParams>,
    ) -> ToolResult<VolumeResult> {
        let volume = self
            .on_workspace(&p.name, |ws, name| ws.volumes().inspect(name))
            .await?;
        Ok(Out(VolumeResult { volume }))
    }

    /// Delete a volume no workspace mounts (CONFLICT otherwise, naming
    /// them) and its files. preview: true only checks.
    #[tool(
        output_schema = crate::output::schema::<VolumeDeleteResult>(),
        annotations(
        title = "Delete a volume",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn volume_delete(
        &self,
        Parameters(p): Parameters<DeleteVolumeParams>,
    ) -> ToolResult<VolumeDeleteResult> {
        let preview = p.preview;
        let volume = self
            .on_workspace(&p.name, move |ws, name| ws.volumes().delete(name, preview))
            .await?;
        Ok(Out(VolumeDeleteResult {
            preview,
            action: would_or_did(preview, "delete"),
            volume,
        }))
    }
}
