//! Writing what a guest sends into a host directory, safely: `copy_out`.
//!
//! The guest is not trusted. Its file lands in a temporary file of a random
//! name, created O_EXCL|O_NOFOLLOW (a planted symlink is never written
//! through), and is renamed over the target only when complete; its mode
//! loses set-id bits and honours the umask. A directory arrives as a tar
//! archive, streamed to such a temporary file under a byte budget, then
//! unpacked entry by entry: every path is relative and free of `..`, every
//! directory on the way is opened with O_NOFOLLOW from the destination
//! down (so nothing is written through a symlink), symlinks and hard links
//! must point inside the destination, device nodes and FIFOs are refused.
//! Git metadata (any path through a `.git`) is left out unless asked for:
//! a guest-written `.git/config` or hook runs code at the host's next `git`
//! command.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use base::host::dirfd::{
    self, clean_parts, cstr, fchmod, is_regular_file, linkat, make_dir, open_dir_at, openat2,
    random_hex, replace_with, stays_inside, symlinkat, sync_fs, umask, write_file,
};

/// Most bytes one `copy_out` takes from a guest (file or archive).
pub const COPY_OUT_MAX_BYTES: u64 = base::store::spec::LIMITS.max_copy_out_bytes;
/// How much a guest file may grow while `copy_out` copies it (beyond the
/// size the guest reported when asked).
pub const COPY_OUT_GROWTH: u64 = 64 << 20;
/// Most entries of one directory `copy_out`.
pub const COPY_OUT_MAX_ENTRIES: u64 = base::store::spec::LIMITS.max_copy_out_entries;

/// Why a guest's data was not written.
#[derive(Debug, thiserror::Error)]
pub enum HostWriteError {
    /// An archive entry would leave the destination or is not allowed.
    #[error("refused archive entry {entry}: {why}")]
    Refused {
        /// The entry's path as the guest sent it.
        entry: String,
        /// Why.
        why: &'static str,
    },
    /// The guest sent more than a copy may take.
    #[error("the copy is over its budget of {limit} {what}")]
    OverBudget {
        /// Bytes or entries.
        what: &'static str,
        /// The budget.
        limit: u64,
    },
    /// A host file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HostWriteError {
    let what = what.into();
    move |source| HostWriteError::Io { what, source }
}

/// A new file of a random name beside `target`, removed when dropped
/// unless [`TempFile::persist`]ed.
#[derive(Debug)]
pub struct TempFile {
    path: Option<PathBuf>,
    file: File,
}

