//! Copies between the host and a guest, decided before a byte moves: what
//! is copied (a file or a directory), where, and what it does to what is
//! there (creates it, replaces a file, merges into a directory). Every
//! front end plans a copy here, so a preview says what the copy will do and
//! the same things are refused everywhere: a copy out onto an existing host
//! path only when the caller asks to overwrite it.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::guest::files::{
    check_git_host_path, check_guest_path, Copied, FileKind, FileStat, WorkspaceFiles,
};
use crate::workspaces::manager::Workspaces;

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyDirection {
    /// From the host into the guest.
    In,
    /// From the guest to the host.
    Out,
}

/// What a copy moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// One regular file.
    File,
    /// A directory and everything in it.
    Dir,
}

impl CopyKind {
    /// `file` or `dir`.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::File => "file",
            CopyKind::Dir => "dir",
        }
    }
}

/// A copy, checked and described; [`Workspaces::copy`] carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyPlan {
    /// The workspace.
    pub workspace: String,
    /// Which way.
    pub direction: CopyDirection,
    /// The host side.
    pub host_path: PathBuf,
    /// The guest side.
    pub guest_path: String,
    /// What is copied.
    pub kind: CopyKind,
    /// What it does, as a sentence without "would" or "did" ("copy host
    /// file ... to dev:/x, replacing ...").
    pub action: String,
    /// The guest side's metadata, read while planning a copy out (so the
    /// copy does not ask the agent again).
    guest_stat: Option<FileStat>,
    /// A copy out writes git metadata ([`CopyOptions::include_git_metadata`]).
    git_metadata: bool,
}

impl CopyPlan {
    /// What the count [`Workspaces::copy`] returns is in: entries for a
    /// directory copied in, bytes otherwise (a directory copied out counts
    /// its archive's bytes).
    pub fn unit(&self) -> &'static str {
        match (self.direction, self.kind) {
            (CopyDirection::In, CopyKind::Dir) => "entries",
            _ => "bytes",
        }
    }
}

/// How a copy may treat what is already there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyOptions {
    /// A copy out may replace an existing host file or merge into an
    /// existing host directory (default: refused with CONFLICT).
    pub overwrite: bool,
    /// A copy out writes git metadata: paths through a `.git`, whose hooks
    /// and config run code at the host's next `git` command (default: left
    /// out of a directory, refused as a host path with FORBIDDEN).
    pub include_git_metadata: bool,
}

impl CopyOptions {
    /// Sets [`CopyOptions::overwrite`].
    pub fn overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// Sets [`CopyOptions::include_git_metadata`].
    pub fn include_git_metadata(mut self, include: bool) -> Self {
        self.include_git_metadata = include;
        self
    }
}

/// `n` bytes for people: `12 B`, `2.0 KiB`, `3.5 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `file`, `dir`, `symlink` or `other`.
pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// A guest path's metadata for people: `a 12 B file, mode 0644`.
pub fn describe_stat(stat: &FileStat) -> String {
    format!(
        "a {} {}, mode {:04o}",
        human_bytes(stat.size),
        kind_name(stat.kind),
        stat.mode
    )
}

/// Entries (the directory itself included, as a copy in counts them) and
/// file bytes of a host directory (symlinks not followed).
fn tree_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut entries, mut total) = (1u64, 0u64);
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            entries += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok((entries, total))
}

fn cannot_read(path: &Path, e: &std::io::Error) -> Error {
    Error::InvalidInput(format!("cannot read {}: {e}", path.display()))
}

