//! Snapshots of workspaces and forks from them. A snapshot is a directory
//! under `snapshots/` in the state directory: the machine's files as
//! vmm-core writes them (state, sparse memory, a copy of the writable disk)
//! and `snapshot.json`, the record. A running workspace's snapshot holds
//! its memory; a stopped one's only its disk. A fork is a new workspace
//! started from a snapshot (memory included) with a copy of its disk.

mod ops;
mod pool_fill;
mod service;
pub(crate) mod warm;

use std::path::Path;

use serde::{Deserialize, Serialize};
use vmm_core::disk_copy::copy_disk;
use vmm_core::snapshot::SnapshotFiles;

use crate::error::{Error, Result};
use base::store::spec::WorkspaceSpec;
use base::store::volume_mounts::VolumeMount;
use base::store::workspace_dir::WorkspaceDir;
pub(crate) use base::vmm::seal::WORKSPACE_DISK;
use base::volumes::VolumeStore;

pub use service::Snapshots;
/// A disk copy in progress, in the workspace's directory.
const DISK_COPY_TMP: &str = ".disk.copy.tmp";

/// One snapshot, as `snapshot_list` and `snapshot_get` report it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The snapshot's name.
    pub name: String,
    /// The workspace it was taken of.
    pub workspace: String,
    /// Unix ms when it was taken.
    pub created_at_ms: u64,
    /// The workspace's spec then (forks get the same).
    pub spec: WorkspaceSpec,
    /// Whether it holds the guest's memory (taken while running) or only
    /// its disk (taken while stopped).
    pub has_memory: bool,
    /// How long the guest was paused, in ms (0 for a disk-only snapshot).
    pub paused_ms: f64,
    /// Bytes it takes on disk (holes excluded).
    #[serde(default)]
    pub size_bytes: u64,
    /// The memory file's digest (see `vmm_core::snapshot::memory_file::digest`),
    /// checked before the snapshot is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_sha256: Option<String>,
    /// The disk copy's digest (the same kind), checked before the snapshot
    /// is restored or forked (absent from snapshots older builds took).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_sha256: Option<String>,
}

pub(crate) fn allocated_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .sum()
}

/// Makes the workspace's writable disk a copy of the one in the snapshot
/// directory `dir`, through a temporary file: a failed copy leaves the old
/// disk whole.
pub(crate) fn copy_snapshot_disk(dir: &Path, ws: &WorkspaceDir) -> Result<()> {
    copy_from_snapshot(dir, WORKSPACE_DISK, ws, &ws.disk())
}

/// Copies disk `index` of the snapshot in `dir` over `to`, through a
/// temporary file in `ws`: a failed copy leaves `to` whole.
fn copy_from_snapshot(dir: &Path, index: usize, ws: &WorkspaceDir, to: &Path) -> Result<()> {
    let tmp = ws.path().join(DISK_COPY_TMP);
    let _ = std::fs::remove_file(&tmp);
    copy_disk(&SnapshotFiles::new(dir).disk(index), &tmp)
        .and_then(|_| std::fs::rename(&tmp, to))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::host_io(format!(
                "copying the snapshot's disk {index} to {}",
                to.display()
            ))(e)
        })
}

/// The snapshot's index of the disk in volume slot `slot` (after the
/// image's root and the workspace's own disk).
pub(crate) fn volume_disk_index(slot: usize) -> usize {
    WORKSPACE_DISK + 1 + slot
}

/// Puts the read-write volumes of `volumes` back as the snapshot in `dir`
/// has them: into the workspace's own copies with `own_copies` (a fork,
/// whose mounts then say so), else over the disks they are on now (a
/// restore in place). Read-only volumes are not in a snapshot.
pub(crate) fn copy_snapshot_volumes(
    dir: &Path,
    ws: &WorkspaceDir,
    volumes: &mut [VolumeMount],
    store: &VolumeStore,
    own_copies: bool,
) -> Result<()> {
    for (slot, mount) in volumes.iter_mut().enumerate() {
        if mount.read_only {
            continue;
        }
        let to = if own_copies {
            ws.volume_copy(slot)
        } else {
            store.mount_disk(ws, slot, mount)?
        };
        copy_from_snapshot(dir, volume_disk_index(slot), ws, &to)?;
        mount.own_copy |= own_copies;
    }
    Ok(())
}
