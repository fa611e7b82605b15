//! Writing into an image's directory tree without ever leaving it: the
//! tree's own symlinks (Debian's `sbin -> usr/sbin`) are followed, links
//! that lead outside it (an absolute `/usr/sbin`) are refused.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};

/// `path` with symlinks resolved, which must stay inside `tree`.
fn inside(tree: &Path, path: &Path) -> anyhow::Result<PathBuf> {
    let root = tree
        .canonicalize()
        .with_context(|| format!("resolving {}", tree.display()))?;
    let real = path
        .canonicalize()
        .with_context(|| format!("resolving {}", path.display()))?;
    if !real.starts_with(&root) {
        bail!(
            "{} leads outside the image tree (to {})",
            path.display(),
            real.display()
        );
    }
    Ok(real)
}

/// Where `rel` (relative to the tree) lives: its parent resolved inside
/// the tree, then its own name (not resolved, so it may be a link to replace).
fn place(tree: &Path, rel: &Path) -> anyhow::Result<PathBuf> {
    let name = match rel.components().next_back() {
        Some(Component::Normal(n)) => n.to_owned(),
        _ => bail!("`{}` is not a plain relative path", rel.display()),
    };
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        bail!("`{}` is not a plain relative path", rel.display());
    }
    let parent = rel.parent().unwrap_or(Path::new(""));
    Ok(inside(tree, &tree.join(parent))?.join(name))
}

/// `mkdir -p` inside the tree: missing directories get `mode` (the last) or
/// 0755 (those above it); existing ones, or links to them, are left alone.
pub fn mkdir(tree: &Path, rel: &str, mode: u32) -> anyhow::Result<()> {
    let rel = Path::new(rel);
    let count = rel.components().count();
    let mut done = PathBuf::new();
    for (i, c) in rel.components().enumerate() {
        done.push(c);
        let full = place(tree, &done)?;
        if std::fs::symlink_metadata(&full).is_ok() {
            if !inside(tree, &full)?.is_dir() {
                bail!("{} exists and is not a directory", full.display());
            }
            continue;
        }
        std::fs::create_dir(&full).with_context(|| format!("creating {}", full.display()))?;
        let m = if i + 1 == count { mode } else { 0o755 };
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(m))?;
    }
    Ok(())
}

/// Makes room for a new entry at `rel` (replacing a file or link); returns its path.
fn fresh_entry(tree: &Path, rel: &str) -> anyhow::Result<PathBuf> {
    if let Some(parent) = Path::new(rel).parent().and_then(Path::to_str) {
        if !parent.is_empty() {
            mkdir(tree, parent, 0o755)?;
        }
    }
    let full = place(tree, Path::new(rel))?;
    if let Ok(meta) = std::fs::symlink_metadata(&full) {
        if meta.is_dir() {
            bail!("{} is a directory", full.display());
        }
        std::fs::remove_file(&full)?;
    }
    Ok(full)
}

/// Writes a file with `mode` at `rel` (replacing what was there).
pub fn write_file(tree: &Path, rel: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let full = fresh_entry(tree, rel)?;
    std::fs::write(&full, bytes).with_context(|| format!("writing {}", full.display()))?;
    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Makes `rel` a symlink to `target` (replacing what was there).
pub fn symlink(tree: &Path, rel: &str, target: &str) -> anyhow::Result<()> {
    let full = fresh_entry(tree, rel)?;
    std::os::unix::fs::symlink(target, &full)
        .with_context(|| format!("linking {} to {target}", full.display()))
}

/// Bytes the tree takes on ext4 with 4 KiB blocks: files and directories
/// rounded up to blocks (hard links once), long symlinks one block each.
pub fn usage(tree: &Path) -> anyhow::Result<u64> {
    const BLOCK: u64 = 4096;
    let mut seen = HashSet::new();
    let mut total = 0;
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        total += BLOCK;
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                if meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
                    continue;
                }
                total += meta.len().div_ceil(BLOCK) * BLOCK;
            } else if meta.is_symlink() && meta.len() > 59 {
                total += BLOCK;
            }
        }
    }
    Ok(total)
}