impl TempFile {
    /// Creates `.NAME.RANDOM.microagent-part` beside `target`: mode 0600,
    /// O_EXCL|O_NOFOLLOW, so nothing already there is opened.
    pub fn beside(target: &Path) -> Result<Self, HostWriteError> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = target.parent().unwrap_or(Path::new("."));
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut tries = 0;
        loop {
            let path = dir.join(format!(".{name}.{}.microagent-part", random_hex()));
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(file) => {
                    return Ok(Self {
                        path: Some(path),
                        file,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
                Err(e) => return Err(io_err(format!("creating {}", path.display()))(e)),
            }
        }
    }

    /// The open file.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Removes its name and keeps the open file: what is read back from it
    /// (an archive to unpack) leaves nothing behind, whatever happens next.
    pub fn unlink(&mut self) -> Result<(), HostWriteError> {
        match self.path.take() {
            Some(path) => {
                std::fs::remove_file(&path).map_err(io_err(format!("removing {}", path.display())))
            }
            None => Ok(()),
        }
    }

    /// An async writer on the file that takes at most `budget` bytes (what
    /// a guest streams into it).
    pub fn budgeted_writer(
        &self,
        budget: u64,
    ) -> Result<Budgeted<tokio::fs::File>, HostWriteError> {
        let shown = self.path.as_deref().unwrap_or(Path::new("")).display();
        let file = self
            .file
            .try_clone()
            .map_err(io_err(format!("opening {shown} again")))?;
        Ok(Budgeted::new(tokio::fs::File::from_std(file), budget))
    }

    /// Gives it `mode` (set-id bits dropped, the umask applied) and renames
    /// it to `target`.
    pub fn persist(mut self, mode: u32, target: &Path) -> Result<(), HostWriteError> {
        let path = self.path.take().unwrap_or_default();
        let result = fchmod(&self.file, mode & 0o777 & !umask())
            .map_err(io_err(format!("setting the mode of {}", path.display())))
            // On disk before it replaces what was there: a failing disk
            // (EIO, ENOSPC at writeback) fails the copy, not a later read.
            .and_then(|()| {
                self.file
                    .sync_all()
                    .map_err(io_err(format!("writing {}", target.display())))
            })
            .and_then(|()| {
                std::fs::rename(&path, target)
                    .map_err(io_err(format!("writing {}", target.display())))
            });
        if result.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        result
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A writer that fails once more than `limit` bytes went through it.
#[derive(Debug)]
pub struct Budgeted<W> {
    inner: W,
    left: u64,
    limit: u64,
}

impl<W> Budgeted<W> {
    /// `inner`, taking at most `limit` bytes.
    pub fn new(inner: W, limit: u64) -> Self {
        Self {
            inner,
            left: limit,
            limit,
        }
    }

    /// The writer it wraps.
    pub fn into_inner(self) -> W {
        self.inner
    }

    /// Whether a write was refused for the budget.
    pub fn exhausted(&self) -> bool {
        self.left == 0
    }

    /// The error for an exhausted budget.
    pub fn over(&self) -> HostWriteError {
        HostWriteError::OverBudget {
            what: "bytes",
            limit: self.limit,
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Budgeted<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        if buf.len() as u64 > self.left {
            self.left = 0;
            return std::task::Poll::Ready(Err(io::Error::other("over the copy's byte budget")));
        }
        let me = &mut *self;
        let polled = std::pin::Pin::new(&mut me.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            me.left -= *n as u64;
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What an unpack may write.
#[derive(Clone, Copy, Debug)]
pub struct UnpackRules {
    /// Most entries it takes.
    pub max_entries: u64,
    /// Whether entries through a `.git` are written (default: left out).
    pub git_metadata: bool,
}

/// What an unpack wrote and left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries written.
    pub entries: u64,
    /// The `.git` paths left out (each once, at most [`LEFT_OUT_SHOWN`]).
    pub left_out: Vec<String>,
    /// Entries left out, all of them.
    pub left_out_entries: u64,
}

/// Most left-out paths an [`Unpacked`] names.
pub const LEFT_OUT_SHOWN: usize = 100;

/// Whether `part` names git metadata (`.git` in any case: a case-folding
/// host filesystem would take `.GIT` for it).
pub fn is_git_metadata(part: &OsStr) -> bool {
    part.as_bytes().eq_ignore_ascii_case(b".git")
}

/// Unpacks the tar `archive` into the existing directory `dest` (merging
/// into what is there).
pub fn unpack(
    archive: impl Read,
    dest: &Path,
    rules: UnpackRules,
) -> Result<Unpacked, HostWriteError> {
    let max_entries = rules.max_entries;
    let root = open_dir_at(None, dest.as_os_str())
        .map_err(io_err(format!("opening {}", dest.display())))?;
    let mut archive = tar::Archive::new(archive);
    let entries = archive
        .entries()
        .map_err(io_err("reading the guest's archive"))?;
    // Read once: /proc/self/status for every file would be work per entry.
    let umask = umask();
    let mut count = 0u64;
    let mut unpacked = Unpacked::default();
    // Links are checked once all are written: a later link can make an
    // earlier one's target leave the destination (`sub/e -> d/../../x`,
    // then `sub/d -> ..`).
    let mut links: Vec<(PathBuf, String)> = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(io_err("reading the guest's archive"))?;
        count += 1;
        if count > max_entries {
            return Err(HostWriteError::OverBudget {
                what: "entries",
                limit: max_entries,
            });
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let refuse = |why| HostWriteError::Refused {
            entry: shown.clone(),
            why,
        };
        let parts = clean_parts(Path::new(OsStr::from_bytes(&raw)))
            .ok_or_else(|| refuse("its path is absolute or has `..`"))?;
        let Some((name, dirs)) = parts.split_last() else {
            continue; // `./`: the destination itself.
        };
        if let Some(at) = parts.iter().position(|p| is_git_metadata(p)) {
            if !rules.git_metadata {
                unpacked.left_out_entries += 1;
                let shown: PathBuf = parts[..=at].iter().collect();
                let shown = shown.to_string_lossy().into_owned();
                if unpacked.left_out.len() < LEFT_OUT_SHOWN && !unpacked.left_out.contains(&shown) {
                    unpacked.left_out.push(shown);
                }
                continue;
            }
        }
        let parent = open_dirs(&root, dirs, true, &refuse)?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let kind = entry.header().entry_type();
        let at = |what: &str| format!("{what} {}/{shown}", dest.display());
        if kind.is_dir() {
            make_dir(&parent, name, mode).map_err(|e| match e.raw_os_error() {
                Some(libc::EEXIST) => refuse("a non-directory is in its place"),
                _ => io_err(at("creating"))(e),
            })?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            write_file(&parent, name, mode & !umask, &mut entry).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::EISDIR) | Some(libc::ENOTEMPTY) => {
                        refuse("a directory is in its place")
                    }
                    _ => io_err(at("writing"))(e),
                }
            })?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refuse("a symlink without a target"))?
                .into_owned();
            let target = Path::new(OsStr::from_bytes(&target));
            if !stays_inside(dirs, target) {
                return Err(refuse("a symlink pointing outside the destination"));
            }
            replace_with(&parent, name, |p, n| symlinkat(target, p, n))
                .map_err(io_err(at("linking")))?;
            let mut rel: PathBuf = dirs.iter().collect();
            rel.push(name);
            links.push((rel, shown.clone()));
        } else if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refuse("a hard link without a target"))?
                .into_owned();
            let target_parts = clean_parts(Path::new(OsStr::from_bytes(&target)))
                .ok_or_else(|| refuse("a hard link pointing outside the destination"))?;
            let Some((target_name, target_dirs)) = target_parts.split_last() else {
                return Err(refuse("a hard link to the destination itself"));
            };
            // Its name is no way into git metadata left out (an existing
            // repository's `.git/config` when merging).
            if !rules.git_metadata && target_parts.iter().any(|p| is_git_metadata(p)) {
                return Err(refuse("a hard link into git metadata"));
            }
            // What it links to was copied (or was there): nothing is made
            // on its way.
            let from = open_dirs(&root, target_dirs, false, &refuse)?;
            if !is_regular_file(&from, target_name) {
                return Err(refuse("a hard link to something not copied as a file"));
            }
            replace_with(&parent, name, |p, n| linkat(&from, target_name, p, n))
                .map_err(io_err(at("linking")))?;
        } else {
            return Err(refuse("device nodes, FIFOs and sockets are not copied"));
        }
    }
    check_links(&root, &links)?;
    // On disk before the copy counts (a failing disk says so here).
    sync_fs(&root).map_err(io_err(format!("writing into {}", dest.display())))?;
    unpacked.entries = count - unpacked.left_out_entries;
    Ok(unpacked)
}

