//! Applying an image layer (a tar, maybe gzip-compressed) to a directory
//! tree the way container runtimes do: entries replace what lower layers
//! left, `.wh.NAME` deletes NAME, `.wh..wh..opq` empties its directory of
//! what lower layers put there, and every path, even through a symlink a
//! lower layer made (`bin -> usr/bin`), resolves inside the tree, as if
//! the tree were `/`.
//!
//! The layer's uncompressed bytes are hashed while it is applied and must
//! match the image config's `diff_id`, so a layer is checked end to end
//! even when it came from a tarball with no compressed digest.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::owners::{Owners, Recorded};
use super::OciError;
use crate::guest::host_write;

/// The opaque-directory marker.
const OPAQUE: &str = ".wh..wh..opq";
/// The prefix of a whiteout.
const WHITEOUT: &str = ".wh.";

/// Reads through to `inner`, hashing every byte.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// The hex SHA-256 of a `sha256:` digest, checked for shape.
pub fn digest_hex(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::BadDigest(digest.to_owned())),
    }
}

/// Applies the layer read from `layer` (plain or gzip tar) to `tree`,
/// checking its uncompressed bytes against `diff_id`. Owners, modes and
/// device nodes are set on the tree, or recorded in `owners` when the
/// caller is not root.
pub fn apply_layer(
    tree: &Path,
    layer: impl Read,
    diff_id: &str,
    owners: &mut Owners,
) -> Result<(), OciError> {
    let expected = digest_hex(diff_id)?.to_owned();
    let mut buffered = BufReader::new(layer);
    let gzip = buffered
        .fill_buf()
        .map_err(|e| OciError::io("reading a layer", e))?
        .starts_with(&[0x1f, 0x8b]);
    let plain: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut hashing = Hashing {
        inner: plain,
        hash: Sha256::new(),
    };
    let root = host_write::open_dir_at(None, tree.as_os_str())
        .map_err(|e| OciError::io("opening the image tree", e))?;
    let mut applier = Applier {
        tree,
        root: &root,
        written: HashSet::new(),
        owners,
    };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        let entries = archive
            .entries()
            .map_err(|e| OciError::io("reading a layer", e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| OciError::io("reading a layer", e))?;
            applier.apply(&mut entry)?;
        }
    }
    // The tar ends with zero blocks the archive reader may not consume.
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| OciError::io("reading a layer", e))?;
    let actual = format!("{:x}", hashing.hash.finalize());
    if actual != expected {
        return Err(OciError::DigestMismatch {
            what: "layer (uncompressed)".into(),
            expected: diff_id.to_owned(),
            actual: format!("sha256:{actual}"),
        });
    }
    Ok(())
}

struct Applier<'a> {
    tree: &'a Path,
    root: &'a OwnedFd,
    /// Paths this layer wrote: an opaque marker keeps them.
    written: HashSet<PathBuf>,
    owners: &'a mut Owners,
}

