//! The release bundle's guest assets: a bundle unpacked into a prefix
//! carries both guest kernels and the `minimal` image in
//! `<prefix>/share/microagent`, beside `<prefix>/bin/microagent`. The
//! asset cache copies them and its `current/` links to the copies when it
//! has none of its own, so a user who never ran setup boots workspaces,
//! and one who builds a kernel or image later gets theirs used instead.

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
/// cache has, built or installed, is left as it is, and so is a cache
/// this user does not own (root run with another user's HOME).
pub fn adopt(current: &Path, bundled: &Path) -> std::io::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let Some(cache) = current.parent() else {
        return Ok(Vec::new());
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    // Made only inside a directory of this user's: root run with another
    // user's HOME must not leave root's directories in it.
    let existing = cache
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    if std::fs::metadata(existing)?.uid() != me {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(cache)?;
    for dir in [cache, current] {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() && m.uid() == me => {}
            Ok(_) => return Ok(Vec::new()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(dir)?,
            Err(e) => return Err(e),
        }
    }
    let mut linked = Vec::new();
    for name in asset_names() {
        let link = current.join(&name);
        if link.exists() {
            continue;
        }
        let Ok(source) = std::fs::canonicalize(bundled.join(&name)) else {
            continue;
        };
        let copy = copy_in(&source, &cache.join(COPIES_DIR).join(&name))?;
        // A dangling link goes; then the new one is made where nothing
        // is, so one a concurrent build or install just made is kept.
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link)?;
        }
        match std::os::unix::fs::symlink(&copy, &link) {
            Ok(()) => linked.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(linked)
}

/// Copies the asset `source` into the directory `dir` (made afresh, by
/// rename); the copy's path. An image's rootfs comes with the files
/// beside it in its own directory (its manifest, which the image registry
/// reads there); a kernel alone.
fn copy_in(source: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let file = source.file_name().unwrap_or_default();
    let parent = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dir.file_name().unwrap_or_default().to_string_lossy(),
        crate::host::settings::unique_id()
    ));
    std::fs::create_dir(&tmp)?;
    let is_image = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("rootfs-"));
    let copied = (|| {
        let mut files = vec![source.to_path_buf()];
        if is_image {
            for entry in std::fs::read_dir(source.parent().unwrap_or(source))? {
                let path = entry?.path();
                if path != source && std::fs::symlink_metadata(&path)?.is_file() {
                    files.push(path);
                }
            }
        }
        for from in files {
            std::fs::copy(&from, tmp.join(from.file_name().unwrap_or_default()))?;
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
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
        let (bundled, cache) = (root.join("share"), root.join("cache"));
        let current = cache.join("current");
        std::fs::create_dir_all(bundled.join("images/minimal")).unwrap();
        std::fs::create_dir_all(&current).unwrap();
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
        // The user's own kernel stays; a link to a removed build is replaced.
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