/// Follows each of `links` (paths below `root`) as the kernel would, held
/// beneath `root` (openat2 `RESOLVE_BENEATH`): one that leads out is
/// removed, with every other link of the copy that does, and the copy is
/// refused. A link to nothing yet, or a loop, stays: it leads nowhere.
fn check_links(root: &OwnedFd, links: &[(PathBuf, String)]) -> Result<(), HostWriteError> {
    let mut escaping = Vec::new();
    for (rel, shown) in links {
        match openat2(
            root,
            rel,
            libc::O_PATH,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => escaping.push((rel, shown)),
            _ => {}
        }
    }
    let Some((_, first)) = escaping.first() else {
        return Ok(());
    };
    let entry = (*first).clone();
    for (rel, _) in &escaping {
        let (Some(name), dirs) = (rel.file_name(), rel.parent()) else {
            continue;
        };
        let parts: Vec<&OsStr> = dirs.map(|d| d.iter().collect()).unwrap_or_default();
        let refuse = |why| HostWriteError::Refused {
            entry: entry.clone(),
            why,
        };
        let parent = open_dirs(root, &parts, false, &refuse)?;
        let c = cstr(name).map_err(io_err("removing a link"))?;
        // SAFETY: `c` is NUL-terminated; unlinkat removes the name only.
        unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), 0) };
    }
    Err(HostWriteError::Refused {
        entry,
        why: "a symlink whose target leaves the destination through other links",
    })
}

