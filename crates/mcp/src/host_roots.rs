//! The host directories an MCP client may read and write (`serve mcp
//! --allow-host-path DIR`, default: the server's working directory).
//!
//! An agent's requests are not the human's: a prompt-injected agent must not
//! copy `~/.ssh` into a guest or overwrite `~/.bashrc`. Every host path a
//! tool touches is resolved by the kernel beneath one root (openat2 with
//! RESOLVE_BENEATH): `..` and symlinks may move within a root, never out.
//! Kernels without openat2 (before 5.6) get the same rule from the
//! canonical path.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::ToolError;

/// The roots, each canonical and held open.
#[derive(Debug)]
pub struct HostRoots {
    roots: Vec<Root>,
}

#[derive(Debug)]
struct Root {
    path: PathBuf,
    dir: OwnedFd,
}

/// Why a root could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostRootsError {
    /// The directory could not be resolved or opened.
    #[error("allowed host path {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path is not a directory.
    #[error("allowed host path {0} is not a directory")]
    NotADirectory(PathBuf),
}

/// How a path resolved beneath its root.
enum Beneath {
    Inside,
    Missing,
    Outside,
}

impl HostRoots {
    /// Roots for `dirs` (each must be an existing directory).
    pub fn new(dirs: &[PathBuf]) -> Result<Self, HostRootsError> {
        let mut roots = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let open_err = |source| HostRootsError::Open {
                path: dir.clone(),
                source,
            };
            let path = std::fs::canonicalize(dir).map_err(open_err)?;
            if !path.is_dir() {
                return Err(HostRootsError::NotADirectory(dir.clone()));
            }
            let fd = open_dir(&path).map_err(open_err)?;
            roots.push(Root { path, dir: fd });
        }
        Ok(Self { roots })
    }

    /// The roots, canonical.
    pub fn paths(&self) -> Vec<&Path> {
        self.roots.iter().map(|r| r.path.as_path()).collect()
    }

    /// An existing host path beneath a root, canonical. Relative paths are
    /// taken from the first root.
    pub fn existing(&self, path: &str) -> Result<PathBuf, ToolError> {
        let (root, rel) = self.locate(path)?;
        match beneath(root, &rel)? {
            Beneath::Inside => std::fs::canonicalize(root.path.join(&rel))
                .map_err(|e| ToolError::Internal(format!("cannot resolve {path}: {e}"))),
            Beneath::Missing => Err(ToolError::InvalidInput(format!(
                "{path} does not exist on the host"
            ))),
            Beneath::Outside => Err(self.outside(path)),
        }
    }

    /// A host path to create or replace: its directory exists beneath a
    /// root and the name itself is no symlink (it would be written through).
    pub fn writable(&self, path: &str) -> Result<PathBuf, ToolError> {
        let (root, rel) = self.locate(path)?;
        let Some(Component::Normal(name)) = rel.components().next_back() else {
            return Err(ToolError::InvalidInput(format!(
                "{path} names no file; give a file or directory name"
            )));
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = match beneath(root, parent)? {
            Beneath::Inside => std::fs::canonicalize(root.path.join(parent))
                .map_err(|e| ToolError::Internal(format!("cannot resolve {path}: {e}")))?,
            Beneath::Missing => {
                return Err(ToolError::InvalidInput(format!(
                    "host directory {} does not exist",
                    root.path.join(parent).display()
                )))
            }
            Beneath::Outside => return Err(self.outside(path)),
        };
        let target = dir.join(name);
        if target
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(ToolError::Forbidden(format!(
                "host path {path} is a symlink; copies never write through one (name the real path)"
            )));
        }
        Ok(target)
    }

    /// The root `path` is under and the rest of it. Relative paths belong to
    /// the first root; an absolute path is matched as given, then by its
    /// canonical directory (a root reached through a symlinked prefix).
    fn locate(&self, path: &str) -> Result<(&Root, PathBuf), ToolError> {
        if path.is_empty() {
            return Err(ToolError::InvalidInput("host_path is empty".into()));
        }
        let given = Path::new(path);
        if given.is_relative() {
            let root = self.roots.first().ok_or_else(|| self.outside(path))?;
            return Ok((root, given.to_owned()));
        }
        let canonical_dir = given
            .parent()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .zip(given.file_name())
            .map(|(dir, name)| dir.join(name));
        for candidate in std::iter::once(given.to_owned()).chain(canonical_dir) {
            for root in &self.roots {
                if let Ok(rel) = candidate.strip_prefix(&root.path) {
                    return Ok((root, rel.to_owned()));
                }
            }
        }
        Err(self.outside(path))
    }

    fn outside(&self, path: &str) -> ToolError {
        let roots: Vec<String> = self
            .roots
            .iter()
            .map(|r| r.path.display().to_string())
            .collect();
        ToolError::Forbidden(format!(
            "host path {path} is outside the directories this server may use ({}); copy within them, or restart the server with --allow-host-path DIR",
            roots.join(", ")
        ))
    }
}

