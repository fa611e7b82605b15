//! `volume export`: a disk a guest wrote, walked entry by entry and
//! written straight into a new tar file.
//!
//! Nothing read from the disk becomes a host path: debugfs lists each
//! directory by inode and reads each file and symlink target by inode
//! ([`super::disk_read`]), and the only host file written is the tar, which
//! the host creates itself (O_EXCL, 0600). Each tar path is built from
//! checked names: a name holding `/`, empty (or NUL-led: debugfs prints a
//! name up to its first NUL), or `.`/`..` is refused; a name already seen
//! in its directory is refused (the first entry of a name wins), so every
//! path is in the tar once and no entry lies beneath a symlink; symlinks
//! are stored as links, never followed, and the walk descends only into
//! inodes that are directories, each once (a hard-linked directory or a
//! loop is refused). Refused entries are skipped and reported; an export
//! over its limits (entries, directory depth, file bytes) fails and leaves
//! no tar.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufWriter;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::disk_read::{Debugfs, DirEntry, MAX_LISTING_BYTES};
use super::VolumeError;

/// Most entries (directories, files, links) an export writes.
pub const EXPORT_MAX_ENTRIES: u64 = 1_000_000;
/// Deepest directory an export descends into (levels below the root).
pub const EXPORT_MAX_DEPTH: usize = 256;
/// Longest symlink target taken (ext4's own limit).
const MAX_LINK_TARGET: u64 = 4095;
/// Directories listed by one debugfs run.
const DIRS_PER_RUN: usize = 128;
/// Files read by one debugfs run, and their bytes.
const FILES_PER_RUN: usize = 1024;
const BYTES_PER_RUN: u64 = 1 << 30;
/// Refused entries an export names (all are counted).
pub const REFUSED_SHOWN: usize = 100;
/// The ext4 root directory's inode.
const ROOT_INO: u32 = 2;

/// What an export may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportLimits {
    /// Most tar entries.
    pub max_entries: u64,
    /// Deepest directory level.
    pub max_depth: usize,
    /// Most bytes of file contents. A sparse file counts at its full
    /// length, as the tar holds it in full.
    pub max_bytes: u64,
}

impl ExportLimits {
    /// The defaults for a disk of `disk_bytes`: its own size in file bytes
    /// (only sparse files could hold more, and the tar would hold them in
    /// full), [`EXPORT_MAX_ENTRIES`], [`EXPORT_MAX_DEPTH`].
    pub fn for_disk(disk_bytes: u64) -> Self {
        Self {
            max_entries: EXPORT_MAX_ENTRIES,
            max_depth: EXPORT_MAX_DEPTH,
            max_bytes: disk_bytes,
        }
    }
}

/// An entry of the disk an export left out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct RefusedEntry {
    /// Its path on the volume as read (not valid UTF-8 shown lossily).
    pub path: String,
    /// Why it was left out.
    pub why: &'static str,
}

/// What the walk wrote.
#[derive(Debug, Default)]
pub(super) struct Walked {
    pub entries: u64,
    pub refused: Vec<RefusedEntry>,
    pub refused_entries: u64,
}

/// A directory to list.
struct Dir {
    ino: u32,
    parent: u32,
    path: PathBuf,
    depth: usize,
}

/// A file or symlink whose bytes are still to read.
struct Pending {
    entry: DirEntry,
    path: PathBuf,
    size: u64,
}

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

struct Walk<'a> {
    debugfs: Debugfs<'a>,
    tar: tar::Builder<BufWriter<File>>,
    limits: ExportLimits,
    mtime: u64,
    walked: Walked,
    file_bytes: u64,
    listing_budget: u64,
    seen_dirs: HashSet<u32>,
    /// The first path of each regular file's inode (later names become
    /// hard links to it).
    first_path: HashMap<u32, PathBuf>,
    hard_links: Vec<(DirEntry, PathBuf, PathBuf)>,
    pending: Vec<Pending>,
}