/// [`dirfd::open_dirs`]; a symlink or a file in the way is refused.
fn open_dirs(
    root: &OwnedFd,
    dirs: &[&OsStr],
    create: bool,
    refuse: &dyn Fn(&'static str) -> HostWriteError,
) -> Result<OwnedFd, HostWriteError> {
    dirfd::open_dirs(root, dirs, create).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            refuse("its path goes through a symlink or a file")
        }
        Some(libc::ENOENT) => refuse("it names what was not copied"),
        _ => io_err("opening a directory")(e),
    })
}

#[cfg(test)]
mod tests {
    // Tests of `host_write`: hostile archives, planted symlinks, budgets, modes.

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory with `dest/` (the copy's destination) and
    /// `outside/victim` (what a hostile archive would reach).
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ma-hostwrite-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("dest")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("outside/victim"), "untouched").unwrap();
        dir
    }

    /// One archive entry with raw path and link bytes (tar's own builder
    /// refuses the hostile ones we need).
    fn entry(
        out: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        path: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..path.len()].copy_from_slice(path.as_bytes());
        gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        out.append(&h, data).unwrap();
    }

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    const RULES: UnpackRules = UnpackRules {
        max_entries: COPY_OUT_MAX_ENTRIES,
        git_metadata: false,
    };

    fn unpack_into(dir: &Path, bytes: &[u8]) -> Result<u64, HostWriteError> {
        unpack(bytes, &dir.join("dest"), RULES).map(|u| u.entries)
    }

    #[test]
    fn a_hard_link_through_git_metadata_creates_nothing() {
        let dir = scratch("git-link");
        let dest = dir.join("dest");
        std::fs::create_dir_all(dest.join("repo/.git")).unwrap();
        std::fs::write(dest.join("repo/.git/config"), "[core]").unwrap();
        for target in ["repo/.git/config", "new/.git/hooks/x", "missing/dirs/f"] {
            let bytes = archive(|b| {
                entry(b, tar::EntryType::Link, "a", target, 0o644, b"");
            });
            let err = unpack(bytes.as_slice(), &dest, RULES).unwrap_err();
            assert!(
                matches!(err, HostWriteError::Refused { .. }),
                "{target}: {err}"
            );
            assert!(!dest.join("a").exists(), "{target}");
        }
        assert!(!dest.join("new").exists() && !dest.join("missing").exists());
        victim_untouched(&dir);
    }

    #[test]
    fn git_metadata_is_left_out_unless_asked_for() {
        let dir = scratch("git");
        let bytes = archive(|b| {
            use tar::EntryType::{Directory, Regular, Symlink};
            entry(b, Directory, "repo/", "", 0o755, b"");
            entry(b, Regular, "repo/main.rs", "", 0o644, b"fn main() {}");
            entry(b, Directory, "repo/.git/", "", 0o755, b"");
            entry(b, Regular, "repo/.git/config", "", 0o644, b"[core]");
            entry(
                b,
                Regular,
                "repo/.git/hooks/pre-commit",
                "",
                0o755,
                b"#!/bin/sh",
            );
            entry(b, Regular, "sub/.GIT/config", "", 0o644, b"[core]");
            entry(b, Symlink, ".git", "repo", 0o777, b"");
        });
        let dest = dir.join("dest");
        let got = unpack(bytes.as_slice(), &dest, RULES).unwrap();
        assert_eq!(got.entries, 2, "repo/ and repo/main.rs");
        assert_eq!(got.left_out_entries, 5);
        assert_eq!(got.left_out, ["repo/.git", "sub/.GIT", ".git"]);
        assert!(dest.join("repo/main.rs").is_file());
        for gone in ["repo/.git", "sub/.GIT", ".git"] {
            assert!(
                std::fs::symlink_metadata(dest.join(gone)).is_err(),
                "{gone}"
            );
        }

        let asked = UnpackRules {
            git_metadata: true,
            ..RULES
        };
        let got = unpack(bytes.as_slice(), &dest, asked).unwrap();
        assert_eq!((got.entries, got.left_out_entries), (7, 0));
        assert!(dest.join("repo/.git/hooks/pre-commit").is_file());
        victim_untouched(&dir);
    }

    fn victim_untouched(dir: &Path) {
        assert_eq!(
            std::fs::read_to_string(dir.join("outside/victim")).unwrap(),
            "untouched"
        );
        let names: Vec<_> = std::fs::read_dir(dir.join("outside")).unwrap().collect();
        assert_eq!(names.len(), 1, "nothing new outside the destination");
    }

    #[test]
    fn a_plain_tree_is_unpacked_with_safe_modes() {
        let dir = scratch("plain");
        let bytes = archive(|b| {
            use tar::EntryType as T;
            entry(b, T::Directory, "./", "", 0o755, b"");
            entry(b, T::Directory, "./src", "", 0o755, b"");
            entry(b, T::Regular, "./src/a.txt", "", 0o644, b"hello");
            entry(b, T::Regular, "./run.sh", "", 0o4777, b"#!/bin/sh");
            entry(b, T::Symlink, "./src/link", "a.txt", 0o777, b"");
            entry(b, T::Symlink, "./up", "src/../src/a.txt", 0o777, b"");
            entry(b, T::Link, "./src/hard", "src/a.txt", 0o644, b"");
        });
        assert_eq!(unpack_into(&dir, &bytes).unwrap(), 7);
        let dest = dir.join("dest");
        assert_eq!(
            std::fs::read_to_string(dest.join("src/a.txt")).unwrap(),
            "hello"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("src/link")).unwrap(),
            "hello"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("src/hard")).unwrap(),
            "hello"
        );
        let mode = std::fs::metadata(dest.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o7777,
            0o777 & !umask(),
            "set-id bits dropped, umask applied"
        );
        // A second copy merges: files are replaced, not written through.
        assert_eq!(unpack_into(&dir, &bytes).unwrap(), 7);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Each link is lexically inside, but together they lead out: the
    /// later link `sub/d -> ..` turns `sub/e -> d/../../outside/victim`
    /// into a way out. Both orders are refused and the links removed.
    #[test]
    fn chains_of_links_that_lead_out_are_refused() {
        use tar::EntryType as T;
        for (tag, later_first) in [("chain-a", false), ("chain-b", true)] {
            let dir = scratch(tag);
            let bytes = archive(|b| {
                entry(b, T::Directory, "sub", "", 0o755, b"");
                let (d, e) = (("sub/d", ".."), ("sub/e", "d/../../outside/victim"));
                let order = if later_first { [e, d] } else { [d, e] };
                for (path, link) in order {
                    entry(b, T::Symlink, path, link, 0o777, b"");
                }
            });
            let err = unpack_into(&dir, &bytes).unwrap_err();
            assert!(
                matches!(err, HostWriteError::Refused { .. }),
                "{tag}: {err}"
            );
            assert!(
                std::fs::symlink_metadata(dir.join("dest/sub/e")).is_err(),
                "{tag}: the escaping link is gone"
            );
            victim_untouched(&dir);
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_leaves_the_destination() {
        use tar::EntryType as T;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "dotdot",
                archive(|b| entry(b, T::Regular, "../outside/victim", "", 0o644, b"pwned")),
            ),
            (
                "absolute",
                archive(|b| entry(b, T::Regular, "/tmp/pwned", "", 0o644, b"pwned")),
            ),
            (
                "abs-symlink",
                archive(|b| entry(b, T::Symlink, "./etc", "/etc", 0o777, b"")),
            ),
            (
                "rel-symlink-out",
                archive(|b| entry(b, T::Symlink, "./x", "../outside", 0o777, b"")),
            ),
            (
                "deep-symlink-out",
                archive(|b| entry(b, T::Symlink, "./a/x", "../../outside/victim", 0o777, b"")),
            ),
            (
                "hardlink-out",
                archive(|b| entry(b, T::Link, "./h", "../outside/victim", 0o644, b"")),
            ),
            (
                "hardlink-abs",
                archive(|b| entry(b, T::Link, "./h", "/etc/passwd", 0o644, b"")),
            ),
            (
                "char-device",
                archive(|b| entry(b, T::Char, "./null", "", 0o666, b"")),
            ),
            (
                "block-device",
                archive(|b| entry(b, T::Block, "./sda", "", 0o666, b"")),
            ),
            (
                "fifo",
                archive(|b| entry(b, T::Fifo, "./pipe", "", 0o666, b"")),
            ),
        ];
        for (name, bytes) in cases {
            let dir = scratch(name);
            let err = unpack_into(&dir, &bytes).unwrap_err();
            assert!(
                matches!(err, HostWriteError::Refused { .. }),
                "{name}: {err}"
            );
            victim_untouched(&dir);
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn symlinks_already_in_the_destination_are_not_written_through() {
        let dir = scratch("planted");
        let dest = dir.join("dest");
        std::os::unix::fs::symlink(dir.join("outside"), dest.join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside/victim"), dest.join("file")).unwrap();
        use tar::EntryType as T;
        let through_dir = archive(|b| entry(b, T::Regular, "./sub/victim", "", 0o644, b"pwned"));
        let err = unpack_into(&dir, &through_dir).unwrap_err();
        assert!(matches!(err, HostWriteError::Refused { .. }), "{err}");
        // A file over a planted symlink replaces the link, not its target.
        let over_link = archive(|b| entry(b, T::Regular, "./file", "", 0o644, b"new"));
        unpack_into(&dir, &over_link).unwrap();
        assert!(!std::fs::symlink_metadata(dest.join("file"))
            .unwrap()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(dest.join("file")).unwrap(), "new");
        victim_untouched(&dir);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_archive_over_its_entry_budget_stops() {
        let dir = scratch("budget");
        let bytes = archive(|b| {
            for i in 0..5 {
                entry(
                    b,
                    tar::EntryType::Regular,
                    &format!("./f{i}"),
                    "",
                    0o644,
                    b"x",
                );
            }
        });
        let three = UnpackRules {
            max_entries: 3,
            ..RULES
        };
        let err = unpack(bytes.as_slice(), &dir.join("dest"), three).unwrap_err();
        assert!(
            matches!(
                err,
                HostWriteError::OverBudget {
                    what: "entries",
                    limit: 3
                }
            ),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_temp_file_is_new_private_and_removed_unless_kept() {
        let dir = scratch("temp");
        let target = dir.join("dest/out.txt");
        // A planted symlink at the target: the rename replaces the link.
        std::os::unix::fs::symlink(dir.join("outside/victim"), &target).unwrap();
        let mut tmp = TempFile::beside(&target).unwrap();
        let tmp_path = tmp.path.clone().unwrap();
        assert_eq!(
            std::fs::metadata(&tmp_path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::io::Write::write_all(tmp.file(), b"from the guest").unwrap();
        tmp.persist(0o6755, &target).unwrap();
        assert!(!tmp_path.exists());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "from the guest");
        let mode = std::fs::symlink_metadata(&target)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755 & !umask());
        victim_untouched(&dir);
        // Dropped without persist: gone.
        let tmp = TempFile::beside(&target).unwrap();
        let tmp_path = tmp.path.clone().unwrap();
        drop(tmp);
        assert!(!tmp_path.exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_budgeted_writer_refuses_what_is_over() {
        use tokio::io::AsyncWriteExt;
        let mut w = Budgeted::new(Vec::new(), 10);
        w.write_all(b"12345").await.unwrap();
        assert!(!w.exhausted());
        assert!(w.write_all(b"123456").await.is_err());
        assert!(w.exhausted());
        assert_eq!(w.inner, b"12345");
    }
}