/// How one entry reads in the manifest: `/p/`, `/p -> target`, `/p (N bytes)`.
fn describe(rel: &str, meta: &std::fs::Metadata, full: &Path) -> String {
    if meta.is_symlink() {
        let target = std::fs::read_link(full).unwrap_or_default();
        format!("/{rel} -> {}", target.display())
    } else if meta.is_dir() {
        format!("/{rel}/")
    } else if meta.is_file() {
        format!("/{rel} ({} bytes)", meta.len())
    } else {
        format!("/{rel} (special file)")
    }
}

/// The tree's top-level entries, sorted, described.
pub fn top_level(tree: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(tree)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| {
            let full = tree.join(n);
            Ok(describe(n, &std::fs::symlink_metadata(&full)?, &full))
        })
        .collect()
}

/// Describes `paths`, each of which must exist (a missing one fails the build).
pub fn describe_paths(tree: &Path, paths: &[&str]) -> anyhow::Result<Vec<String>> {
    paths
        .iter()
        .map(|rel| {
            let full =
                place(tree, Path::new(rel)).with_context(|| format!("the image lacks /{rel}"))?;
            let meta = std::fs::symlink_metadata(&full)
                .with_context(|| format!("the image lacks /{rel}"))?;
            Ok(describe(rel, &meta, &full))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("images-tree-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn follows_links_inside_and_refuses_links_out() {
        let tree = scratch("links");
        std::fs::create_dir_all(tree.join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("usr/sbin", tree.join("sbin")).unwrap();
        std::os::unix::fs::symlink("/usr/bin", tree.join("escape")).unwrap();
        write_file(&tree, "sbin/tool", b"x", 0o750).unwrap();
        assert_eq!(std::fs::read(tree.join("usr/sbin/tool")).unwrap(), b"x");
        let mode = std::fs::metadata(tree.join("usr/sbin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o750);
        assert!(write_file(&tree, "escape/evil", b"x", 0o644).is_err());
        assert!(mkdir(&tree, "escape/sub", 0o755).is_err());
        assert!(write_file(&tree, "../outside", b"x", 0o644).is_err());
        assert!(write_file(&tree, "/etc/abs", b"x", 0o644).is_err());
        // An existing link at the final name is replaced, never written through.
        std::os::unix::fs::symlink("/etc/hostname", tree.join("hostname")).unwrap();
        write_file(&tree, "hostname", b"mine", 0o644).unwrap();
        assert!(!std::fs::symlink_metadata(tree.join("hostname"))
            .unwrap()
            .is_symlink());
        // mkdir through the tree's own link; existing dirs keep their mode.
        mkdir(&tree, "sbin/deep/er", 0o700).unwrap();
        assert!(tree.join("usr/sbin/deep/er").is_dir());
        mkdir(&tree, "sbin/deep/er", 0o755).unwrap();
        let mode = std::fs::metadata(tree.join("usr/sbin/deep/er"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o700);
        symlink(&tree, "sbin/init", "/usr/bin/agent").unwrap();
        assert_eq!(
            describe_paths(&tree, &["sbin/init", "sbin/tool", "usr"]).unwrap(),
            [
                "/sbin/init -> /usr/bin/agent",
                "/sbin/tool (1 bytes)",
                "/usr/"
            ]
        );
        assert!(describe_paths(&tree, &["usr/bin/python3"]).is_err());
        std::fs::remove_dir_all(&tree).unwrap();
    }

    #[test]
    fn usage_rounds_to_blocks_and_counts_hard_links_once() {
        let tree = scratch("usage");
        std::fs::write(tree.join("a"), vec![0u8; 5000]).unwrap();
        std::fs::hard_link(tree.join("a"), tree.join("b")).unwrap();
        std::fs::create_dir(tree.join("d")).unwrap();
        std::fs::write(tree.join("d/small"), b"1").unwrap();
        std::os::unix::fs::symlink("a", tree.join("short")).unwrap();
        // two directories, 8 KiB for `a` once, 4 KiB for `small`
        assert_eq!(usage(&tree).unwrap(), 4096 * 2 + 8192 + 4096);
        assert_eq!(
            top_level(&tree).unwrap(),
            ["/a (5000 bytes)", "/b (5000 bytes)", "/d/", "/short -> a"]
        );
        std::fs::remove_dir_all(&tree).unwrap();
    }
}