/// Writes `disk`'s files to the new tar file `to` (`work` is a private
/// directory for debugfs's command file); returns the tar's bytes and what
/// the walk wrote and refused. On failure no tar is left.
pub(super) fn export(
    disk: &Path,
    work: &Path,
    to: &Path,
    limits: ExportLimits,
) -> Result<(u64, Walked), VolumeError> {
    let debugfs = super::make::tool("debugfs")?;
    let out = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(to)
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            VolumeError::Invalid(format!("{} exists; name a new file", to.display()))
        }
        _ => VolumeError::io(format!("creating {}", to.display()))(e),
    })?;
    let walked = walk_into_tar(debugfs, disk, work, out, limits);
    let walked = match walked {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(to);
            return Err(e);
        }
    };
    let bytes = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    Ok((bytes, walked))
}

/// Walks `disk` (with `debugfs`, its command file in the private `work`)
/// into a tar on `out`.
fn walk_into_tar(
    debugfs_exe: PathBuf,
    disk: &Path,
    work: &Path,
    out: File,
    limits: ExportLimits,
) -> Result<Walked, VolumeError> {
    let tar = tar::Builder::new(BufWriter::new(out));
    let mut walk = Walk {
        debugfs: Debugfs::new(debugfs_exe, disk, work),
        tar,
        limits,
        mtime: crate::host::settings::now_ms() / 1000,
        walked: Walked::default(),
        file_bytes: 0,
        listing_budget: MAX_LISTING_BYTES,
        seen_dirs: HashSet::from([ROOT_INO]),
        first_path: HashMap::new(),
        hard_links: Vec::new(),
        pending: Vec::new(),
    };
    let mut level = vec![Dir {
        ino: ROOT_INO,
        parent: ROOT_INO,
        path: PathBuf::new(),
        depth: 0,
    }];
    while !level.is_empty() {
        let mut next = Vec::new();
        for chunk in level.chunks(DIRS_PER_RUN) {
            let inos: Vec<u32> = chunk.iter().map(|d| d.ino).collect();
            let listings = walk.debugfs.list(&inos, &mut walk.listing_budget)?;
            for (dir, listing) in chunk.iter().zip(listings) {
                for _ in 0..listing.unreadable {
                    walk.refuse(
                        &dir.path,
                        b"",
                        "a line of its directory's listing that is no entry (a name holding a newline)",
                    );
                }
                walk.directory(dir, listing.entries, &mut next)?;
            }
            walk.read_pending()?;
        }
        level = next;
    }
    for (entry, path, target) in std::mem::take(&mut walk.hard_links) {
        walk.count()?;
        let mut h = walk.header(&entry, tar::EntryType::Link, 0);
        walk.tar
            .append_link(&mut h, &path, &target)
            .map_err(write_failed)?;
    }
    walk.tar
        .into_inner()
        .map_err(write_failed)?
        .into_inner()
        .map_err(|e| write_failed(e.into_error()))?
        .sync_all()
        .map_err(write_failed)?;
    Ok(walk.walked)
}

fn write_failed(e: std::io::Error) -> VolumeError {
    VolumeError::io("writing the tar file")(e)
}

