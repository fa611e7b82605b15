//! What makes a snapshot directory trustworthy once its VMM wrote it: its
//! files and the directory itself are on disk before it is renamed into
//! place ([`sync_tree`], then [`sync_dir`] of the parent after the
//! rename), and the digests of its memory file and disk copy are recorded,
//! to be checked before it is resumed. Both digests are
//! `vmm_core::snapshot::memory_file::digest`: over each non-zero page, so
//! they cost what the guest used and not how the filesystem laid it out.

use std::path::Path;

use vmm_core::snapshot::SnapshotFiles;

/// The index of the workspace's writable disk among its machine's disks
/// (0 is the image's read-only root filesystem).
pub const WORKSPACE_DISK: usize = 1;

fn digest_of(path: &Path) -> std::io::Result<String> {
    vmm_core::snapshot::memory_file::digest(path)
        .map_err(|e| std::io::Error::other(crate::error_chain::error_chain(&e)))
}

/// A sealed file of a snapshot directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sealed {
    /// Guest memory (`memory.raw`).
    Memory,
    /// The copy of the workspace's writable disk.
    Disk,
}

impl Sealed {
    fn name(self) -> &'static str {
        match self {
            Sealed::Memory => "memory",
            Sealed::Disk => "disk",
        }
    }

    /// The file's digest in the snapshot directory `dir`; a read error
    /// keeps its causes in its message.
    pub fn digest(self, dir: &Path) -> std::io::Result<String> {
        let files = SnapshotFiles::new(dir);
        digest_of(&match self {
            Sealed::Memory => files.memory(),
            Sealed::Disk => files.disk(WORKSPACE_DISK),
        })
    }

    /// Whether the file in `dir` still has the digest `want`; why not.
    pub fn check(self, dir: &Path, want: Option<&str>) -> std::result::Result<(), String> {
        let what = self.name();
        let Some(want) = want else {
            return Err(format!(
                "its record has no {what} digest (an older build took it)"
            ));
        };
        let found = self.digest(dir).map_err(|e| e.to_string())?;
        if found != want {
            return Err(format!(
                "its {what} file does not match its digest (it was changed or damaged)"
            ));
        }
        Ok(())
    }
}

/// Fails, saying why, unless the machine in the snapshot directory `dir`
/// reads whole: its disk copy (older builds recorded no disk digest:
/// theirs is taken as it is) and, with `has_memory`, its state file
/// (magic, version, length, checksum) and memory file.
pub fn check_machine(
    dir: &Path,
    has_memory: bool,
    memory_sha256: Option<&str>,
    disk_sha256: Option<&str>,
) -> std::result::Result<(), String> {
    if disk_sha256.is_some() {
        Sealed::Disk.check(dir, disk_sha256)?;
    }
    if !has_memory {
        return Ok(());
    }
    vmm_core::snapshot::MachineState::read(&SnapshotFiles::new(dir))
        .map_err(|e| crate::error_chain::error_chain(&e))?;
    Sealed::Memory.check(dir, memory_sha256)
}

/// Flushes every regular file directly in `dir`, then `dir` itself.
pub fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    sync_dir(dir)
}

/// Flushes the directory `dir` (its entries: a rename into it).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_follow_content_and_name_what_changed() {
        let dir =
            std::env::temp_dir().join(format!("ma-seal-{}", crate::host::settings::unique_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = SnapshotFiles::new(&dir);
        std::fs::write(files.memory(), vec![1u8; 8192]).unwrap();
        std::fs::write(files.disk(WORKSPACE_DISK), vec![2u8; 8192]).unwrap();
        let memory = Sealed::Memory.digest(&dir).unwrap();
        let disk = Sealed::Disk.digest(&dir).unwrap();
        assert_ne!(memory, disk);
        sync_tree(&dir).unwrap();
        Sealed::Memory.check(&dir, Some(&memory)).unwrap();
        Sealed::Disk.check(&dir, Some(&disk)).unwrap();
        let err = Sealed::Disk.check(&dir, None).unwrap_err();
        assert!(err.contains("no disk digest"), "{err}");
        std::fs::write(files.disk(WORKSPACE_DISK), vec![3u8; 8192]).unwrap();
        let err = Sealed::Disk.check(&dir, Some(&disk)).unwrap_err();
        assert!(err.contains("disk file does not match"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