/// Resolves `rel` beneath `root` by the kernel.
fn beneath(root: &Root, rel: &Path) -> Result<Beneath, ToolError> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let beneath = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    match workspace::host::dirfd::openat2(&root.dir, rel, libc::O_PATH, beneath) {
        Ok(_) => Ok(Beneath::Inside),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Ok(Beneath::Missing),
            // RESOLVE_BENEATH: the path (or a symlink in it) leaves the root.
            Some(libc::EXDEV) | Some(libc::ELOOP) => Ok(Beneath::Outside),
            Some(libc::ENOSYS) => canonical_beneath(root, rel),
            _ => Err(ToolError::InvalidInput(format!(
                "cannot resolve {}: {e}",
                root.path.join(rel).display()
            ))),
        },
    }
}

/// The same rule without openat2: the canonical path must stay in the root.
fn canonical_beneath(root: &Root, rel: &Path) -> Result<Beneath, ToolError> {
    match std::fs::canonicalize(root.path.join(rel)) {
        Ok(real) if real.starts_with(&root.path) => Ok(Beneath::Inside),
        Ok(_) => Ok(Beneath::Outside),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Beneath::Missing),
        Err(e) => Err(ToolError::InvalidInput(format!(
            "cannot resolve {}: {e}",
            root.path.join(rel).display()
        ))),
    }
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a live NUL-terminated string; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree(tag: &str) -> (PathBuf, PathBuf, HostRoots) {
        let base = std::env::temp_dir().join(format!("ma-roots-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("project");
        let outside = base.join("secret");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}").unwrap();
        std::fs::write(outside.join("key"), "private").unwrap();
        symlink(&outside, root.join("escape")).unwrap();
        symlink("src/main.rs", root.join("inner")).unwrap();
        let roots = HostRoots::new(std::slice::from_ref(&root)).unwrap();
        (base, root, roots)
    }

    fn code(e: ToolError) -> String {
        e.code().to_string()
    }

    #[test]
    fn paths_inside_a_root_resolve() {
        let (base, root, roots) = tree("inside");
        let real = std::fs::canonicalize(&root).unwrap();
        assert_eq!(
            roots.existing("src/main.rs").unwrap(),
            real.join("src/main.rs")
        );
        let abs = root.join("src/../src/main.rs");
        assert_eq!(
            roots.existing(abs.to_str().unwrap()).unwrap(),
            real.join("src/main.rs")
        );
        // A symlink that stays inside is followed.
        assert_eq!(roots.existing("inner").unwrap(), real.join("src/main.rs"));
        assert_eq!(roots.writable("out.txt").unwrap(), real.join("out.txt"));
        assert_eq!(roots.writable("src/new").unwrap(), real.join("src/new"));
        assert_eq!(code(roots.existing("nope").unwrap_err()), "INVALID_INPUT");
        assert_eq!(code(roots.writable("nope/x").unwrap_err()), "INVALID_INPUT");
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn paths_leaving_every_root_are_forbidden() {
        let (base, _root, roots) = tree("outside");
        let secret = base.join("secret/key");
        for path in [
            secret.to_str().unwrap(),
            "../secret/key",
            "escape/key",
            "escape",
            "src/../../secret/key",
            "/etc/passwd",
        ] {
            assert_eq!(
                code(roots.existing(path).unwrap_err()),
                "FORBIDDEN",
                "{path}"
            );
        }
        for path in ["escape/new", "../new", "/tmp/new", "inner"] {
            assert_eq!(
                code(roots.writable(path).unwrap_err()),
                "FORBIDDEN",
                "{path}"
            );
        }
        assert_eq!(code(roots.writable("").unwrap_err()), "INVALID_INPUT");
        assert_eq!(code(roots.writable("src/..").unwrap_err()), "INVALID_INPUT");
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_root_must_be_an_existing_directory() {
        let missing = std::env::temp_dir().join("ma-roots-missing-xyz");
        assert!(HostRoots::new(&[missing]).is_err());
        let file = std::env::temp_dir().join(format!("ma-roots-file-{}", std::process::id()));
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            HostRoots::new(std::slice::from_ref(&file)),
            Err(HostRootsError::NotADirectory(_))
        ));
        std::fs::remove_file(file).unwrap();
    }
}
