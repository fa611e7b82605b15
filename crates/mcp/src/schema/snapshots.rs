//! Inputs and outputs of the snapshot tools: take, list, get, delete,
//! restore, and workspace_fork.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::{Meta, SnapshotInfo};

use crate::output::Render;
use workspace::guest::copy::human_bytes;

/// Longest wait for a fork's or restore's agent.
pub const MAX_RESTORE_TIMEOUT_SECS: u64 = 3600;
/// Default wait for a fork's or restore's agent.
pub const DEFAULT_RESTORE_TIMEOUT_SECS: u64 = 300;

/// `snapshot_take`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeParams {
    /// The workspace to snapshot: a running one is saved whole (memory,
    /// devices, disk; the guest pauses meanwhile), a stopped one's disk only.
    pub workspace: String,
    /// Snapshot name (1-63 of a-z, 0-9 and '-', starting with a letter);
    /// default `<workspace>-<unix ms>`.
    pub name: Option<String>,
}

/// `snapshot_list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSnapshotsParams {
    /// Only snapshots of this workspace.
    pub workspace: Option<String>,
    /// The namespace to list (default: the session's); `*` lists every
    /// namespace.
    pub namespace: Option<String>,
    /// Other agents' snapshots too (FORBIDDEN to use unless shared);
    /// default false.
    #[serde(default)]
    pub all_agents: bool,
}

/// `snapshot_get`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotNameParams {
    /// Snapshot name.
    pub name: String,
}

/// `snapshot_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteSnapshotParams {
    /// Snapshot name.
    pub name: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `snapshot_restore`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreParams {
    /// Snapshot name.
    pub name: String,
    /// The new workspace started from the snapshot (the original is left
    /// alone); default `<workspace>-restored`.
    pub as_name: Option<String>,
    /// Put the snapshot's own workspace back to the snapshot's state
    /// instead of starting a new one (not with `as_name`).
    #[serde(default)]
    pub in_place: bool,
    /// With `in_place`: restore over a running workspace (it is halted
    /// first; its state since the snapshot is lost). Without it a running
    /// workspace is refused with CONFLICT.
    #[serde(default)]
    pub force: bool,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
    /// Seconds to wait for the restored guest's agent, 1 to 3600; default 300.
    #[schemars(range(min = 1, max = MAX_RESTORE_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
}

/// `workspace_fork`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkParams {
    /// The workspace to fork (running, unless `snapshot` is given).
    pub name: String,
    /// The new workspace's name.
    pub new_name: String,
    /// Fork from this snapshot instead of the live workspace.
    pub snapshot: Option<String>,
    /// Seconds to wait for the fork's agent, 1 to 3600; default 300.
    #[schemars(range(min = 1, max = MAX_RESTORE_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
}

impl Render for SnapshotInfo {
    fn render(&self) -> String {
        let holds = if self.has_memory {
            format!("memory+disk, paused {:.1} ms", self.paused_ms)
        } else {
            "disk only".into()
        };
        let services = if self.services.is_empty() {
            String::new()
        } else {
            let names: Vec<_> = self.services.iter().map(|p| p.service.as_str()).collect();
            format!(", services {}", names.join(", "))
        };
        format!(
            "snapshot {} of {} ({holds}, {} on disk{services})",
            self.name,
            self.workspace,
            human_bytes(self.size_bytes)
        )
    }
}

/// `snapshot_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotListResult {
    /// How many matched.
    pub count: usize,
    /// The snapshots, oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}

impl Render for SnapshotListResult {
    fn render(&self) -> String {
        if self.snapshots.is_empty() {
            return "no snapshots".into();
        }
        self.snapshots
            .iter()
            .map(Render::render)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `snapshot_delete`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotDeleteResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The snapshot as it was before the delete.
    pub snapshot: SnapshotInfo,
}

impl Render for SnapshotDeleteResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!("{tag}{}", self.action)
    }
}

/// `snapshot_restore`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RestoreResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The restored (or new) workspace; for a preview, the workspace as it is.
    pub workspace: Option<Meta>,
}

impl Render for RestoreResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        let ws = self
            .workspace
            .as_ref()
            .map(Render::render)
            .unwrap_or_default();
        format!("{tag}{}\n{ws}", self.action)
    }
}
