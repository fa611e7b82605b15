//! The snapshot calls the collection hands out (`ws.snapshots()`): get,
//! list, delete and restore snapshots by name. Taking one and forking
//! from one are calls of the workspace's handle.

use std::time::Duration;

use crate::error::Result;
use crate::snapshots::SnapshotInfo;
use crate::store::spec::Meta;
use crate::workspaces::lifecycle::StartProgress;
use crate::workspaces::manager::Workspaces;

/// The snapshots a collection of workspaces sees (`ws.snapshots()`).
/// `Copy`; its calls take it by value, so a restore's future borrows the
/// collection, not this value.
#[derive(Clone, Copy, Debug)]
pub struct Snapshots<'a> {
    all: &'a Workspaces,
}

impl Workspaces {
    /// The snapshots this view sees: by name, in its namespace (or by
    /// full name). Here rather than in `workspaces/`, which sits below
    /// this folder.
    pub fn snapshots(&self) -> Snapshots<'_> {
        Snapshots { all: self }
    }
}

impl<'a> Snapshots<'a> {
    /// The snapshot `name` (in this view's namespace, or a full name);
    /// FORBIDDEN when another agent owns it.
    pub fn get(self, name: &str) -> Result<SnapshotInfo> {
        self.all.snapshot_get(name)
    }

    /// Every snapshot in this view's namespace (of `workspace` only, if
    /// given; a short name is in the view's namespace), oldest first. An
    /// agent's view lists what it may use, or with `all_agents` every
    /// agent's (the others' stay FORBIDDEN to use).
    pub fn list(self, workspace: Option<&str>, all_agents: bool) -> Result<Vec<SnapshotInfo>> {
        self.all.snapshot_list(workspace, all_agents)
    }

    /// Deletes the snapshot `name`. Workspaces forked from it keep running:
    /// they hold its memory file open.
    pub fn delete(self, name: &str) -> Result<SnapshotInfo> {
        self.all.snapshot_delete(name)
    }

    /// Puts the snapshot's workspace back to the snapshot's state: its disk
    /// is replaced by a copy of the snapshot's, and a snapshot with memory
    /// resumes it where it was taken (a disk-only one leaves it stopped). A
    /// running workspace is only restored with `force` (it is halted
    /// first). With `as_name`, a new workspace of that name is made from
    /// the snapshot instead (a fork) and the original is left alone.
    pub async fn restore(
        self,
        name: &str,
        as_name: Option<&str>,
        force: bool,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.all
            .snapshot_restore(name, as_name, force, timeout, progress)
            .await
    }
}
