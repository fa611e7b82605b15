//! Repositories as workspaces use them, on the host: the allowlist, and
//! what `create` checks of a new workspace's repository (allowlisted, the
//! branch exists, the image has git). The clone in the guest, pull and
//! diff are `guest/repo.rs`.

use std::path::Path;

use crate::error::Result;
use crate::repos::{git, RepoError, RepoInfo, RepoStore};
use crate::workspaces::manager::Workspaces;
use base::host_tool::HostTool;
use base::images::registry::ImageInfo;
use base::store::repo_checkout::RepoCheckout;

/// Where git lives in images that have it (debugfs follows the `/bin`
/// link of merged-/usr images).
const GIT_PATHS: &[&str] = &["/usr/bin/git", "/usr/local/bin/git", "/bin/git"];

impl Workspaces {
    /// The repository allowlist of this state directory.
    pub fn repos(&self) -> RepoStore {
        RepoStore::new(&self.state)
    }

    /// Checks a new workspace's repository (allowlisted, the branch
    /// exists, the image has git) and resolves its branch and base.
    pub(crate) fn resolve_checkout(
        &self,
        asked: &RepoCheckout,
        image: &ImageInfo,
    ) -> Result<(RepoInfo, RepoCheckout)> {
        let info = self.repos().get(&asked.repo)?;
        let branch = match &asked.branch {
            Some(b) => b.clone(),
            None => git::current_branch(&info.path).map_err(RepoError::from)?,
        };
        let base = match &asked.base {
            // A task fixed its base when it was asked for.
            Some(base) => git::commit_of(&info.path, base).map_err(RepoError::from)?,
            None => git::branch_commit(&info.path, &branch).map_err(RepoError::from)?,
        };
        if !rootfs_has_any(&image.rootfs, GIT_PATHS)? {
            return Err(RepoError::NoGit(image.name.clone()).into());
        }
        Ok((
            info.clone(),
            RepoCheckout {
                repo: info.alias,
                branch: Some(branch),
                base: Some(base),
            },
        ))
    }
}

/// True when the ext4 image `rootfs` has any of `paths` (read with
/// debugfs, without mounting).
fn rootfs_has_any(rootfs: &Path, paths: &[&str]) -> Result<bool> {
    for path in paths {
        let Ok(debugfs) = HostTool::new("debugfs") else {
            // Without debugfs the clone itself says so, once the guest is up.
            return Ok(true);
        };
        let out = debugfs
            .arg("-R")
            .arg(format!("stat {path}"))
            .arg(rootfs)
            .output()
            .map_err(|e| crate::error::Error::HostIo {
                what: format!("reading {} with debugfs", rootfs.display()),
                source: std::io::Error::other(base::error_chain::error_chain(&e)),
            })?;
        if String::from_utf8_lossy(&out.stdout).contains("Inode:") {
            return Ok(true);
        }
    }
    Ok(false)
}
