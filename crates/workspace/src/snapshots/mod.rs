//! Snapshots of workspaces and forks from them. A snapshot is a directory
//! under `snapshots/` in the state directory: the machine's files as
//! vmm-core writes them (state, sparse memory, a copy of the writable disk)
//! and `snapshot.json`, the record. A running workspace's snapshot holds
//! its memory; a stopped one's only its disk. A fork is a new workspace
//! started from a snapshot (memory included) with a copy of its disk.

mod ops;
mod pool_host;
mod service_host;
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
    /// Its workspace's services' parts (each companion's machine then), in
    /// `services/<service>/` of its directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<crate::services::ServiceSnapshot>,
}

impl SnapshotInfo {
    /// The name a restore as a new workspace takes unless told otherwise:
    /// `<workspace>-restored` in the snapshot's workspace's namespace, the
    /// workspace's name cut so the whole is a valid name.
    pub fn restored_name(&self) -> String {
        let (short, namespace) = self
            .workspace
            .split_once('.')
            .map_or((self.workspace.as_str(), None), |(s, n)| (s, Some(n)));
        let name = suffixed_name(short, "restored");
        match namespace {
            Some(namespace) => format!("{name}.{namespace}"),
            None => name,
        }
    }
}

/// `<name>-<suffix>`, `name` cut so the whole is a valid name (at most 63
/// characters, no `-` left before the suffix's own).
pub(crate) fn suffixed_name(name: &str, suffix: &str) -> String {
    let room = base::store::name::MAX_NAME_LEN.saturating_sub(suffix.len() + 1);
    // Names are ASCII once checked; a record's odd name is cut on a
    // character all the same.
    let end = (0..=name.len().min(room))
        .rev()
        .find(|&i| name.is_char_boundary(i))
        .unwrap_or(0);
    let cut = name[..end].trim_end_matches('-');
    format!("{cut}-{suffix}")
}

/// The bytes the files in `dir` take on disk, its services' parts (two
/// levels down) included; links are not followed.
pub(crate) fn allocated_bytes(dir: &Path) -> u64 {
    tree_bytes(dir, 2)
}

fn tree_bytes(dir: &Path, depth: u8) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(path, m)| match (m.is_dir(), depth) {
            (true, 0) => 0,
            (true, _) => tree_bytes(&path, depth - 1),
            (false, _) => std::os::unix::fs::MetadataExt::blocks(&m) * 512,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use base::store::name::validate_full_name;

    fn info(workspace: &str) -> SnapshotInfo {
        SnapshotInfo {
            name: "s".into(),
            workspace: workspace.into(),
            created_at_ms: 0,
            spec: WorkspaceSpec::default(),
            has_memory: false,
            paused_ms: 0.0,
            size_bytes: 0,
            memory_sha256: None,
            disk_sha256: None,
            services: Vec::new(),
        }
    }

    #[test]
    fn a_restore_as_new_is_named_after_the_workspace_in_its_namespace() {
        assert_eq!(info("dev").restored_name(), "dev-restored");
        assert_eq!(info("dev.team").restored_name(), "dev-restored.team");
        let long = info(&"a".repeat(63)).restored_name();
        assert_eq!(long.len(), 63);
        validate_full_name(&long).unwrap();
        let dashed = info(&format!("{}-bcd", "a".repeat(53))).restored_name();
        assert_eq!(dashed, format!("{}-restored", "a".repeat(53)));
        validate_full_name(&dashed).unwrap();
        // Not a checked name: cut on a character, never a panic.
        let odd = info(&"é".repeat(40)).restored_name();
        assert!(odd.ends_with("-restored"), "{odd}");
    }
}
