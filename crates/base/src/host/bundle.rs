//! The release bundle's guest assets: a bundle unpacked into a prefix
//! carries both guest kernels and the `minimal` image in
//! `<prefix>/share/microagent`, beside `<prefix>/bin/microagent`. The
//! asset cache copies them and its `current/` links to the copies when it
//! has none of its own, so a user who never ran setup boots workspaces,
//! and one who builds a kernel or image later gets theirs used instead.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use vmm_core::KernelVariant;

/// Where a bundle keeps its guest assets, relative to its prefix.
pub const SHARE_DIR: &str = "share/microagent";

/// Where a bundle keeps the helpers a user never runs, relative to its
/// prefix (the guest's agent and init, which images are built from).
pub const LIBEXEC_DIR: &str = "libexec/microagent";

/// The assets a bundle carries, by their name in `current/`.
pub fn asset_names() -> Vec<String> {
    let mut names: Vec<String> = KernelVariant::ALL
        .iter()
        .map(|v| v.vmlinux_file())
        .collect();
    names.push("rootfs-minimal.ext4".to_owned());
    names
}

/// The prefix this program was installed into: the parent of the `bin/`
/// directory holding it (links resolved), if it is in one.
fn install_prefix() -> Option<PathBuf> {
    let exe = std::fs::canonicalize(std::env::current_exe().ok()?).ok()?;
    let bin = exe.parent()?;
    (bin.file_name()? == "bin").then(|| bin.parent().map(Path::to_path_buf))?
}

/// The bundle's asset directory, when this program runs from a bundle.
pub fn bundled_asset_dir() -> Option<PathBuf> {
    install_prefix()
        .map(|p| p.join(SHARE_DIR))
        .filter(|d| d.is_dir())
}

/// The bundle's helper directory, when this program runs from a bundle.
pub fn bundled_libexec_dir() -> Option<PathBuf> {
    install_prefix()
        .map(|p| p.join(LIBEXEC_DIR))
        .filter(|d| d.is_dir())
}

/// Where in the asset cache the bundle's assets are copied to, beside
/// `current/`.
const COPIES_DIR: &str = "bundle";

/// Copies into the asset cache (the parent of `current`) each asset of
/// `bundled` that `current` lacks (no file, or a link to one that is
/// gone) and links it there; the names linked. The cache keeps its own
/// copy, so a link never names a file another user could later put at
/// the bundle's path (a bundle unpacked in /tmp and removed). A file the
/// cache has, built or installed, is left as it is, and so is a cache on
/// a path another user could change (root run with another user's HOME,
/// a cache others may write).
pub fn adopt(current: &Path, bundled: &Path) -> std::io::Result<Vec<String>> {
    // Every command opening the state directory comes here: once the
    // cache has what the bundle carries, nothing more is looked at.
    let lacking = asset_names()
        .into_iter()
        .any(|name| !current.join(&name).exists() && bundled.join(&name).exists());
    if !lacking {
        return Ok(Vec::new());
    }
    let current = std::path::absolute(current)?;
    let Some(cache) = current.parent() else {
        return Ok(Vec::new());
    };
    let copies = cache.join(COPIES_DIR);
    // Every directory on the way must be this user's or root's, and none
    // writable by others (sticky ones, like /tmp, aside): else another
    // user could swap what is linked, or make root write into their home.
    let existing = cache
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    if !existing.ancestors().all(trusted_ancestor) || !owned_here(existing)? {
        return Ok(Vec::new());
    }
    for dir in [cache, &current, &copies] {
        // Any directory missing on the way is made, this user's and 0700
        // (a new home's `.cache` among them).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        if !own_private_dir(dir)? {
            return Ok(Vec::new());
        }
    }
    let mut linked = Vec::new();
    for name in asset_names() {
        let link = current.join(&name);
        if link.exists() {
            continue;
        }
        let dangling = std::fs::symlink_metadata(&link).is_ok();
        let Ok(source) = std::fs::canonicalize(bundled.join(&name)) else {
            continue;
        };
        let dir = copies.join(format!("{name}-{}", crate::host::settings::unique_id()));
        let copy = copy_in(&source, &dir)?;
        // The dangling link goes only if it is still one (a concurrent
        // build or install may have made a good one meanwhile); then the
        // new link is made only where nothing is.
        if dangling && std::fs::symlink_metadata(&link).is_ok() && !link.exists() {
            std::fs::remove_file(&link)?;
        }
        match std::os::unix::fs::symlink(&copy, &link) {
            Ok(()) => linked.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(linked)
}

/// This process's effective user.
fn me() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A directory above the cache: this user's or root's, and writable by
/// no one else unless sticky (whose entries only their owners move).
fn trusted_ancestor(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| {
        (m.uid() == me() || m.uid() == 0) && (m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0)
    })
}

/// Whether `dir` is this user's.
fn owned_here(dir: &Path) -> std::io::Result<bool> {
    Ok(std::fs::metadata(dir)?.uid() == me())
}

