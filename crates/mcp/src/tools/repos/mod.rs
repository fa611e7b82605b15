//! Repository tools: list_repos, repo_pull, repo_diff. Which repositories
//! may be cloned is a human's choice (`microagent repo allow`); an agent
//! clones one with workspace_create's `repo`.

pub mod tasks;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use crate::output::{Out, ToolResult};
use crate::schema::repos::*;
use crate::MicroagentServer;

#[tool_router(router = repos_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// The host repositories workspaces may clone ({alias, path, added}):
    /// pass an alias as workspace_create's `repo`. Anything else is
    /// FORBIDDEN.
    #[tool(
        output_schema = crate::output::schema::<RepoList>(),
        annotations(
        title = "List allowed repositories",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn list_repos(&self) -> ToolResult<RepoList> {
        let repos = self
            .blocking(|ws| Ok(ws.repos().list().map_err(workspace::Error::from)?))
            .await?;
        Ok(Out(RepoList { repos }))
    }

    /// Bring a workspace's new commits (its clone's HEAD since it was
    /// made) to the host repository as refs/workspaces/<name>. No new
    /// commits changes nothing.
    #[tool(
        output_schema = crate::output::schema::<RepoPullResult>(),
        annotations(
        title = "Pull a workspace's commits",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn repo_pull(
        &self,
        Parameters(p): Parameters<RepoWorkspaceParams>,
    ) -> ToolResult<RepoPullResult> {
        let pull = self.ws.workspace(&p.name)?.pull_repo().await?;
        Ok(Out(RepoPullResult { pull }))
    }

    /// What a workspace changed in /workspace/repo since it was made,
    /// committed or not: a unified diff (stat: true for a summary).
    #[tool(
        output_schema = crate::output::schema::<RepoDiffResult>(),
        annotations(
        title = "Diff a workspace's clone",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn repo_diff(
        &self,
        Parameters(p): Parameters<RepoWorkspaceParams>,
    ) -> ToolResult<RepoDiffResult> {
        let diff = self.ws.workspace(&p.name)?.repo_diff(p.stat).await?;
        Ok(Out(RepoDiffResult {
            workspace: p.name,
            diff,
        }))
    }
}
