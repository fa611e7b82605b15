//! Named volumes: persistent ext4 disks in `<state>/volumes/<name>/`
//! (`volume.ext4`, sparse, and `volume.json`) that outlive workspaces. A
//! workspace mounts them by name (`store::volume_mounts`); who may hold
//! one, and when, is the workspaces' concern. Contents are written without
//! root, as images are: `mkfs.ext4 -d`, then owners by `debugfs`.

mod disk_read;
mod export;
mod holders;
mod make;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::code::ErrorCode;
use crate::host::settings::{now_ms, unique_id};
use crate::remedy::Remedy;
use crate::store::name::{validate_full_name, NameError};
use crate::store::records::{RecordError, RecordLayout, RecordStore};
use crate::store::volume_mounts::VolumeMount;
use crate::store::workspace_dir::WorkspaceDir;
use crate::store::{write_json_atomic, StateDir, StoreError};

pub use export::{ExportLimits, RefusedEntry, EXPORT_MAX_DEPTH, EXPORT_MAX_ENTRIES, REFUSED_SHOWN};
pub use holders::{first_clash, holders_of, MountedVolume};
pub use make::VolumeSource;

/// The directory of volumes in the state directory.
pub const VOLUMES_DIR: &str = "volumes";
/// What every task cache volume's name starts with (the tasks of
/// `workspace::tasks` make them, one per agent, repository and slot); a
/// session of an agent may not make a volume so named.
pub const CACHE_PREFIX: &str = "task-cache-";
/// Where a task's cache volume is mounted in its guest: the guest's
/// `~/.cache` points into it.
pub const CACHE_MOUNT: &str = "/var/cache/microagent";
/// A volume's disk inside its directory.
pub const VOLUME_DISK: &str = "volume.ext4";
/// A volume's record inside its directory.
pub const VOLUME_RECORD: &str = "volume.json";
/// Size of a volume that names none, MiB (sparse: it costs what it holds).
pub const DEFAULT_SIZE_MIB: u64 = 1024;
/// Smallest and largest volume, MiB.
pub const SIZE_RANGE_MIB: std::ops::RangeInclusive<u64> = 16..=(1 << 20);
/// The guest account volumes belong to (`user`, uid and gid 1000 in the
/// images microagent builds), so it can write a read-write volume's root.
pub const GUEST_OWNER: (u32, u32) = (1000, 1000);

/// Why a volume operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// Bad volume name.
    #[error("invalid volume name `{name}`")]
    Name {
        /// The name given.
        name: String,
        /// What is wrong with it.
        #[source]
        source: NameError,
    },
    /// No volume of that name.
    #[error("volume `{0}` does not exist")]
    NotFound(String),
    /// The name is taken.
    #[error("volume `{0}` already exists")]
    Exists(String),
    /// A size, source or target is unusable.
    #[error("{0}")]
    Invalid(String),
    /// Workspaces mount it.
    #[error("volume `{name}` is mounted by workspace(s) {}", holders.join(", "))]
    InUse {
        /// The volume.
        name: String,
        /// The workspaces.
        holders: Vec<String>,
    },
    /// A host tool (mkfs.ext4, debugfs) is missing or failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The tool.
        tool: &'static str,
        /// What it said.
        detail: String,
    },
    /// A host tool ran past its deadline and was killed.
    #[error("{tool} took over {secs} s and was stopped")]
    ToolTimedOut {
        /// The tool.
        tool: &'static str,
        /// Its deadline.
        secs: u64,
    },
    /// An export would write more than its limit.
    #[error("the volume holds more than an export writes: over {limit} {what}")]
    ExportOverLimit {
        /// Entries, directory levels or bytes.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// The volume's disk did not read back as its own listing said (a
    /// damaged disk, or one written to mislead).
    #[error("reading the volume's disk: {0}")]
    DiskUnreadable(String),
    /// Reading or writing the state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, listing or removing a volume's record failed.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A host file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl VolumeError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            VolumeError::Name { .. }
            | VolumeError::Invalid(_)
            | VolumeError::ExportOverLimit { .. }
            | VolumeError::DiskUnreadable(_) => ErrorCode::InvalidInput,
            VolumeError::ToolTimedOut { .. } => ErrorCode::Timeout,
            VolumeError::NotFound(_) => ErrorCode::NotFound,
            VolumeError::Exists(_) | VolumeError::InUse { .. } => ErrorCode::Conflict,
            VolumeError::Tool { .. } => ErrorCode::HostUnsupported,
            VolumeError::Store(e) => e.code(),
            VolumeError::Record(e) => e.code(),
            VolumeError::Io { .. } => ErrorCode::Internal,
        }
    }

    /// What resolves it, if the caller can do something.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            VolumeError::NotFound(_) => Some(Remedy::ListVolumes),
            VolumeError::Exists(name) => Some(Remedy::ChooseAnotherVolumeName {
                volume: name.clone(),
            }),
            VolumeError::InUse { holders, .. } => Some(Remedy::DeleteWorkspacesFirst {
                workspaces: holders.clone(),
            }),
            _ => None,
        }
    }

    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| VolumeError::Io { what, source }
    }
}