/// Whether `dir` is a directory (not a link) of this user's that no one
/// else may write.
fn own_private_dir(dir: &Path) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(dir)?;
    Ok(m.is_dir() && m.uid() == me() && m.mode() & 0o022 == 0)
}

/// Copies the asset `source` into the new directory `dir` (made whole
/// under a temporary name, then renamed); the copy's path. An image's
/// rootfs comes with the files beside it in its own directory (its
/// manifest, which the image registry reads there); a kernel alone. Only
/// regular files are read (a FIFO would block).
fn copy_in(source: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let file = source.file_name().unwrap_or_default();
    let parent = dir.parent().unwrap_or(dir);
    let tmp = parent.join(format!(
        ".{}.tmp",
        dir.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&tmp)?;
    let is_image = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("rootfs-"));
    let copied = (|| {
        let mut files = vec![source.to_path_buf()];
        if is_image {
            for entry in std::fs::read_dir(source.parent().unwrap_or(source))? {
                let path = entry?.path();
                if path != source {
                    files.push(path);
                }
            }
        }
        for from in files {
            if std::fs::symlink_metadata(&from)?.is_file() {
                std::fs::copy(&from, tmp.join(from.file_name().unwrap_or_default()))?;
            } else if from == source {
                return Err(std::io::Error::other(format!(
                    "{} is not a regular file",
                    source.display()
                )));
            }
        }
        std::fs::rename(&tmp, dir)
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    Ok(dir.join(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundles_assets_fill_only_what_the_cache_lacks() {
        let root = std::env::temp_dir().join(format!("ma-bundle-{}", std::process::id()));
        let (bundled, cache) = (root.join("share"), root.join("home/.cache/microagent"));
        let current = cache.join("current");
        std::fs::create_dir_all(bundled.join("images/minimal")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::fs::write(bundled.join("vmlinux-compat"), b"bundled kernel").unwrap();
        std::fs::write(bundled.join("vmlinux-standard"), b"bundled kernel").unwrap();
        std::fs::write(bundled.join("images/minimal/rootfs.ext4"), b"bundled image").unwrap();
        std::fs::write(bundled.join("images/minimal/manifest.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(
            "images/minimal/rootfs.ext4",
            bundled.join("rootfs-minimal.ext4"),
        )
        .unwrap();
        std::fs::write(bundled.join("rootfs-debian.ext4"), b"not a bundle asset").unwrap();
        // A new home: no cache yet; every asset is taken.
        let fresh = root.join("home/.cache/fresh/current");
        assert_eq!(adopt(&fresh, &bundled).unwrap().len(), 3);
        // The user's own kernel stays; a link to a removed build is replaced.
        std::fs::create_dir_all(&current).unwrap();
        std::fs::write(current.join("vmlinux-compat"), b"own kernel").unwrap();
        std::os::unix::fs::symlink(root.join("gone"), current.join("rootfs-minimal.ext4")).unwrap();

        let mut linked = adopt(&current, &bundled).unwrap();
        linked.sort();
        assert_eq!(linked, ["rootfs-minimal.ext4", "vmlinux-standard"]);
        let read = |n: &str| std::fs::read(current.join(n)).unwrap();
        assert_eq!(read("vmlinux-compat"), b"own kernel");
        assert_eq!(read("vmlinux-standard"), b"bundled kernel");
        assert_eq!(read("rootfs-minimal.ext4"), b"bundled image");
        assert!(!current.join("rootfs-debian.ext4").exists());
        // The cache's own copies, the image's manifest beside its rootfs
        // (where the image registry reads it): nothing names the bundle.
        let image = std::fs::canonicalize(current.join("rootfs-minimal.ext4")).unwrap();
        assert!(
            image.starts_with(std::fs::canonicalize(&cache).unwrap()),
            "{image:?}"
        );
        assert!(image.with_file_name("manifest.json").is_file());
        std::fs::remove_dir_all(&bundled).unwrap();
        assert_eq!(read("vmlinux-standard"), b"bundled kernel");
        // Once linked, nothing more to do.
        assert!(adopt(&current, &bundled).unwrap().is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_cache_that_is_a_link_is_left_alone() {
        let root = std::env::temp_dir().join(format!("ma-bundle-link-{}", std::process::id()));
        let (bundled, cache, elsewhere) =
            (root.join("share"), root.join("cache"), root.join("etc"));
        std::fs::create_dir_all(&bundled).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(bundled.join("vmlinux-compat"), b"bundled kernel").unwrap();
        std::os::unix::fs::symlink(&elsewhere, cache.join("current")).unwrap();
        assert!(adopt(&cache.join("current"), &bundled).unwrap().is_empty());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Nor a cache others may write.
        let open = root.join("open");
        std::fs::create_dir_all(open.join("current")).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        assert!(adopt(&open.join("current"), &bundled).unwrap().is_empty());
        assert!(!open.join("bundle").exists());
        // Nor is a cache made in a directory of another user's (only root
        // can give one away to try it).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = root.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let current = theirs.join(".cache/microagent/current");
            assert!(adopt(&current, &bundled).unwrap().is_empty());
            assert!(!theirs.join(".cache").exists());
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
