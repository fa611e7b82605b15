//! The release bundle's guest assets: a bundle unpacked into a prefix
//! carries both guest kernels and the `minimal` image in
//! `<prefix>/share/microagent`, beside `<prefix>/bin/microagent`. The
//! asset cache's `current/` links to them when it has none of its own, so
//! a user who never ran setup boots workspaces, and one who builds a
//! kernel or image later gets theirs used instead.

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

/// Links into `current` each asset of `bundled` that `current` lacks (no
/// file, or a link to one that is gone); the names linked. A file the
/// cache has, built or installed, is left as it is.
pub fn adopt(current: &Path, bundled: &Path) -> std::io::Result<Vec<String>> {
    let mut linked = Vec::new();
    for name in asset_names() {
        let Ok(target) = std::fs::canonicalize(bundled.join(&name)) else {
            continue;
        };
        let link = current.join(&name);
        if link.exists() {
            continue;
        }
        std::fs::create_dir_all(current)?;
        // By rename, so a dangling link is replaced in one step and a
        // concurrent adopter's link is never half made.
        let tmp = current.join(format!(".{name}.bundle-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
        linked.push(name);
    }
    Ok(linked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundles_assets_fill_only_what_the_cache_lacks() {
        let root = std::env::temp_dir().join(format!("ma-bundle-{}", std::process::id()));
        let (bundled, current) = (root.join("share"), root.join("current"));
        std::fs::create_dir_all(&bundled).unwrap();
        std::fs::create_dir_all(&current).unwrap();
        std::fs::write(bundled.join("vmlinux-compat"), b"bundled kernel").unwrap();
        std::fs::write(bundled.join("vmlinux-standard"), b"bundled kernel").unwrap();
        std::fs::write(bundled.join("rootfs-minimal.ext4"), b"bundled image").unwrap();
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
        // Once linked, nothing more to do.
        assert!(adopt(&current, &bundled).unwrap().is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
