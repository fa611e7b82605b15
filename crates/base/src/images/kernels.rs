//! The guest kernels this host has: the built ones in the asset cache (one
//! per variant) and those the registered images carry, each with its
//! version, size, whether it is the variant this host needs, and the
//! images that boot it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use vmm_core::KernelVariant;

use crate::images::registry::{ImageError, ImageRegistry};

/// One guest kernel file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct KernelInfo {
    /// The file.
    pub path: PathBuf,
    /// `standard` or `compat` for a built kernel; null for one only an
    /// image carries (imported).
    pub variant: Option<String>,
    /// The kernel's version banner (`Linux version 6.1.192 ...`), if found.
    pub version: Option<String>,
    /// Size in bytes.
    pub bytes: u64,
    /// Whether this host boots workspaces with it (built kernel of this
    /// host's variant).
    pub this_host: bool,
    /// Images that boot it.
    pub used_by: Vec<String>,
}

/// The `Linux version ...` banner inside a kernel image, if any.
pub fn version_of(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let needle = b"Linux version ";
    let at = bytes.windows(needle.len()).position(|w| w == needle)?;
    let rest = &bytes[at..];
    let end = rest
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(rest.len())
        .min(200);
    Some(String::from_utf8_lossy(&rest[..end]).trim().to_owned())
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Every kernel: built ones first (by variant), then those only images
/// carry; images linked to a built kernel's file count as its users.
pub fn list(images: &ImageRegistry) -> Result<Vec<KernelInfo>, ImageError> {
    let assets = images.assets();
    let mut out: Vec<(Option<(u64, u64)>, KernelInfo)> = Vec::new();
    for variant in KernelVariant::ALL {
        let Some(path) = assets.map(|a| a.join(variant.vmlinux_file())) else {
            continue;
        };
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        let bytes = std::fs::metadata(&real).map(|m| m.len()).unwrap_or(0);
        out.push((
            identity(&real),
            KernelInfo {
                version: version_of(&real),
                path: real,
                variant: Some(variant.name().to_owned()),
                bytes,
                this_host: variant == images.kernel_variant(),
                used_by: Vec::new(),
            },
        ));
    }
    for image in images.list()? {
        let id = identity(&image.kernel);
        match out
            .iter_mut()
            .find(|(known, _)| known.is_some() && *known == id)
        {
            Some((_, kernel)) => kernel.used_by.push(image.name),
            None => out.push((
                id,
                KernelInfo {
                    version: version_of(&image.kernel),
                    path: image.kernel.clone(),
                    variant: None,
                    bytes: image.kernel_bytes,
                    this_host: false,
                    used_by: vec![image.name],
                },
            )),
        }
    }
    Ok(out.into_iter().map(|(_, k)| k).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StateDir;

    #[test]
    fn built_kernels_list_their_images_and_versions() {
        let root = std::env::temp_dir().join(format!("ma-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let assets = root.join("assets");
        std::fs::create_dir_all(&assets).unwrap();
        let mut kernel = vec![0u8; 8192];
        kernel[..4].copy_from_slice(b"\x7fELF");
        let banner = b"Linux version 6.1.99 (test@host) #1 SMP\n";
        kernel[100..100 + banner.len()].copy_from_slice(banner);
        std::fs::write(assets.join("vmlinux-compat"), &kernel).unwrap();
        let mut rootfs = vec![0u8; 8192];
        rootfs[1080..1082].copy_from_slice(&[0x53, 0xef]);
        std::fs::write(assets.join("rootfs-minimal.ext4"), &rootfs).unwrap();
        let state = StateDir::at(root.join("state")).unwrap();
        let images = ImageRegistry::new(&state, Some(assets.clone()), KernelVariant::Compat);
        let other = root.join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("vmlinux"), &kernel).unwrap();
        std::fs::write(other.join("rootfs.ext4"), &rootfs).unwrap();
        images.import_dir("mine", &other).unwrap();

        let all = list(&images).unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].variant.as_deref(), Some("compat"));
        assert!(all[0].this_host);
        assert_eq!(all[0].used_by, ["minimal"], "hard-linked into the image");
        assert_eq!(
            all[0].version.as_deref(),
            Some("Linux version 6.1.99 (test@host) #1 SMP")
        );
        assert_eq!(
            (all[1].variant.clone(), all[1].used_by.clone()),
            (None, vec!["mine".to_owned()])
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