/// What is kept of a volume besides its disk.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct VolumeRecord {
    name: String,
    size_mib: u64,
    created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<String>,
}

/// A volume as front ends show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct VolumeInfo {
    /// Its name.
    pub name: String,
    /// The filesystem's size, MiB.
    pub size_mib: u64,
    /// Host bytes its disk takes (it is sparse).
    pub used_bytes: u64,
    /// When it was made (Unix ms).
    pub created_at_ms: u64,
    /// What it was filled from (`dir PATH`, `tar PATH`), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The agent that owns it (made by that agent's MCP session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The workspaces that mount it.
    #[serde(default)]
    pub holders: Vec<VolumeHolder>,
}

/// A workspace that mounts a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct VolumeHolder {
    /// The workspace.
    pub workspace: String,
    /// Where the guest sees it.
    pub path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// Whether the workspace's VMM runs (starting, running or paused).
    pub active: bool,
}

/// What an export wrote.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct VolumeExport {
    /// The volume.
    pub name: String,
    /// The tar file written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Files, directories and links in it.
    pub entries: u64,
    /// Entries of the disk left out, and why (at most
    /// [`REFUSED_SHOWN`]): names holding `/`, `.`/`..` entries that are
    /// not the directory's own, a second entry of a name, a directory seen
    /// twice, device nodes, FIFOs and sockets.
    pub refused: Vec<RefusedEntry>,
    /// How many entries were left out, all of them.
    pub refused_entries: u64,
}

/// The volumes of one state directory.
#[derive(Clone, Debug)]
pub struct VolumeStore {
    records: RecordStore<VolumeRecord>,
}

