//! Writing a volume's ext4 disk (empty, from a host directory or from a
//! tar file) without root: `mkfs.ext4 -d` copies a tree in, `debugfs`
//! sets owners. Reading it back out is [`super::export`].

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{VolumeError, DEFAULT_SIZE_MIB, GUEST_OWNER, SIZE_RANGE_MIB};
use crate::host::settings::host_tool;
use crate::host_tool::{HostTool, ToolLimits};
use crate::images::oci::owners::{Owners, Recorded};
use crate::images::oci::unpack::{apply_layer, Budget};

/// Most entries a tar source may hold.
const MAX_TAR_ENTRIES: u64 = 1_000_000;

/// What a new volume holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeSource {
    /// An empty filesystem.
    Empty,
    /// A copy of a host directory's files (owned by the guest's `user`).
    Dir(PathBuf),
    /// The files of a tar file (plain or gzip), with its owners.
    Tar(PathBuf),
}

impl VolumeSource {
    /// How `inspect` names it.
    pub(super) fn describe(&self) -> Option<String> {
        match self {
            VolumeSource::Empty => None,
            VolumeSource::Dir(p) => Some(format!("dir {}", p.display())),
            VolumeSource::Tar(p) => Some(format!("tar {}", p.display())),
        }
    }
}

/// Writes the disk `disk` (in the private directory `work`) from
/// `source`; returns its size in MiB.
pub(super) fn make(
    work: &Path,
    disk: &Path,
    size_mib: Option<u64>,
    source: &VolumeSource,
) -> Result<u64, VolumeError> {
    let (tree, owners) = match source {
        VolumeSource::Empty => (None, None),
        VolumeSource::Dir(dir) => {
            let meta = std::fs::metadata(dir).map_err(|e| {
                VolumeError::Invalid(format!("source directory {}: {e}", dir.display()))
            })?;
            if !meta.is_dir() {
                return Err(VolumeError::Invalid(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
            (Some(dir.clone()), Some(owned_by_guest_user(dir)))
        }
        VolumeSource::Tar(file) => {
            let tree = work.join("tree");
            let owners = unpack_tar(file, &tree, size_mib.unwrap_or(*SIZE_RANGE_MIB.end()))?;
            (Some(tree), Some(owners))
        }
    };
    let needed_mib = tree.as_deref().map_or(0, |t| {
        let (bytes, _) = crate::images::oci::rootfs::usage(t);
        (bytes + bytes / 10) / (1 << 20) + 16
    });
    let size_mib = match size_mib {
        Some(size) if size < needed_mib => {
            return Err(VolumeError::Invalid(format!(
                "the contents need about {needed_mib} MiB; the volume was to be {size} MiB: give a larger size"
            )))
        }
        Some(size) => size,
        None => DEFAULT_SIZE_MIB.max(needed_mib),
    };
    mkfs(disk, size_mib, tree.as_deref())?;
    if let (Some(tree), Some(owners)) = (&tree, owners) {
        owners
            .write_into(tree, disk)
            .map_err(|e| VolumeError::Tool {
                tool: "debugfs",
                detail: crate::error_chain::error_chain(&e),
            })?;
    }
    if let VolumeSource::Tar(_) = source {
        let _ = std::fs::remove_dir_all(work.join("tree"));
    }
    Ok(size_mib)
}

pub(super) fn tool(name: &'static str) -> Result<PathBuf, VolumeError> {
    host_tool(name).ok_or(VolumeError::Tool {
        tool: name,
        detail: "not installed; install e2fsprogs (apt-get install e2fsprogs)".into(),
    })
}

fn run(tool: HostTool, name: &'static str) -> Result<(), VolumeError> {
    let failed = |detail| VolumeError::Tool { tool: name, detail };
    let out = tool
        .output()
        .map_err(|e| failed(crate::error_chain::error_chain(&e)))?;
    if out.status.success() {
        return Ok(());
    }
    Err(failed(format!(
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// A sparse ext4 of `size_mib` whose root the guest's `user` owns, with
/// `tree`'s files when given.
fn mkfs(disk: &Path, size_mib: u64, tree: Option<&Path>) -> Result<(), VolumeError> {
    let file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(disk)
    .map_err(VolumeError::io(format!("creating {}", disk.display())))?;
    file.set_len(size_mib << 20)
        .map_err(VolumeError::io(format!("sizing {}", disk.display())))?;
    let (uid, gid) = GUEST_OWNER;
    let mut mkfs = HostTool::at("mkfs.ext4", tool("mkfs.ext4")?)
        .args(["-q", "-F", "-m", "0", "-T", "default", "-E"])
        .arg(format!(
            "root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1"
        ));
    if let Some(tree) = tree {
        mkfs = mkfs.arg("-d").arg(tree);
    }
    run(
        mkfs.arg(disk).limits(ToolLimits::writing(size_mib << 20)),
        "mkfs.ext4",
    )
}

/// Every path under `dir` as the guest's `user`'s, with its own mode.
fn owned_by_guest_user(dir: &Path) -> Owners {
    let (uid, gid) = GUEST_OWNER;
    let mut map = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            }
            let recorded = Recorded {
                uid,
                gid,
                mode: meta.mode() & 0o7777,
                device: None,
            };
            map.insert(entry.path(), recorded);
        }
    }
    Owners::Recorded(map)
}

/// Unpacks the tar `file` into `tree` within `limit_mib`, its owners set
/// or recorded.
fn unpack_tar(file: &Path, tree: &Path, limit_mib: u64) -> Result<Owners, VolumeError> {
    let bad = |e: std::io::Error| VolumeError::Invalid(format!("tar {}: {e}", file.display()));
    let mut hasher = Sha256::new();
    let mut input = std::fs::File::open(file).map_err(bad)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf).map_err(bad)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    // The digest of the bytes as read: apply_layer checks what it reads
    // against it, so a file changed meanwhile is refused.
    let diff_id = format!("sha256:{:x}", hasher.finalize());
    std::fs::create_dir(tree).map_err(VolumeError::io("making the volume's tree"))?;
    let mut owners = Owners::for_this_process();
    let mut budget = Budget::new(limit_mib << 20, MAX_TAR_ENTRIES);
    let input = std::fs::File::open(file).map_err(bad)?;
    apply_layer(tree, input, &diff_id, &mut owners, &mut budget).map_err(|e| {
        VolumeError::Invalid(format!(
            "tar {}: {}",
            file.display(),
            crate::error_chain::error_chain(&e)
        ))
    })?;
    Ok(owners)
}
