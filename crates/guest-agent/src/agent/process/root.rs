//! An exec's own root directory (`ExecCall::root`): checked, given the
//! mount points the spawn mounts /proc, /dev and /sys onto, and used to
//! look up the program and the user inside it rather than in the guest's
//! own root.

use std::io;
use std::path::{Component, Path, PathBuf};

/// The guest directories the spawn mounts inside an exec's root, in the
/// order it mounts them (spawn.rs).
pub const MOUNTED_INSIDE: [&str; 3] = ["proc", "dev", "sys"];

/// Why an exec's root cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// Not an absolute path, or one with `..`.
    #[error("root {0:?} is not an absolute path without `..`")]
    NotAbsolute(String),
    /// Missing, or not a directory.
    #[error("root {0} is not a directory")]
    NotADirectory(PathBuf),
    /// A mount point inside it could not be made.
    #[error("making mount point {path}")]
    MountPoint {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A checked root directory.
#[derive(Debug)]
pub struct ExecRoot {
    dir: PathBuf,
}

impl ExecRoot {
    /// Checks `dir` and makes the mount points missing inside it.
    pub fn prepare(dir: &str) -> Result<Self, RootError> {
        let path = Path::new(dir);
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            return Err(RootError::NotAbsolute(dir.to_owned()));
        }
        if !path.is_dir() {
            return Err(RootError::NotADirectory(path.to_owned()));
        }
        let root = Self {
            dir: path.to_owned(),
        };
        for name in MOUNTED_INSIDE {
            let point = root.dir.join(name);
            if !point.is_dir() {
                std::fs::create_dir(&point).map_err(|source| RootError::MountPoint {
                    path: point.clone(),
                    source,
                })?;
            }
        }
        Ok(root)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `path`, as a process in this root names it, is in the guest.
    pub fn outside(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }
}

/// Reads `path` (as a process in `root`, or in the guest's own root when
/// `None`, names it); empty when unreadable.
pub fn read_inside(root: Option<&ExecRoot>, path: &str) -> String {
    let file = root.map_or_else(|| PathBuf::from(path), |r| r.outside(path));
    std::fs::read_to_string(file).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_is_checked_and_gets_its_mount_points() {
        let dir = std::env::temp_dir().join(format!("agent-root-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(dir.join("etc/passwd"), "app:x:7:7::/home/app:/bin/sh\n").unwrap();
        let root = ExecRoot::prepare(dir.to_str().unwrap()).unwrap();
        for name in MOUNTED_INSIDE {
            assert!(dir.join(name).is_dir(), "{name}");
        }
        assert_eq!(root.outside("/etc/passwd"), dir.join("etc/passwd"));
        assert!(read_inside(Some(&root), "/etc/passwd").starts_with("app:"));
        // Made once: a second prepare finds them.
        ExecRoot::prepare(dir.to_str().unwrap()).unwrap();
        assert!(matches!(
            ExecRoot::prepare("relative/dir"),
            Err(RootError::NotAbsolute(_))
        ));
        assert!(matches!(
            ExecRoot::prepare("/a/../b"),
            Err(RootError::NotAbsolute(_))
        ));
        assert!(matches!(
            ExecRoot::prepare(dir.join("etc/passwd").to_str().unwrap()),
            Err(RootError::NotADirectory(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
