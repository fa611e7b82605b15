//! The guest asset cache (`settings::asset_cache_root`): one directory per
//! asset and input hash (`<cache>/<kind>/<name>-<hash16>/`) and `current/`
//! links to the newest of each. The product (kernel install, setup) and
//! the developer tasks (`cargo xtask`) build into it the same way, keyed
//! by the same hashes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why an asset could not be cached.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    /// Neither `$MICROAGENT_CACHE` nor `$HOME` is set.
    #[error("no asset cache: neither MICROAGENT_CACHE nor HOME is set")]
    NoCache,
    /// A file or link of the cache could not be written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The cache root, or why there is none.
pub fn cache_root() -> Result<PathBuf, AssetError> {
    base::host::settings::asset_cache_root().ok_or(AssetError::NoCache)
}

/// Hashes labelled inputs; the label keeps "a"+"bc" apart from "ab"+"c".
#[derive(Clone, Default)]
pub struct InputHash(Sha256);

impl std::fmt::Debug for InputHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InputHash({})", self.short())
    }
}

impl InputHash {
    /// Adds one input.
    pub fn add(&mut self, label: &str, bytes: &[u8]) -> &mut Self {
        self.0.update((label.len() as u64).to_le_bytes());
        self.0.update(label.as_bytes());
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    /// The first 16 hex digits of the digest.
    pub fn short(&self) -> String {
        let digest = self.0.clone().finalize();
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

/// Points `<root>/current/<name>` at `target`, replacing an older link
/// atomically (a workspace starting meanwhile sees the old or the new).
pub fn link_current(root: &Path, name: &str, target: &Path) -> Result<PathBuf, AssetError> {
    let dir = root.join("current");
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| AssetError::Io { what, path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    let link = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp-{}", base::host::settings::unique_id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io("linking", &tmp))?;
    std::fs::rename(&tmp, &link).map_err(io("replacing", &link))?;
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_separate_inputs() {
        let mut a = InputHash::default();
        a.add("x", b"ab").add("y", b"c");
        let mut b = InputHash::default();
        b.add("x", b"a").add("y", b"bc");
        assert_ne!(a.short(), b.short());
        assert_eq!(a.short().len(), 16);
        let mut c = InputHash::default();
        c.add("x", b"ab").add("y", b"c");
        assert_eq!(a.short(), c.short());
    }

    #[test]
    fn current_links_are_replaced() {
        let root =
            std::env::temp_dir().join(format!("ma-assets-{}", base::host::settings::unique_id()));
        let link = link_current(&root, "vmlinux-x", Path::new("/a")).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/a"));
        link_current(&root, "vmlinux-x", Path::new("/b")).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/b"));
        assert_eq!(std::fs::read_dir(root.join("current")).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(root);
    }
}
