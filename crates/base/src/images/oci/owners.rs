//! Owners, modes and device nodes of an image converted without root:
//! the tree on disk cannot hold another user's files or device nodes, so
//! what the layers say is recorded while they are applied and written
//! into the ext4 image after `mkfs.ext4 -d` by one `debugfs -w` script
//! (`set_inode_field` and `mknod`), which needs no privileges on a file
//! the caller owns.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::OciError;

/// How owners, modes and device nodes reach the image.
#[derive(Debug)]
pub enum Owners {
    /// Set on the tree itself (as root).
    Direct,
    /// Recorded here (path in the tree: what the layer said), for
    /// [`Owners::write_into`] to set in the image.
    Recorded(BTreeMap<PathBuf, Recorded>),
}

/// What a layer said about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits (the file type comes from the image's own inode).
    pub mode: u32,
    /// A device node or FIFO not made in the tree: its type bits and
    /// (major, minor).
    pub device: Option<(u32, u32, u32)>,
}

impl Owners {
    /// Direct as root, else recorded.
    pub fn for_this_process() -> Self {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            Owners::Direct
        } else {
            Owners::Recorded(BTreeMap::new())
        }
    }

    /// Whether owners are set on the tree.
    pub fn direct(&self) -> bool {
        matches!(self, Owners::Direct)
    }

    /// Notes what a layer said about `path`.
    pub fn record(&mut self, path: &Path, recorded: Recorded) {
        if let Owners::Recorded(map) = self {
            map.insert(path.to_owned(), recorded);
        }
    }

    /// Notes for the hard link `link` what is noted for its target `to`
    /// (one inode: whichever name the image's walk sets last must say the
    /// same).
    pub fn record_link(&mut self, link: &Path, to: &Path) {
        if let Owners::Recorded(map) = self {
            match map.get(to).copied() {
                Some(recorded) => map.insert(link.to_owned(), recorded),
                None => map.remove(link),
            };
        }
    }

    /// Forgets `path` and everything below it (removed by a whiteout).
    pub fn forget(&mut self, path: &Path) {
        if let Owners::Recorded(map) = self {
            map.retain(|p, _| !p.starts_with(path));
        }
    }

    /// Forgets the devices recorded directly in `dir` that are not in
    /// `kept` (an opaque marker hid them; they were never in the tree).
    pub fn forget_devices_in(&mut self, dir: &Path, kept: &std::collections::HashSet<PathBuf>) {
        if let Owners::Recorded(map) = self {
            map.retain(|p, r| r.device.is_none() || p.parent() != Some(dir) || kept.contains(p));
        }
    }

    /// Sets, in the ext4 `image` made of `tree`, every inode's owner and
    /// mode (what a layer said, else root's and the tree's mode) and makes
    /// the recorded device nodes. Nothing to do when owners were direct.
    pub fn write_into(&self, tree: &Path, image: &Path) -> Result<(), OciError> {
        let Owners::Recorded(map) = self else {
            return Ok(());
        };
        let mut script = String::new();
        let mut stack = vec![tree.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| OciError::io(format!("reading {}", dir.display()), e))?;
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let name = quoted(tree, &path)?;
                let (uid, gid, perm) = match map.get(&path) {
                    Some(r) => (r.uid, r.gid, r.mode),
                    None => (0, 0, meta.mode() & 0o7777),
                };
                script.push_str(&format!("sif {name} uid {uid}\nsif {name} gid {gid}\n"));
                if !meta.file_type().is_symlink() {
                    let kind = meta.mode() & libc::S_IFMT;
                    script.push_str(&format!("sif {name} mode 0{:o}\n", kind | perm));
                }
                if meta.is_dir() {
                    stack.push(path);
                }
            }
        }
        for (path, r) in map {
            let Some((kind, major, minor)) = r.device else {
                continue;
            };
            let exists = std::fs::symlink_metadata(path).is_ok();
            let parent_there = path.parent().is_some_and(|p| p.is_dir());
            if exists || !parent_there {
                continue;
            }
            let name = quoted(tree, path)?;
            // mknod links the new node into debugfs's working directory.
            let (Some(parent), Some(base)) = (path.parent(), path.file_name()) else {
                continue;
            };
            let parent = quoted(tree, parent)?;
            let base = quote(&base.to_string_lossy())?;
            let node = match kind {
                libc::S_IFCHR => format!("c {major} {minor}"),
                libc::S_IFBLK => format!("b {major} {minor}"),
                _ => "p".to_owned(),
            };
            script.push_str(&format!(
                "cd {parent}\nmknod {base} {node}\ncd /\nsif {name} uid {}\nsif {name} gid {}\nsif {name} mode 0{:o}\n",
                r.uid,
                r.gid,
                kind | r.mode
            ));
        }
        crate::host_tool::debugfs_write(image, &script).map_err(|e| OciError::Tool {
            tool: "debugfs".into(),
            detail: crate::error_chain::error_chain(&e),
        })
    }
}

/// `path` (in `tree`) as a quoted absolute path for a debugfs script.
fn quoted(tree: &Path, path: &Path) -> Result<String, OciError> {
    let rel = path.strip_prefix(tree).unwrap_or(path).to_string_lossy();
    quote(&format!("/{rel}"))
}

/// `text` in double quotes, for a debugfs script (which has no escapes:
/// a backslash is a backslash, as in systemd's `\x2d` unit names).
fn quote(text: &str) -> Result<String, OciError> {
    if text.contains(['"', '\n', '\r']) {
        return Err(OciError::Unsupported(format!(
            "the image has a file named {text:?}, which a conversion without root cannot set the owner of; convert it as root"
        )));
    }
    Ok(format!("\"{text}\""))
}