impl Applier<'_> {
    fn apply(&mut self, entry: &mut tar::Entry<'_, impl Read>) -> Result<(), OciError> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let parts = clean_parts(Path::new(OsStr::from_bytes(&raw)))
            .ok_or_else(|| OciError::LayerPath(shown.clone()))?;
        let Some((name, dirs)) = parts.split_last() else {
            return Ok(()); // `./`: the root itself.
        };
        let parent = self.dir(dirs, &shown)?;
        let name_str = name.to_string_lossy();
        if name_str == OPAQUE {
            return self.make_opaque(&parent);
        }
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT) {
            if !hidden.is_empty() && hidden != "." && hidden != ".." {
                let gone = parent.join(hidden);
                remove_any(&gone)?;
                self.owners.forget(&gone);
            }
            return Ok(());
        }
        let path = parent.join(name);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);
        // What a conversion without root sets in the image afterwards.
        let recorded = Recorded {
            uid: uid as u32,
            gid: gid as u32,
            mode,
            device: None,
        };
        let io_at = |what: &str| {
            let at = format!("{what} /{shown}");
            move |e| OciError::io(at, e)
        };
        if kind.is_dir() {
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    remove_any(&path)?;
                    std::fs::create_dir(&path).map_err(io_at("creating"))?;
                }
                Err(_) => std::fs::create_dir(&path).map_err(io_at("creating"))?,
            }
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            remove_any(&path)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(io_at("creating"))?;
            io::copy(entry, &mut file).map_err(io_at("writing"))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| OciError::LayerPath(shown.clone()))?
                .into_owned();
            remove_any(&path)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                .map_err(io_at("linking"))?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| OciError::LayerPath(shown.clone()))?
                .into_owned();
            let target_shown = String::from_utf8_lossy(&target).into_owned();
            let target_parts = clean_parts(Path::new(OsStr::from_bytes(&target)))
                .ok_or_else(|| OciError::LayerPath(target_shown.clone()))?;
            let Some((target_name, target_dirs)) = target_parts.split_last() else {
                return Err(OciError::LayerPath(target_shown));
            };
            let from = self.dir(target_dirs, &target_shown)?.join(target_name);
            remove_any(&path)?;
            std::fs::hard_link(&from, &path).map_err(io_at("linking"))?;
            self.written.insert(path);
            // A hard link shares its target's inode: mode and owner are its.
            return Ok(());
        } else if matches!(
            kind,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
        ) {
            let major = header.device_major().ok().flatten().unwrap_or(0);
            let minor = header.device_minor().ok().flatten().unwrap_or(0);
            // 0:0 character devices are overlayfs's own whiteouts: in the
            // guest's overlay they would hide the path; skip them.
            if kind == tar::EntryType::Char && major == 0 && minor == 0 {
                return Ok(());
            }
            let file_type = match kind {
                tar::EntryType::Char => libc::S_IFCHR,
                tar::EntryType::Block => libc::S_IFBLK,
                _ => libc::S_IFIFO,
            };
            remove_any(&path)?;
            if !self.owners.direct() {
                // Device nodes need root: made in the image afterwards.
                let device = Some((file_type, major, minor));
                self.owners.record(&path, Recorded { device, ..recorded });
                return Ok(());
            }
            mknod(
                &path,
                file_type | (mode & 0o7777),
                libc::makedev(major, minor),
            )
            .map_err(io_at("creating"))?;
        } else {
            // PAX/GNU metadata entries are consumed by the tar reader; other
            // kinds (sockets) have no place in an image.
            return Ok(());
        }
        let direct = self.owners.direct();
        if direct {
            std::os::unix::fs::lchown(&path, Some(uid as u32), Some(gid as u32))
                .map_err(io_at("setting the owner of"))?;
        } else {
            self.owners.record(&path, recorded);
        }
        if !kind.is_symlink() {
            // chown cleared set-id bits: the mode goes after it. Without
            // root the tree's copy stays readable for mkfs (the image gets
            // the layer's mode).
            let mode = match (direct, kind.is_dir()) {
                (true, _) => mode,
                (false, true) => mode | 0o700,
                (false, false) => mode | 0o600,
            };
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(io_at("setting the mode of"))?;
        }
        set_mtime(&path, mtime).map_err(io_at("setting the time of"))?;
        self.written.insert(path);
        Ok(())
    }

    /// The real path of directory `dirs` (relative to the tree), following
    /// symlinks inside the tree and creating missing directories.
    fn dir(&mut self, dirs: &[&OsStr], shown: &str) -> Result<PathBuf, OciError> {
        let mut current = self.tree.to_path_buf();
        for dir in dirs {
            let next = current.join(dir);
            match std::fs::symlink_metadata(&next) {
                Ok(m) if m.is_dir() => current = next,
                Ok(m) if m.file_type().is_symlink() => {
                    let rel = next.strip_prefix(self.tree).unwrap_or(&next);
                    current = resolve_in_root(self.root, self.tree, rel)
                        .map_err(|e| OciError::io(format!("resolving /{shown}"), e))?;
                }
                Ok(_) => return Err(OciError::NotADirectory(shown.to_owned())),
                Err(_) => {
                    std::fs::create_dir(&next)
                        .map_err(|e| OciError::io(format!("creating a parent of /{shown}"), e))?;
                    self.written.insert(next.clone());
                    current = next;
                }
            }
        }
        Ok(current)
    }

    /// Empties `dir` of what this layer did not write.
    fn make_opaque(&mut self, dir: &Path) -> Result<(), OciError> {
        let entries = std::fs::read_dir(dir).map_err(|e| OciError::io("reading a directory", e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if !self.written.contains(&path) {
                remove_any(&path)?;
                self.owners.forget(&path);
            }
        }
        self.owners.forget_devices_in(dir, &self.written);
        Ok(())
    }
}

/// The normal components of an entry path, relative to the image's root
/// (a leading `/` and `.` parts dropped); `None` when a `..` would climb
/// out.
fn clean_parts(path: &Path) -> Option<Vec<&OsStr>> {
    host_write::clean_parts(path.strip_prefix("/").unwrap_or(path))
}

fn remove_any(path: &Path) -> Result<(), OciError> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(|e| OciError::io(format!("removing {}", path.display()), e))
}

/// Resolves `rel` as if `root` were `/` (openat2 RESOLVE_IN_ROOT: absolute
/// symlinks and `..` stay inside) to a directory's real path.
fn resolve_in_root(root: &OwnedFd, tree: &Path, rel: &Path) -> io::Result<PathBuf> {
    let fd = host_write::openat2(
        root,
        rel,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if !real.starts_with(tree) {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(real)
}

fn mknod(path: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = host_write::cstr(path.as_os_str())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    let c = host_write::cstr(path.as_os_str())?;
    let time = libc::timespec {
        tv_sec: mtime.min(i64::MAX as u64) as libc::time_t,
        tv_nsec: 0,
    };
    let times = [time, time];
    // SAFETY: `c` is NUL-terminated; `times` holds two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
