//! A container's prepared root filesystem (a directory, such as the one
//! containerd's snapshotter mounts for a container) registered as an image:
//! written as one tar layer, then the same conversion an image import does
//! (our init and agent added, `mkfs.ext4 -d`), so the shim has no second
//! path to a bootable disk.

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::oci::OciError;
use super::registry::{ImageError, ImageInfo, ImageRegistry, BUILTIN_IMAGES};

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `dir` as an uncompressed tar at `archive` (owners, modes,
/// links and device nodes as they are; symbolic links not followed);
/// returns its `sha256:` digest.
fn write_archive(dir: &Path, archive: &Path) -> Result<String, OciError> {
    let file = std::fs::File::create(archive)
        .map_err(|e| OciError::io(format!("creating {}", archive.display()), e))?;
    let mut builder = tar::Builder::new(Hashing {
        inner: std::io::BufWriter::new(file),
        hash: Sha256::new(),
    });
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", dir)
        .map_err(|e| OciError::io(format!("reading the root filesystem {}", dir.display()), e))?;
    let mut out = builder
        .into_inner()
        .map_err(|e| OciError::io(format!("writing {}", archive.display()), e))?;
    out.flush()
        .map_err(|e| OciError::io(format!("writing {}", archive.display()), e))?;
    Ok(format!("sha256:{:x}", out.hash.finalize()))
}

impl ImageRegistry {
    /// Registers the root filesystem in `dir` as image `name`, with the
    /// `minimal` image's kernel, init and agent; `source` says where it
    /// came from (shown by `image ls`). On any failure nothing is left
    /// behind.
    pub fn import_root_dir(
        &self,
        name: &str,
        dir: &Path,
        source: &str,
    ) -> Result<ImageInfo, ImageError> {
        self.check_free(name)?;
        let base = self
            .get(BUILTIN_IMAGES[0])
            .map_err(|_| ImageError::NoBase(BUILTIN_IMAGES[0].into()))?;
        let work = self.scratch_dir("root-dir")?;
        let result = (|| {
            let archive = work.join("rootfs.tar");
            let digest = write_archive(dir, &archive)?;
            let convert = work.join("convert");
            std::fs::create_dir(&convert)
                .map_err(|e| OciError::io(format!("creating {}", convert.display()), e))?;
            let rootfs = super::oci::rootfs::convert_archive(
                &archive,
                &digest,
                &convert,
                &base.rootfs,
                None,
                self.budget(),
            )?;
            let _ = std::fs::remove_file(&archive);
            self.register_converted(
                name,
                &base.kernel,
                &rootfs,
                base.defaults.clone(),
                source.into(),
                None,
            )
        })();
        let _ = std::fs::remove_dir_all(&work);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_holds_the_tree_and_its_digest_is_of_its_bytes() {
        let dir = std::env::temp_dir().join(format!("ma-root-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tree/bin")).unwrap();
        std::fs::write(dir.join("tree/bin/tool"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("/bin/tool", dir.join("tree/link")).unwrap();
        let archive = dir.join("out.tar");
        let digest = write_archive(&dir.join("tree"), &archive).unwrap();
        let bytes = std::fs::read(&archive).unwrap();
        assert_eq!(digest, format!("sha256:{:x}", Sha256::digest(&bytes)));
        let mut names: Vec<(String, bool)> = tar::Archive::new(bytes.as_slice())
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().entry_type().is_symlink(),
                )
            })
            .collect();
        names.sort();
        assert!(names.contains(&("bin/tool".into(), false)), "{names:?}");
        assert!(names.contains(&("link".into(), true)), "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