impl WorkspaceFiles<'_> {
    /// What is at a guest path of a running workspace, if anything.
    pub async fn stat_if_exists(self, path: &str) -> Result<Option<FileStat>> {
        match self.stat(path).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.code() == crate::code::ErrorCode::NotFound => {
                // NOT_FOUND is also what a missing workspace gives.
                self.ws.get()?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Plans copying the host file or directory `host_path` to
    /// `guest_path` in this running workspace: a file replaces a guest
    /// file, a directory becomes (or merges into) the guest directory;
    /// anything else there is refused.
    pub async fn plan_copy_in(self, host_path: &Path, guest_path: &str) -> Result<CopyPlan> {
        let name = self.ws.name.as_str();
        let meta = std::fs::metadata(host_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::InvalidInput(format!(
                "{} does not exist on the host",
                host_path.display()
            )),
            _ => cannot_read(host_path, &e),
        })?;
        check_guest_path(guest_path)?;
        let kind = if meta.is_dir() {
            CopyKind::Dir
        } else {
            CopyKind::File
        };
        let target = self.stat_if_exists(guest_path).await?;
        let source = match kind {
            CopyKind::Dir => {
                let (entries, total) =
                    tree_size(host_path).map_err(|e| cannot_read(host_path, &e))?;
                format!(
                    "host directory {} ({entries} entries, {} of files)",
                    host_path.display(),
                    human_bytes(total)
                )
            }
            CopyKind::File => format!(
                "host file {} ({})",
                host_path.display(),
                human_bytes(meta.len())
            ),
        };
        let effect = match (&target, kind) {
            (None, _) => "creating it".to_owned(),
            (Some(s), CopyKind::Dir) if s.kind == FileKind::Dir => {
                "merging into the existing directory".into()
            }
            (Some(s), CopyKind::File) if s.kind == FileKind::File => {
                format!("replacing {}", describe_stat(s))
            }
            (Some(s), _) => {
                return Err(Error::InvalidInput(format!(
                    "guest path {guest_path} is {}; a {} cannot be copied over it",
                    describe_stat(s),
                    kind.as_str()
                )))
            }
        };
        Ok(CopyPlan {
            action: format!("copy {source} to {name}:{guest_path}, {effect}"),
            workspace: name.to_owned(),
            direction: CopyDirection::In,
            host_path: host_path.to_owned(),
            guest_path: guest_path.to_owned(),
            kind,
            guest_stat: None,
            git_metadata: false,
        })
    }

    /// Plans copying the guest file or directory `guest_path` of the
    /// running workspace to `host_path`: an existing host path is
    /// refused (CONFLICT) unless `options` allow overwriting it, and then
    /// only a file over a file or a directory into a directory.
    pub async fn plan_copy_out(
        self,
        guest_path: &str,
        host_path: &Path,
        options: CopyOptions,
    ) -> Result<CopyPlan> {
        let name = self.ws.name.as_str();
        check_guest_path(guest_path)?;
        check_git_host_path(host_path, options.include_git_metadata)?;
        let stat = self.stat(guest_path).await?;
        let kind = match stat.kind {
            FileKind::File => CopyKind::File,
            FileKind::Dir => CopyKind::Dir,
            other => {
                return Err(Error::InvalidInput(format!(
                    "{guest_path} is a {}; only files and directories can be copied",
                    kind_name(other)
                )))
            }
        };
        match host_path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => {
                return Err(Error::InvalidInput(format!(
                    "host directory {} does not exist",
                    parent.display()
                )))
            }
            _ => {}
        }
        let effect = match std::fs::symlink_metadata(host_path).ok() {
            None => "creating it".to_owned(),
            Some(_) if !options.overwrite => {
                return Err(Error::HostPathExists {
                    path: host_path.to_owned(),
                })
            }
            Some(m) if m.is_dir() && kind == CopyKind::Dir => {
                "merging into the existing directory".into()
            }
            Some(m) if m.is_file() && kind == CopyKind::File => {
                format!("replacing a host file of {}", human_bytes(m.len()))
            }
            Some(_) => {
                return Err(Error::InvalidInput(format!(
                    "host path {} exists and is not a {}; name another path",
                    host_path.display(),
                    kind.as_str()
                )))
            }
        };
        let git = match kind {
            CopyKind::Dir if !options.include_git_metadata => ", leaving out git metadata",
            _ => "",
        };
        Ok(CopyPlan {
            action: format!(
                "copy guest {} {name}:{guest_path} ({}) to host {}, {effect}{git}",
                kind.as_str(),
                human_bytes(stat.size),
                host_path.display()
            ),
            workspace: name.to_owned(),
            direction: CopyDirection::Out,
            host_path: host_path.to_owned(),
            guest_path: guest_path.to_owned(),
            kind,
            guest_stat: Some(stat),
            git_metadata: options.include_git_metadata,
        })
    }
}

impl Workspaces {
    /// Carries out `plan`: the count [`CopyPlan::unit`] names, and what
    /// was left out.
    pub async fn copy(&self, plan: &CopyPlan) -> Result<Copied> {
        let ws = self.at(&plan.workspace);
        match (plan.direction, &plan.guest_stat) {
            (CopyDirection::In, _) => ws
                .files()
                .copy_in(&plan.host_path, &plan.guest_path)
                .await
                .map(Copied::just),
            (CopyDirection::Out, Some(stat)) => {
                self.copy_out_of(
                    &plan.workspace,
                    &plan.guest_path,
                    stat,
                    &plan.host_path,
                    plan.git_metadata,
                )
                .await
            }
            (CopyDirection::Out, None) => {
                ws.files().copy_out(&plan.guest_path, &plan.host_path).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn a_directory_copied_in_counts_entries() {
        let plan = |direction, kind| CopyPlan {
            workspace: "dev".into(),
            direction,
            host_path: "/tmp/x".into(),
            guest_path: "/x".into(),
            kind,
            action: String::new(),
            guest_stat: None,
            git_metadata: false,
        };
        assert_eq!(plan(CopyDirection::In, CopyKind::Dir).unit(), "entries");
        assert_eq!(plan(CopyDirection::In, CopyKind::File).unit(), "bytes");
        assert_eq!(plan(CopyDirection::Out, CopyKind::Dir).unit(), "bytes");
    }

    #[test]
    fn a_host_directory_counts_its_entries_and_file_bytes() {
        let dir =
            std::env::temp_dir().join(format!("ma-tree-{}", crate::host::settings::unique_id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a"), b"12345").unwrap();
        std::fs::write(dir.join("sub/b"), b"123").unwrap();
        // The directory itself, a, sub, sub/b.
        assert_eq!(tree_size(&dir).unwrap(), (4, 8));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
