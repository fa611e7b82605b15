//! An unpacked image tree, walked as if it were `/`. The tree comes from a
//! registry, an archive or a guest, so none of its names is trusted: a
//! symlink in it resolves inside it (openat2 `RESOLVE_IN_ROOT`: absolute
//! targets and `..` stay in the tree), a path that climbs above its root
//! is refused, and what is read from it is a regular file of bounded size.
//! The layer unpacker, the conversion's own files (`/.microagent`,
//! `/etc/hosts`, the working directory) and the image user's lookup all
//! go through here, so no step after unpacking reaches the host.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use super::OciError;
use crate::host::dirfd;

/// Most bytes read from a small file of the image (`/etc/passwd`,
/// `/etc/group`).
pub const MAX_SMALL_FILE: u64 = 4 << 20;

/// An image tree and a descriptor of its root.
#[derive(Debug)]
pub struct ImageTree<'a> {
    path: &'a Path,
    root: OwnedFd,
}

impl<'a> ImageTree<'a> {
    /// The tree at `path` (an existing directory of ours).
    pub fn open(path: &'a Path) -> Result<Self, OciError> {
        let root = dirfd::open_dir_at(None, path.as_os_str())
            .map_err(|e| OciError::io("opening the image tree", e))?;
        Ok(Self { path, root })
    }

    /// Where the tree is on the host.
    pub fn path(&self) -> &Path {
        self.path
    }

    /// The real host path of directory `dirs` (components below the
    /// image's root), creating the missing ones; each created one is
    /// passed to `created`. A symlink on the way resolves inside the tree;
    /// anything else in the way is [`OciError::NotADirectory`] (`shown`
    /// names the path in errors).
    pub fn make_dirs(
        &self,
        dirs: &[&OsStr],
        shown: &str,
        created: &mut dyn FnMut(&Path),
    ) -> Result<PathBuf, OciError> {
        let mut current = self.path.to_path_buf();
        for dir in dirs {
            let next = current.join(dir);
            match std::fs::symlink_metadata(&next) {
                Ok(m) if m.is_dir() => current = next,
                Ok(m) if m.file_type().is_symlink() => {
                    let rel = next.strip_prefix(self.path).unwrap_or(&next);
                    current = self
                        .resolve_dir(rel)
                        .map_err(|e| OciError::io(format!("resolving /{shown}"), e))?;
                }
                Ok(_) => return Err(OciError::NotADirectory(shown.to_owned())),
                Err(_) => {
                    std::fs::create_dir(&next)
                        .map_err(|e| OciError::io(format!("creating a parent of /{shown}"), e))?;
                    created(&next);
                    current = next;
                }
            }
        }
        Ok(current)
    }

    /// [`ImageTree::make_dirs`] for an absolute image path such as a
    /// config's `WorkingDir`: `..` may step back down the path but never
    /// above the image's root.
    pub fn make_dir_path(&self, path: &str) -> Result<PathBuf, OciError> {
        let parts = inside_root(Path::new(path)).ok_or_else(|| {
            OciError::Unsupported(format!("the path `{path}` climbs above the image's root"))
        })?;
        self.make_dirs(&parts, path.trim_start_matches('/'), &mut |_| {})
    }

    /// Resolves directory `rel` as if the tree were `/` to its real path,
    /// which is checked to be inside the tree.
    pub fn resolve_dir(&self, rel: &Path) -> io::Result<PathBuf> {
        let fd = dirfd::openat2(
            &self.root,
            rel,
            libc::O_PATH | libc::O_DIRECTORY,
            libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        )?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if !real.starts_with(self.path) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        Ok(real)
    }