impl Walk<'_> {
    /// Takes `dir`'s entries: directories are written and queued for the
    /// next level, files and symlinks queued for reading.
    fn directory(
        &mut self,
        dir: &Dir,
        entries: Vec<DirEntry>,
        next: &mut Vec<Dir>,
    ) -> Result<(), VolumeError> {
        let mut names: HashSet<Vec<u8>> = HashSet::new();
        let (mut dot, mut dotdot) = (false, false);
        for entry in entries {
            let name = entry.name.as_slice();
            if name == b"." || name == b".." {
                let (seen, expected) = match name {
                    b"." => (&mut dot, dir.ino),
                    _ => (&mut dotdot, dir.parent),
                };
                if *seen || entry.ino != expected {
                    self.refuse(
                        &dir.path,
                        name,
                        "a second `.` or `..`, or one naming another directory",
                    );
                }
                *seen = true;
                continue;
            }
            if name.is_empty() {
                self.refuse(
                    &dir.path,
                    name,
                    "an empty name (or one that begins with NUL)",
                );
                continue;
            }
            if name.contains(&b'/') {
                self.refuse(&dir.path, name, "a name holding `/`");
                continue;
            }
            if !names.insert(name.to_vec()) {
                self.refuse(
                    &dir.path,
                    name,
                    "a second entry of this name in its directory (the first is kept)",
                );
                continue;
            }
            if dir.depth == 0 && name == b"lost+found" && entry.mode & S_IFMT == S_IFDIR {
                continue;
            }
            let path = dir.path.join(std::ffi::OsStr::from_bytes(name));
            match entry.mode & S_IFMT {
                S_IFDIR => {
                    if !self.seen_dirs.insert(entry.ino) {
                        self.refuse(
                            &dir.path,
                            name,
                            "a directory already exported (a hard-linked directory or a loop)",
                        );
                        continue;
                    }
                    if dir.depth + 1 > self.limits.max_depth {
                        return Err(VolumeError::ExportOverLimit {
                            what: "directory levels",
                            limit: self.limits.max_depth as u64,
                        });
                    }
                    self.count()?;
                    let mut h = self.header(&entry, tar::EntryType::Directory, 0);
                    self.tar
                        .append_data(&mut h, &path, std::io::empty())
                        .map_err(write_failed)?;
                    next.push(Dir {
                        ino: entry.ino,
                        parent: dir.ino,
                        path,
                        depth: dir.depth + 1,
                    });
                }
                S_IFREG => {
                    if let Some(first) = self.first_path.get(&entry.ino) {
                        let first = first.clone();
                        self.hard_links.push((entry, path, first));
                        continue;
                    }
                    let size = entry.size.unwrap_or(0);
                    self.file_bytes = self
                        .file_bytes
                        .checked_add(size)
                        .filter(|&b| b <= self.limits.max_bytes)
                        .ok_or(VolumeError::ExportOverLimit {
                            what: "bytes of files (a sparse file counts at its full length)",
                            limit: self.limits.max_bytes,
                        })?;
                    self.first_path.insert(entry.ino, path.clone());
                    self.queue(entry, path, size)?;
                }
                S_IFLNK => {
                    let size = entry.size.unwrap_or(0);
                    if size == 0 || size > MAX_LINK_TARGET {
                        self.refuse(
                            &dir.path,
                            name,
                            "a symlink whose target is empty or over 4095 bytes",
                        );
                        continue;
                    }
                    self.queue(entry, path, size)?;
                }
                _ => self.refuse(
                    &dir.path,
                    name,
                    "a device node, FIFO or socket (not exported)",
                ),
            }
        }
        Ok(())
    }

    fn queue(&mut self, entry: DirEntry, path: PathBuf, size: u64) -> Result<(), VolumeError> {
        self.pending.push(Pending { entry, path, size });
        let bytes: u64 = self.pending.iter().map(|p| p.size).sum();
        if self.pending.len() >= FILES_PER_RUN || bytes >= BYTES_PER_RUN {
            self.read_pending()?;
        }
        Ok(())
    }

    /// Reads the queued files and symlink targets into the tar.
    fn read_pending(&mut self) -> Result<(), VolumeError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        let mut refused = Vec::new();
        let links: Vec<(u32, u64)> = pending
            .iter()
            .filter(|p| p.entry.mode & S_IFMT == S_IFLNK)
            .map(|p| (p.entry.ino, p.size))
            .collect();
        if !links.is_empty() {
            let mut targets = self.debugfs.link_targets(&links)?.into_iter();
            let mut slow = Vec::new();
            for p in pending {
                if p.entry.mode & S_IFMT != S_IFLNK {
                    slow.push(p);
                    continue;
                }
                match targets.next().flatten() {
                    Some(target) if target.contains(&0) => refused.push(p.path),
                    Some(target) => self.symlink(&p, &target)?,
                    None => slow.push(p),
                }
            }
            pending = slow;
        }
        let wanted: Vec<(u32, u64)> = pending.iter().map(|p| (p.entry.ino, p.size)).collect();
        let bytes: u64 = wanted.iter().map(|w| w.1).sum();
        // Slow disks and big files: a minute, and a second per 16 MiB.
        let deadline = Duration::from_secs(60 + (bytes >> 24));
        let debugfs = &self.debugfs;
        let tar = &mut self.tar;
        let (mtime, walked) = (self.mtime, &mut self.walked);
        let limit = self.limits.max_entries;
        debugfs.read_each(&wanted, deadline, |at, body| {
            let p = &pending[at];
            if p.entry.mode & S_IFMT == S_IFLNK {
                let mut target = Vec::new();
                body.read_to_end(&mut target).map_err(write_failed)?;
                if target.contains(&0) {
                    refused.push(p.path.clone());
                    return Ok(());
                }
                count(walked, limit)?;
                let mut h = header(&p.entry, tar::EntryType::Symlink, 0, mtime);
                let target = Path::new(std::ffi::OsStr::from_bytes(&target));
                return tar
                    .append_link(&mut h, &p.path, target)
                    .map_err(write_failed);
            }
            count(walked, limit)?;
            let mut h = header(&p.entry, tar::EntryType::Regular, p.size, mtime);
            tar.append_data(&mut h, &p.path, body).map_err(write_failed)
        })?;
        for path in refused {
            let (dir, name) = (path.parent().unwrap_or(Path::new("")), path.file_name());
            let name = name.map(|n| n.as_bytes().to_vec()).unwrap_or_default();
            self.refuse(dir, &name, "a symlink whose target holds NUL");
        }
        Ok(())
    }

    fn symlink(&mut self, p: &Pending, target: &[u8]) -> Result<(), VolumeError> {
        self.count()?;
        let mut h = self.header(&p.entry, tar::EntryType::Symlink, 0);
        let target = Path::new(std::ffi::OsStr::from_bytes(target));
        self.tar
            .append_link(&mut h, &p.path, target)
            .map_err(write_failed)
    }

    fn count(&mut self) -> Result<(), VolumeError> {
        count(&mut self.walked, self.limits.max_entries)
    }

    fn header(&self, entry: &DirEntry, kind: tar::EntryType, size: u64) -> tar::Header {
        header(entry, kind, size, self.mtime)
    }

    fn refuse(&mut self, dir: &Path, name: &[u8], why: &'static str) {
        self.walked.refused_entries += 1;
        if self.walked.refused.len() < REFUSED_SHOWN {
            let mut path = dir.as_os_str().as_bytes().to_vec();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            self.walked.refused.push(RefusedEntry {
                path: String::from_utf8_lossy(&path).into_owned(),
                why,
            });
        }
    }
}

fn count(walked: &mut Walked, limit: u64) -> Result<(), VolumeError> {
    if walked.entries >= limit {
        return Err(VolumeError::ExportOverLimit {
            what: "entries",
            limit,
        });
    }
    walked.entries += 1;
    Ok(())
}

/// A tar header with the inode's owners and permission bits (set-id bits
/// dropped: a guest's set-uid file stays plain when root unpacks it).
fn header(entry: &DirEntry, kind: tar::EntryType, size: u64, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    let keep = if kind == tar::EntryType::Directory {
        0o1777
    } else {
        0o777
    };
    h.set_mode(entry.mode & keep);
    h.set_uid(entry.uid.into());
    h.set_gid(entry.gid.into());
    h.set_mtime(mtime);
    h.set_size(size);
    h
}