impl VolumeStore {
    /// The volumes of `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            records: RecordStore::new(
                state.root().join(VOLUMES_DIR),
                RecordLayout::Folder(VOLUME_RECORD),
                |name| validate_full_name(name).is_ok(),
            ),
        }
    }

    /// The volumes directory.
    fn root(&self) -> &Path {
        self.records.dir()
    }

    fn dir(&self, name: &str) -> Result<PathBuf, VolumeError> {
        validate_full_name(name).map_err(|source| VolumeError::Name {
            name: name.to_owned(),
            source,
        })?;
        Ok(self.root().join(name))
    }

    /// The disk of volume `name` (whether or not it exists).
    pub fn disk(&self, name: &str) -> Result<PathBuf, VolumeError> {
        Ok(self.dir(name)?.join(VOLUME_DISK))
    }

    /// Makes volume `name` of `size_mib` (default [`DEFAULT_SIZE_MIB`], or
    /// what the source needs) from `source`. Nothing is left behind when
    /// it fails.
    /// `agent` owns it, if given.
    pub fn create(
        &self,
        name: &str,
        size_mib: Option<u64>,
        source: &VolumeSource,
        agent: Option<String>,
    ) -> Result<VolumeInfo, VolumeError> {
        let dir = self.dir(name)?;
        if let Some(size) = size_mib {
            if !SIZE_RANGE_MIB.contains(&size) {
                return Err(VolumeError::Invalid(format!(
                    "size {size} MiB; use {} MiB to {} MiB",
                    SIZE_RANGE_MIB.start(),
                    SIZE_RANGE_MIB.end()
                )));
            }
        }
        if dir.exists() {
            return Err(VolumeError::Exists(name.to_owned()));
        }
        crate::store::make_private_dir(self.root())?;
        let work = self.root().join(format!(".new-{name}-{}", unique_id()));
        let made = (|| {
            crate::store::make_private_dir(&work)?;
            let size_mib = make::make(&work, &work.join(VOLUME_DISK), size_mib, source)?;
            let record = VolumeRecord {
                name: name.to_owned(),
                size_mib,
                created_at_ms: now_ms(),
                source: source.describe(),
                agent,
            };
            write_json_atomic(&work.join(VOLUME_RECORD), &record)?;
            // The rename is the create: another one of the same name loses.
            std::fs::rename(&work, &dir).map_err(|e| {
                if dir.exists() {
                    VolumeError::Exists(name.to_owned())
                } else {
                    VolumeError::io(format!("moving the new volume to {}", dir.display()))(e)
                }
            })
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
        self.get(name)
    }

    /// Volume `name`, without its holders.
    pub fn get(&self, name: &str) -> Result<VolumeInfo, VolumeError> {
        let dir = self.dir(name)?;
        let record = self
            .records
            .get(name)?
            .ok_or_else(|| VolumeError::NotFound(name.to_owned()))?;
        let used_bytes = std::fs::metadata(dir.join(VOLUME_DISK))
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .map_err(VolumeError::io(format!("reading {}", dir.display())))?;
        Ok(VolumeInfo {
            name: record.name,
            size_mib: record.size_mib,
            used_bytes,
            created_at_ms: record.created_at_ms,
            source: record.source,
            agent: record.agent,
            holders: Vec::new(),
        })
    }

    /// Every volume, by name (unreadable ones are skipped).
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        Ok(self
            .records
            .names()?
            .iter()
            .filter_map(|n| self.get(n).ok())
            .collect())
    }

    /// Removes volume `name`; `holders` are the workspaces that mount it
    /// (any: CONFLICT, nothing removed).
    pub fn remove(&self, name: &str, holders: Vec<String>) -> Result<VolumeInfo, VolumeError> {
        let info = self.get(name)?;
        if !holders.is_empty() {
            return Err(VolumeError::InUse {
                name: name.to_owned(),
                holders,
            });
        }
        self.records.remove(name)?;
        Ok(info)
    }

    /// Writes volume `name`'s files to the new tar file `to` (owners,
    /// modes and links as the volume has them, set-id bits dropped) within
    /// [`ExportLimits::for_disk`]. The disk is a guest's: names it must
    /// not hold are left out and listed in [`VolumeExport::refused`]. The
    /// caller makes sure no running workspace writes it meanwhile.
    pub fn export(&self, name: &str, to: &Path) -> Result<VolumeExport, VolumeError> {
        let disk = self.disk(name)?;
        let disk_bytes = std::fs::metadata(&disk).map(|m| m.len()).unwrap_or(0);
        self.export_within(name, to, ExportLimits::for_disk(disk_bytes))
    }

    /// [`VolumeStore::export`] within `limits`.
    pub fn export_within(
        &self,
        name: &str,
        to: &Path,
        limits: ExportLimits,
    ) -> Result<VolumeExport, VolumeError> {
        self.get(name)?;
        let work = self.root().join(format!(".export-{name}-{}", unique_id()));
        crate::store::make_private_dir(&work)?;
        let result = export::export(&self.disk(name)?, &work, to, limits);
        let _ = std::fs::remove_dir_all(&work);
        let (bytes, walked) = result?;
        Ok(VolumeExport {
            name: name.to_owned(),
            path: to.to_owned(),
            bytes,
            entries: walked.entries,
            refused: walked.refused,
            refused_entries: walked.refused_entries,
        })
    }

    /// The disk behind `mount`, in slot `slot` of workspace `ws`: its own
    /// copy when it has one, else the named volume's.
    pub fn mount_disk(
        &self,
        ws: &WorkspaceDir,
        slot: usize,
        mount: &VolumeMount,
    ) -> Result<PathBuf, VolumeError> {
        if mount.own_copy {
            return Ok(ws.volume_copy(slot));
        }
        let disk = self.disk(&mount.name)?;
        if !disk.exists() {
            return Err(VolumeError::NotFound(mount.name.clone()));
        }
        Ok(disk)
    }

    /// Host bytes all volumes take.
    pub fn used_bytes(&self) -> u64 {
        self.list()
            .map(|l| l.iter().map(|v| v.used_bytes).sum())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod export_tests;
#[cfg(test)]
mod tests;
