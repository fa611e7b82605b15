//! Snapshot tools: take, list, get, delete, restore, and workspace_fork.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::{Meta, SnapshotInfo};

use super::seconds;
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::snapshots::*;
use crate::{MicroagentServer, ToolError};

impl MicroagentServer {
    /// Runs a fork or restore that ends with workspace `target` starting,
    /// reporting progress; a cancelled call halts `target`.
    async fn start_from_snapshot(
        &self,
        target: &str,
        work: impl std::future::Future<Output = workspace::Result<Meta>>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Meta, ToolError> {
        let mut progress = Progress::new(ctx);
        let work = async {
            tokio::select! {
                done = work => done.map(Some),
                () = ctx.ct.cancelled() => Ok(None),
            }
        };
        let status = |elapsed: Duration| format!("resuming {target}: {} s", elapsed.as_secs());
        match progress.drive(work, status).await? {
            Some(meta) => Ok(meta),
            None => {
                // It may not exist yet if the call was cancelled early.
                let _ = self
                    .on_workspace(target, |ws, name| ws.workspace(name)?.halt())
                    .await;
                Err(ToolError::Cancelled(format!(
                    "the start of `{target}` was cancelled and its VM halted"
                )))
            }
        }
    }
}

#[tool_router(router = snapshots_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Snapshot a workspace: a running one whole (memory, vCPUs, devices and
    /// a copy of its disk at the same instant; the guest pauses for
    /// milliseconds to a second), a stopped one's disk only. Fork or restore
    /// from it later. Sends progress while the snapshot is written.
    #[tool(
        output_schema = crate::output::schema::<SnapshotInfo>(),
        annotations(
        title = "Take a snapshot",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn snapshot_take(
        &self,
        Parameters(p): Parameters<TakeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<SnapshotInfo> {
        let mut progress = Progress::new(&ctx);
        let workspace = p.workspace.clone();
        let take = self.blocking(move |ws| {
            Ok(ws
                .workspace(&p.workspace)?
                .snapshot_take(p.name.as_deref())?)
        });
        let status = |elapsed: Duration| {
            format!("writing a snapshot of {workspace}: {} s", elapsed.as_secs())
        };
        Ok(Out(progress.drive(take, status).await?))
    }

    /// List snapshots (of one workspace, if given), oldest first: name,
    /// workspace, whether it holds memory, size on disk.
    #[tool(
        output_schema = crate::output::schema::<SnapshotListResult>(),
        annotations(
        title = "List snapshots",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn snapshot_list(
        &self,
        Parameters(p): Parameters<ListSnapshotsParams>,
    ) -> ToolResult<SnapshotListResult> {
        let snapshots = self
            .blocking(move |ws| {
                let ws = super::seen_from(ws, p.namespace.as_deref())?;
                Ok(ws.snapshots().list(p.workspace.as_deref(), p.all_agents)?)
            })
            .await?;
        Ok(Out(SnapshotListResult {
            count: snapshots.len(),
            snapshots,
        }))
    }

    /// One snapshot's record: its workspace and spec, whether it holds
    /// memory (resumes where it was taken) or only a disk (boots), its pause
    /// time and size.
    #[tool(
        output_schema = crate::output::schema::<SnapshotInfo>(),
        annotations(
        title = "Show a snapshot",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn snapshot_get(
        &self,
        Parameters(p): Parameters<SnapshotNameParams>,
    ) -> ToolResult<SnapshotInfo> {
        Ok(Out(self
            .blocking(move |ws| Ok(ws.snapshots().get(&p.name)?))
            .await?))
    }

    /// Delete a snapshot and its files. Workspaces forked from it keep
    /// running. preview: true reports what would happen.
    #[tool(
        output_schema = crate::output::schema::<SnapshotDeleteResult>(),
        annotations(
        title = "Delete a snapshot",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn snapshot_delete(
        &self,
        Parameters(p): Parameters<DeleteSnapshotParams>,
    ) -> ToolResult<SnapshotDeleteResult> {
        let preview = p.preview;
        let (snapshot, action) = self
            .blocking(move |ws| {
                let info = ws.snapshots().get(&p.name)?;
                if preview {
                    let action = format!(
                        "would delete snapshot `{}` of `{}`, freeing {} bytes",
                        info.name, info.workspace, info.size_bytes
                    );
                    return Ok((info, action));
                }
                let info = ws.snapshots().delete(&p.name)?;
                let action = format!("deleted snapshot `{}`", info.name);
                Ok((info, action))
            })
            .await?;
        Ok(Out(SnapshotDeleteResult {
            preview,
            action,
            snapshot,
        }))
    }

    /// Restore a snapshot: a new workspace starts from it, named as_name
    /// (default `<workspace>-restored`), the original left alone. With
    /// in_place: true its own workspace goes back to the snapshot's state
    /// instead (a running one only with force: true, which halts it first
    /// and loses what happened since). A snapshot with memory resumes in
    /// about a second; a disk-only one leaves the workspace stopped.
    /// preview: true reports what would happen.
    #[tool(
        output_schema = crate::output::schema::<RestoreResult>(),
        annotations(
        title = "Restore a snapshot",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn snapshot_restore(
        &self,
        Parameters(p): Parameters<RestoreParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<RestoreResult> {
        let timeout = seconds(
            "timeout_secs",
            p.timeout_secs,
            DEFAULT_RESTORE_TIMEOUT_SECS,
            MAX_RESTORE_TIMEOUT_SECS,
        )?;
        if p.in_place && p.as_name.is_some() {
            return Err(ToolError::InvalidInput(
                "as_name starts a new workspace and in_place restores the snapshot's own: give one"
                    .into(),
            ));
        }
        if p.force && !p.in_place {
            return Err(ToolError::InvalidInput(
                "force halts a running workspace for an in-place restore: give in_place: true with it"
                    .into(),
            ));
        }
        let name = p.name.clone();
        let info = self
            .blocking(move |ws| Ok(ws.snapshots().get(&name)?))
            .await?;
        let as_name = match (&p.as_name, p.in_place) {
            (Some(new), _) => Some(new.clone()),
            (None, false) => Some(info.restored_name()),
            (None, true) => None,
        };
        let target = as_name.clone().unwrap_or_else(|| info.workspace.clone());
        if p.preview {
            let action = match &as_name {
                Some(new) => format!(
                    "would start new workspace `{new}` from snapshot `{}`",
                    info.name
                ),
                None => format!(
                    "would put workspace `{target}` back to snapshot `{}`{}: its disk is replaced{}",
                    info.name,
                    if p.force { " (halting it if it runs)" } else { "" },
                    if info.has_memory {
                        " and it resumes where the snapshot was taken"
                    } else {
                        " and it is left stopped"
                    }
                ),
            };
            let current = self.meta(&target).await.ok();
            return Ok(Out(RestoreResult {
                preview: true,
                action,
                workspace: current,
            }));
        }
        let work =
            self.ws
                .snapshots()
                .restore(&p.name, as_name.as_deref(), p.force, timeout, |_| {});
        let meta = self.start_from_snapshot(&target, work, &ctx).await?;
        Ok(Out(RestoreResult {
            preview: false,
            action: format!("restored snapshot `{}` as workspace `{target}`", p.name),
            workspace: Some(meta),
        }))
    }

    /// Start a new workspace as a fork: of a running workspace as it is now
    /// (memory included: its processes and files carry on in the fork), or
    /// of one of its snapshots. The fork has its own disk copy, hostname and
    /// random seed; what it writes no other workspace sees. Resumes in about
    /// a second instead of booting.
    #[tool(
        output_schema = crate::output::schema::<Meta>(),
        annotations(
        title = "Fork a workspace",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn workspace_fork(
        &self,
        Parameters(p): Parameters<ForkParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<Meta> {
        let timeout = seconds(
            "timeout_secs",
            p.timeout_secs,
            DEFAULT_RESTORE_TIMEOUT_SECS,
            MAX_RESTORE_TIMEOUT_SECS,
        )?;
        let work =
            self.ws
                .workspace(&p.name)?
                .fork(&p.new_name, p.snapshot.as_deref(), timeout, |_| {});
        Ok(Out(self
            .start_from_snapshot(&p.new_name, work, &ctx)
            .await?))
    }
}
