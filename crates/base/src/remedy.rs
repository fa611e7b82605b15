//! What a caller can do about a failure. The library names the remedy; each
//! front end words it its own way (a CLI command, an MCP tool), so no
//! library message names a front end's commands.

use serde::Serialize;

/// The next step that resolves a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(tag = "action", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Remedy {
    /// List the workspaces to find the right name.
    ListWorkspaces,
    /// Choose another name, or delete the workspace that has it.
    ChooseAnotherName {
        /// The workspace that has the name.
        workspace: String,
    },
    /// Start the workspace first.
    StartWorkspace {
        /// The workspace.
        workspace: String,
    },
    /// Wait for the workspace to finish starting or stopping, or halt it.
    WaitOrHalt {
        /// The workspace.
        workspace: String,
    },
    /// Stop the workspace first, or delete it with force.
    StopOrForce {
        /// The workspace.
        workspace: String,
    },
    /// Read the workspace's console, which shows what the guest did.
    ReadConsole {
        /// The workspace.
        workspace: String,
    },
    /// Stop the workspace first, or restore the snapshot over it with force
    /// (which halts it).
    StopOrForceRestore {
        /// The workspace.
        workspace: String,
        /// The snapshot.
        snapshot: String,
    },
    /// List the snapshots to find the right name.
    ListSnapshots,
    /// Ask the owning agent to share it, or use one of the caller's own.
    AskOwnerToShare {
        /// `workspace` or `snapshot`.
        kind: &'static str,
        /// Its full name.
        name: String,
        /// The agent that owns it.
        owner: String,
    },
    /// Choose another snapshot name, or delete the snapshot that has it.
    ChooseAnotherSnapshotName {
        /// The snapshot that has the name.
        snapshot: String,
    },
    /// List the images to find the right name (`microagent setup` builds
    /// `minimal` and `debian`).
    ListImages,
    /// Pull the image, or let the call pull it (pull policy `missing`).
    PullImage {
        /// The OCI reference.
        reference: String,
    },
    /// Choose another host port (or address), or stop what listens there.
    ChooseAnotherPort {
        /// The host address asked for.
        addr: std::net::SocketAddr,
    },
    /// List the workspace's published ports to find the right one.
    ListPorts {
        /// The workspace.
        workspace: String,
    },
    /// List the networks to find the right name.
    ListNetworks,
    /// Delete (or recreate elsewhere) the workspaces on the network first.
    DeleteWorkspacesFirst {
        /// The workspaces.
        workspaces: Vec<String>,
    },
    /// Apply the host setup of the `tap` networks (preview, then confirm).
    SetUpNetworks,
    /// Preview the host change again for a fresh token.
    PreviewAgain,
    /// Confirm the same token again with the right (as root).
    ConfirmAsRoot {
        /// The plan's action (`network setup`, `network teardown`).
        operation: String,
        /// The token.
        token: String,
    },
    /// Ask again to overwrite the host path (a file is replaced, a
    /// directory merged into), or name another one.
    Overwrite {
        /// The existing host path.
        path: std::path::PathBuf,
    },
    /// Ask again with git metadata included, having checked what the guest
    /// wrote there, or name a host path outside any `.git`.
    IncludeGitMetadata,
    /// Run the code in a one-shot workspace of this image (it has every
    /// interpreter), or in a workspace created from it.
    UseCodeImage {
        /// The image.
        image: String,
    },
    /// Use a workspace of an image with Chromium (`browser`), building it
    /// first if it is missing.
    UseBrowserImage,
    /// Use a workspace of an image with Jupyter's kernels (`code`),
    /// building it first if it is missing.
    UseKernelImage,
    /// As root, give the user a range of subordinate uids and gids (what
    /// a Debian image build without root maps its files' owners into),
    /// or build as root.
    GrantSubordinateIds {
        /// The user.
        user: String,
        /// A range no user has (`FIRST-LAST`).
        free: String,
    },
    /// Take a new snapshot of the page: its refs are what click and fill take.
    TakeBrowserSnapshot {
        /// The workspace.
        workspace: String,
        /// The page.
        page: String,
    },
    /// Open the page first (or list the pages the browser has).
    OpenBrowserPage {
        /// The workspace.
        workspace: String,
        /// The page.
        page: String,
    },
    /// Build the image that has every interpreter, or run the code in a
    /// running workspace whose image has this one.
    BuildCodeImage {
        /// The image.
        image: String,
        /// The interpreter.
        interpreter: &'static str,
    },
    /// Remove the image that has the name first.
    RemoveImage {
        /// The image.
        image: String,
    },
    /// List the volumes to find the right name.
    ListVolumes,
    /// Pick another volume name, or remove the volume first.
    ChooseAnotherVolumeName {
        /// The volume.
        volume: String,
    },
    /// Put the repository on the allowlist first (or list the allowed ones).
    AllowRepo {
        /// The repository asked for.
        repo: String,
    },
    /// Pick another alias, or take the other repository off the allowlist.
    ChooseAnotherAlias {
        /// The alias.
        alias: String,
    },
    /// Create the workspace from an image with git (`debian`).
    UseImageWithGit {
        /// The image without git.
        image: String,
    },
    /// Stop or delete the workspace that mounts the volume read-write, or
    /// mount it read-only.
    StopVolumeHolder {
        /// The volume.
        volume: String,
        /// The workspace that holds it.
        workspace: String,
    },
    /// Set the secret (its value from stdin or a file), or list the
    /// secrets to find the right name.
    SetSecret {
        /// The secret.
        secret: String,
    },
}
