//! Tool failures. A failed operation is a tool result with `isError: true`,
//! the stable [`ErrorCode`] and the message in `structuredContent`
//! (`{"code", "message"}`) and as text (`CODE: message`). Requests that are
//! malformed (unknown tool, arguments that do not fit the input schema) never
//! get here: rmcp answers them with JSON-RPC errors.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use serde::Serialize;
use workspace::{ErrorCode, Remedy};

use workspace::host::cost::PriceError;

/// Why a tool call failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The workspace library refused or failed.
    #[error("{}", workspace_message(.0))]
    Workspace(#[from] workspace::Error),
    /// A request value is out of range or inconsistent.
    #[error("{0}")]
    InvalidInput(String),
    /// Something named in the request does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request clashes with what exists (a host file in the way, ...).
    #[error("{0}")]
    Conflict(String),
    /// The request names a host path this server may not use.
    #[error("{0}")]
    Forbidden(String),
    /// The client cancelled the call (the answer is not sent; MCP says so).
    #[error("cancelled by the client: {0}")]
    Cancelled(String),
    /// The price table of `estimate_cost`.
    #[error("{}", workspace::error_chain(.0))]
    Price(#[from] PriceError),
    /// A host-side operation failed unexpectedly.
    #[error("{0}")]
    Internal(String),
}

/// The library checks a spec, a duration or a delete on their own
/// (before any workspace operation); they fail as the operations would.
impl From<workspace::store::spec::SpecError> for ToolError {
    fn from(e: workspace::store::spec::SpecError) -> Self {
        ToolError::Workspace(e.into())
    }
}

/// The library's message, then what to do next in terms of this server's
/// tools.
fn workspace_message(e: &workspace::Error) -> String {
    match e.remedy() {
        Some(r) => format!("{}; {}", e.full_message(), remedy(&r)),
        None => e.full_message(),
    }
}

/// A remedy as this server's tools and arguments.
pub(crate) fn remedy(r: &Remedy) -> String {
    match r {
        Remedy::ListWorkspaces => {
            "list the workspaces (the workspace_list tool) to see their names".into()
        }
        Remedy::ChooseAnotherName { workspace } => {
            format!("pick another name, or delete `{workspace}` first (the workspace_delete tool)")
        }
        Remedy::StartWorkspace { .. } => "start it first (the workspace_start tool)".into(),
        Remedy::WaitOrHalt { .. } => {
            "wait for it to settle, or halt it (the workspace_halt tool)".into()
        }
        Remedy::StopOrForce { .. } => {
            "stop it first (the workspace_stop tool), or delete with force: true".into()
        }
        Remedy::ReadConsole { .. } => "its console (the workspace_logs tool) shows why".into(),
        Remedy::StopOrForceRestore { .. } => {
            "stop it first (the workspace_stop tool), or call snapshot_restore with force: true, which halts it".into()
        }
        Remedy::ListSnapshots => "list them (the snapshot_list tool)".into(),
        Remedy::AskOwnerToShare { kind, name, owner } => format!(
            "use one of this session's own, or ask agent `{owner}` to share {kind} `{name}` with you (workspace_share)"
        ),
        Remedy::ChooseAnotherSnapshotName { .. } => {
            "pick another name, or delete that snapshot first (the snapshot_delete tool)".into()
        }
        Remedy::ListVolumes => "list the volumes (the volume_list tool)".into(),
        Remedy::SetSecret { secret } => format!(
            "secrets are set by the host's user, not over MCP: `microagent secret set {secret}` (see `microagent secret ls`)"
        ),
        Remedy::ChooseAnotherVolumeName { volume } => {
            format!("pick another name, or delete it first (volume_delete `{volume}`)")
        }
        Remedy::StopVolumeHolder { volume, workspace } => format!(
            "stop `{workspace}` first (workspace_stop), or mount `{volume}` with read_only: true if both only read it"
        ),
        Remedy::AllowRepo { repo } => format!(
            "`{repo}` must be allowed by a human first (`microagent repo allow PATH --alias {repo}`); list_repos shows the allowed ones"
        ),
        Remedy::ChooseAnotherAlias { alias } => {
            format!("pick another alias than `{alias}`")
        }
        Remedy::UseImageWithGit { image } => format!(
            "use an image with git instead of `{image}` (image: \"debian\")"
        ),
        Remedy::ListImages => {
            "list the images (the image_list tool); `microagent setup --with debian --yes` on the host builds minimal and debian (`--with browser`, `--with code` the others)"
                .into()
        }
        Remedy::PullImage { reference } => format!(
            "pull it first (the image_pull tool with reference `{reference}`), or call again with pull: \"missing\""
        ),
        Remedy::RemoveImage { image } => {
            format!("image `{image}` must be removed first (`microagent image rm {image}`)")
        }
        Remedy::ChooseAnotherPort { addr } => {
            format!("choose another host_port, or stop what listens on {addr}")
        }
        Remedy::ListPorts { .. } => "list its published ports (the port_list tool)".into(),
        Remedy::ListNetworks => "list the networks (the network_list tool)".into(),
        Remedy::DeleteWorkspacesFirst { workspaces } => format!(
            "delete the workspaces on it first (workspace_delete: {})",
            workspaces.join(", ")
        ),
        Remedy::SetUpNetworks => {
            "call host_networking_setup without a token to see the plan, then with its token to apply it (the server needs CAP_NET_ADMIN)".into()
        }
        Remedy::ConfirmAsRoot { operation, token } => format!(
            "this server lacks CAP_NET_ADMIN; a root shell can apply the same plan: sudo microagent {operation} --confirm {token} (with this server's MICROAGENT_HOME)"
        ),
        Remedy::PreviewAgain => "call the tool again without a token for a fresh plan and token".into(),
        Remedy::GrantSubordinateIds { user, free } => format!("the host's administrator must give {user} subordinate ids once, a range no other user has (as root: usermod --add-subuids {free} --add-subgids {free} {user}), or build the image as root"),
        Remedy::UseKernelImage => "use a workspace of an image with Jupyter's kernels: build it on the host once (`microagent setup --with code --yes`) and create one with image \"code\"".into(),
        Remedy::UseBrowserImage => "use a workspace of an image with Chromium: build it on the host once (`microagent setup --with browser --yes`) and create one with image \"browser\" and mem_mib 2048".into(),
        Remedy::TakeBrowserSnapshot { page, .. } => format!(
            "call browser_snapshot (page \"{page}\") and use one of its refs, or pass a selector"
        ),
        Remedy::OpenBrowserPage { page, .. } => format!(
            "open it first with browser_open (page \"{page}\")"
        ),
        Remedy::UseCodeImage { image } => format!(
            "run_code needs an image with it such as `{image}`: leave out `workspace` to run in a one-shot {image} workspace, or create one with image \"{image}\""
        ),
        Remedy::BuildCodeImage { image, interpreter } => format!(
            "build it on the host with `microagent setup --yes` (it builds {image}); or pass `workspace`, a running workspace whose image has {interpreter}"
        ),
        Remedy::Overwrite { .. } => {
            "pass overwrite: true to replace it (a directory is merged into)".into()
        }
        Remedy::IncludeGitMetadata => {
            "pass include_git_metadata: true only if the user asked for the guest's .git (its hooks and config run on the host's next git command), or name a host path outside any .git"
                .into()
        }
        // A remedy added to the library later still reads sensibly.
        other => format!("{other:?}"),
    }
}

/// The structured content of a failed call.
#[derive(Debug, Serialize)]
pub struct ToolFailure {
    /// Stable error code (see the `contract` tool).
    pub code: ErrorCode,
    /// What failed and what to do next.
    pub message: String,
}

impl ToolError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ToolError::Workspace(e) => e.code(),
            ToolError::InvalidInput(_) => ErrorCode::InvalidInput,
            ToolError::NotFound(_) => ErrorCode::NotFound,
            ToolError::Conflict(_) => ErrorCode::Conflict,
            ToolError::Forbidden(_) => ErrorCode::Forbidden,
            ToolError::Price(e) => e.code(),
            ToolError::Cancelled(_) | ToolError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The tool result that reports this failure.
    pub fn to_result(&self) -> CallToolResult {
        let failure = ToolFailure {
            code: self.code(),
            message: self.to_string(),
        };
        let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
            "{}: {}",
            failure.code, failure.message
        ))]);
        result.structured_content = serde_json::to_value(&failure).ok();
        result
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(self.to_result().into())
    }
}

/// Runs a blocking library call on the blocking pool (creating a disk,
/// halting a VMM and removing a directory can take seconds).
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::Internal(format!("a worker thread failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_carry_the_code_in_text_and_structure() {
        let err = ToolError::Workspace(workspace::Error::WorkspaceNotFound("dev".into()));
        let result = err.to_result();
        assert_eq!(result.is_error, Some(true));
        let structured = result.structured_content.unwrap();
        assert_eq!(structured["code"], "NOT_FOUND");
        assert!(structured["message"]
            .as_str()
            .unwrap()
            .contains("`dev` does not exist"));
        let text = result.content[0].as_text().unwrap().text.clone();
        assert!(text.starts_with("NOT_FOUND: workspace `dev`"), "{text}");
        assert_eq!(
            ToolError::InvalidInput("x".into()).code(),
            ErrorCode::InvalidInput
        );
    }
}
