//! What a create checks of a new workspace's repository, on the host:
//! allowlisted, the branch exists, the image has git; and the branch and
//! base commit it resolves to, which the first start clones.

use std::path::Path;

use crate::repos::{git, RepoError, RepoInfo, RepoStore};
use base::host_tool::HostTool;
use base::images::registry::ImageInfo;
use base::store::repo_checkout::RepoCheckout;

/// Where git lives in images that have it (debugfs follows the `/bin`
/// link of merged-/usr images).
const GIT_PATHS: &[&str] = &["/usr/bin/git", "/usr/local/bin/git", "/bin/git"];

/// Checks `asked` for a workspace of `image` (allowlisted in `store`, the
/// branch exists, the image has git) and resolves its branch and base.
pub(crate) fn resolve(
    store: &RepoStore,
    asked: &RepoCheckout,
    image: &ImageInfo,
) -> Result<(RepoInfo, RepoCheckout), RepoError> {
    let info = store.get(&asked.repo)?;
    let branch = match &asked.branch {
        Some(b) => b.clone(),
        None => git::current_branch(&info.path)?,
    };
    let base = match &asked.base {
        // A task fixed its base when it was asked for.
        Some(base) => git::commit_of(&info.path, base)?,
        None => git::branch_commit(&info.path, &branch)?,
    };
    if !rootfs_has_any(&image.rootfs, GIT_PATHS)? {
        return Err(RepoError::NoGit(image.name.clone()));
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

/// True when the ext4 image `rootfs` has any of `paths` (read with
/// debugfs, without mounting).
fn rootfs_has_any(rootfs: &Path, paths: &[&str]) -> Result<bool, RepoError> {
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
            .map_err(|e| RepoError::HostIo {
                what: format!("reading {} with debugfs", rootfs.display()),
                source: std::io::Error::other(base::error_chain::error_chain(&e)),
            })?;
        if String::from_utf8_lossy(&out.stdout).contains("Inode:") {
            return Ok(true);
        }
    }
    Ok(false)
}
