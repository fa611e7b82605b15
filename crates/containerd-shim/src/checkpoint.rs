//! Checkpoint: containerd asks for the container's state in a directory,
//! which it then keeps as the checkpoint (in its content store). A
//! microVM's state is a full-VM snapshot of its workspace, taken by the
//! library; the directory gets a descriptor naming it, so the checkpoint
//! containerd keeps says which snapshot to fork (`microagent fork`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use workspace::Workspaces;

use crate::error::ShimError;

/// The descriptor's file in the checkpoint directory.
pub const DESCRIPTOR_FILE: &str = "microagent-snapshot.json";

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointDescriptor {
    /// The microagent state directory.
    pub state_dir: PathBuf,
    /// The workspace it was taken of.
    pub workspace: String,
    /// The snapshot.
    pub snapshot: String,
}

/// Takes a snapshot of `workspace` (the guest pauses meanwhile) and
/// writes its descriptor into `dir`; returns the snapshot's name.
pub async fn take(all: Arc<Workspaces>, workspace: &str, dir: &Path) -> Result<String, ShimError> {
    let what = format!("take a snapshot of workspace {workspace}");
    let taken = {
        let (all, workspace) = (all.clone(), workspace.to_owned());
        tokio::task::spawn_blocking(move || all.workspace(&workspace)?.snapshot_take(None))
            .await
            .map_err(|_| ShimError::WrongState {
                process: "the snapshot".into(),
                why: "was cancelled",
            })?
            .map_err(ShimError::workspace(what))?
    };
    let descriptor = CheckpointDescriptor {
        state_dir: all.state_dir().root().to_owned(),
        workspace: workspace.to_owned(),
        snapshot: taken.name.clone(),
    };
    std::fs::create_dir_all(dir).map_err(|source| ShimError::Record {
        what: "make the directory of",
        path: dir.join(DESCRIPTOR_FILE),
        source,
    })?;
    workspace::store::write_json_atomic(&dir.join(DESCRIPTOR_FILE), &descriptor)
        .map_err(ShimError::Write)?;
    Ok(taken.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_names_the_snapshot_in_json() {
        let d = CheckpointDescriptor {
            state_dir: "/var/lib/microagent".into(),
            workspace: "ctr-1".into(),
            snapshot: "ctr-1-1764000000000".into(),
        };
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["snapshot"], "ctr-1-1764000000000");
        assert_eq!(
            serde_json::from_value::<CheckpointDescriptor>(json).unwrap(),
            d
        );
    }
}