    /// Reads the image's file `rel` (resolved inside the tree), which must
    /// be a regular file of at most [`MAX_SMALL_FILE`] bytes; `None` when
    /// the image has no such file.
    pub fn read_small(&self, rel: &str) -> Result<Option<Vec<u8>>, OciError> {
        let shown = format!("/{}", rel.trim_start_matches('/'));
        let fd = match dirfd::openat2(
            &self.root,
            Path::new(rel.trim_start_matches('/')),
            libc::O_RDONLY | libc::O_NONBLOCK,
            libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(OciError::io(format!("opening the image's {shown}"), e)),
        };
        let file = std::fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| OciError::io(format!("reading the image's {shown}"), e))?;
        if !meta.is_file() {
            return Err(OciError::Unsupported(format!(
                "the image's {shown} is not a regular file"
            )));
        }
        let mut data = Vec::new();
        file.take(MAX_SMALL_FILE + 1)
            .read_to_end(&mut data)
            .map_err(|e| OciError::io(format!("reading the image's {shown}"), e))?;
        if data.len() as u64 > MAX_SMALL_FILE {
            return Err(OciError::Unsupported(format!(
                "the image's {shown} is over {MAX_SMALL_FILE} bytes"
            )));
        }
        Ok(Some(data))
    }
}

/// The components of absolute image path `path` below the root, `..`
/// applied; `None` when it would climb above the root.
fn inside_root(path: &Path) -> Option<Vec<&OsStr>> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree beside an `outside` directory holding a canary file.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ma-imagetree-{tag}-{}",
            crate::host::settings::unique_id()
        ));
        std::fs::create_dir_all(dir.join("tree")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("outside/canary"), "untouched").unwrap();
        dir
    }

    #[test]
    fn paths_above_the_root_are_refused_and_dots_apply() {
        assert_eq!(inside_root(Path::new("/a/./b/../c")).unwrap(), ["a", "c"]);
        assert!(inside_root(Path::new("/../../x")).is_none());
        assert!(inside_root(Path::new("/a/../../x")).is_none());
        assert!(inside_root(Path::new("/")).unwrap().is_empty());
    }

    #[test]
    fn symlinks_resolve_inside_the_tree() {
        let dir = scratch("links");
        let tree = dir.join("tree");
        // Absolute and climbing links point at the host's `outside`, as
        // a hostile layer's would at `/etc`.
        std::os::unix::fs::symlink(dir.join("outside"), tree.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../outside", tree.join("up")).unwrap();
        let t = ImageTree::open(&tree).unwrap();
        // Inside the image those links name its own `/tmp/...` and
        // `/outside`, which it lacks: nothing is made, anywhere.
        assert!(t.make_dir_path("/abs/new").is_err());
        assert!(t.make_dir_path("/up/new").is_err());
        std::fs::create_dir(tree.join("outside")).unwrap();
        let made = t.make_dir_path("/up/new").unwrap();
        assert_eq!(made, tree.join("outside/new"));
        assert!(t.make_dir_path("/../outside").is_err());
        let listed: Vec<_> = std::fs::read_dir(dir.join("outside"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(listed, ["canary"], "nothing was made outside the tree");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn small_files_are_regular_bounded_and_inside() {
        let dir = scratch("small");
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        std::fs::write(tree.join("etc/group"), "root:x:0:\n").unwrap();
        std::os::unix::fs::symlink("/dev/zero", tree.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside/canary"), tree.join("etc/shadow")).unwrap();
        let t = ImageTree::open(&tree).unwrap();
        assert_eq!(t.read_small("/etc/group").unwrap().unwrap(), b"root:x:0:\n");
        // `/dev/zero` resolves inside the tree, where there is no /dev.
        assert!(t.read_small("/etc/passwd").unwrap().is_none());
        // The host's file is not what a link in the tree names.
        assert!(t.read_small("/etc/shadow").unwrap().is_none());
        std::fs::create_dir_all(tree.join("big")).unwrap();
        let big = std::fs::File::create(tree.join("big/file")).unwrap();
        big.set_len(MAX_SMALL_FILE + 1).unwrap();
        assert!(t.read_small("/big/file").is_err(), "over the bound");
        assert!(t.read_small("/big").is_err(), "a directory is not a file");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
