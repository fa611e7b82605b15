//! Reading an image from files: an OCI image layout directory
//! (`oci-layout`, `index.json`, `blobs/sha256/`), or a tarball of one, or
//! a `docker save` tarball (`manifest.json`, the config and layer tars).
//! A tarball is unpacked into a scratch directory first. Every blob read
//! is checked against its digest.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::config::ImageConfig;
use super::unpack::digest_hex;
use super::OciError;

/// The index annotation naming an image in a layout.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Layer media types applied (plain, gzip and zstd tars).
const LAYER_TYPES: [&str; 7] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
];

/// An image found in files, ready to convert.
#[derive(Debug)]
pub struct Resolved {
    /// The name the source gives it (a tag), if any.
    pub reference: Option<String>,
    /// The manifest's digest (of `manifest.json` for a `docker save`).
    pub manifest_digest: String,
    /// The config's digest.
    pub config_digest: String,
    /// The config.
    pub config: ImageConfig,
    /// Layer files, bottom first, with their digests.
    pub layers: Vec<(PathBuf, String)>,
    /// Whether each layer file's digest was checked as it was fetched (a
    /// pull checks downloads and cached blobs); otherwise conversion
    /// checks them before unpacking.
    pub layers_verified: bool,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedImage {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn not_image(path: &Path, problem: impl Into<String>) -> OciError {
    OciError::NotAnImage {
        path: path.to_owned(),
        problem: problem.into(),
    }
}

fn json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, OciError> {
    serde_json::from_slice(bytes).map_err(|source| OciError::Json {
        what: what.into(),
        source,
    })
}

/// Opens `rel` below `dir` as a regular file reached through no symlink
/// and not out of `dir` (openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`):
/// a blob that is a link to `/dev/zero` or to a host file is refused, so
/// no host file is read or hashed as part of an image. Its length too.
fn open_inside(dir: &Path, rel: &Path, what: &str) -> Result<(std::fs::File, u64), OciError> {
    let root = std::fs::File::open(dir)
        .map_err(|e| OciError::io(format!("opening {}", dir.display()), e))?;
    let root = std::os::fd::OwnedFd::from(root);
    let fd = crate::host::dirfd::openat2(
        &root,
        rel,
        libc::O_RDONLY,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => not_image(dir, format!("its {what} is missing")),
        Some(libc::ELOOP) | Some(libc::EXDEV) => not_image(
            dir,
            format!("its {what} is a symbolic link; only regular files inside the image are read"),
        ),
        _ => OciError::io(format!("opening {}/{}", dir.display(), rel.display()), e),
    })?;
    let file = std::fs::File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| OciError::io(format!("reading {}/{}", dir.display(), rel.display()), e))?;
    if !meta.is_file() {
        return Err(not_image(dir, format!("its {what} is not a regular file")));
    }
    Ok((file, meta.len()))
}

/// Reads `rel` below `dir` as [`open_inside`] opens it, at most `limit`
/// bytes (`Limits::max_image_metadata_bytes`).
fn read_inside(dir: &Path, rel: &Path, limit: u64, what: &str) -> Result<Vec<u8>, OciError> {
    let (file, len) = open_inside(dir, rel, what)?;
    if len > limit {
        return Err(OciError::OverLimit {
            what: "bytes in a manifest, index or config",
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| OciError::io(format!("reading {}/{}", dir.display(), rel.display()), e))?;
    Ok(bytes)
}

/// `sha256:<hex>` of a file's bytes.
pub fn file_digest(path: &Path) -> Result<String, OciError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| OciError::io(format!("opening {}", path.display()), e))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| OciError::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(format!("sha256:{:x}", hash.finalize()))
}

/// Checks a file against `digest`.
pub fn verify_file(path: &Path, digest: &str, what: &str) -> Result<(), OciError> {
    digest_hex(digest)?;
    let actual = file_digest(path)?;
    if actual != digest {
        return Err(OciError::DigestMismatch {
            what: what.into(),
            expected: digest.to_owned(),
            actual,
        });
    }
    Ok(())
}

/// Whether `path` is a directory in OCI image layout.
pub fn is_layout(path: &Path) -> bool {
    path.join("oci-layout").is_file() && path.join("index.json").is_file()
}

/// Reads the image in `dir`, a directory in OCI image layout or an
/// unpacked `docker save`. With several images, `wanted` picks one by its
/// ref name (else the only one, or the linux/amd64 one). Its manifests,
/// indexes and config are at most `max_metadata` bytes each.
pub fn read_dir(dir: &Path, wanted: Option<&str>, max_metadata: u64) -> Result<Resolved, OciError> {
    if is_layout(dir) {
        return read_layout(dir, wanted, max_metadata);
    }
    if dir.join("manifest.json").is_file() {
        return read_saved(dir, max_metadata);
    }
    Err(not_image(
        dir,
        "neither an OCI image layout (oci-layout, index.json) nor a `docker save` (manifest.json)",
    ))
}

/// A blob's path relative to the layout.
fn blob(digest: &str) -> Result<PathBuf, OciError> {
    Ok(Path::new("blobs/sha256").join(digest_hex(digest)?))
}

fn read_blob(dir: &Path, digest: &str, what: &str, limit: u64) -> Result<Vec<u8>, OciError> {
    let bytes = read_inside(dir, &blob(digest)?, limit, &format!("{what} blob {digest}"))?;
    let actual = format!("sha256:{:x}", Sha256::digest(&bytes));
    if actual != digest {
        return Err(OciError::DigestMismatch {
            what: what.into(),
            expected: digest.to_owned(),
            actual,
        });
    }
    Ok(bytes)
}

fn read_layout(dir: &Path, wanted: Option<&str>, limit: u64) -> Result<Resolved, OciError> {
    let index_bytes = read_inside(dir, Path::new("index.json"), limit, "index.json")?;
    let index: Index = json(&index_bytes, "index.json")?;
    let candidates: Vec<&Descriptor> = match wanted {
        Some(name) => index
            .manifests
            .iter()
            .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(name))
            .collect(),
        None => index.manifests.iter().collect(),
    };
    let chosen = match candidates.as_slice() {
        [] if wanted.is_some() => {
            return Err(not_image(
                dir,
                format!("no image named `{}` in it", wanted.unwrap_or_default()),
            ))
        }
        [] => return Err(not_image(dir, "its index lists no image")),
        [one] => *one,
        many => pick_platform(many)
            .ok_or_else(|| not_image(dir, "it holds several images; name one (its ref name)"))?,
    };
    let reference = chosen.annotations.get(REF_NAME).cloned();
    let mut manifest_digest = chosen.digest.clone();
    let mut manifest_bytes = read_blob(dir, &manifest_digest, "manifest", limit)?;
    if INDEX_TYPES.contains(&chosen.media_type.as_str()) {
        let nested: Index = json(&manifest_bytes, "image index")?;
        let refs: Vec<&Descriptor> = nested.manifests.iter().collect();
        let entry = pick_platform(&refs).ok_or_else(|| {
            OciError::Unsupported("the image index has no linux/amd64 image".into())
        })?;
        manifest_digest = entry.digest.clone();
        manifest_bytes = read_blob(dir, &manifest_digest, "manifest", limit)?;
    }
    let manifest: Manifest = json(&manifest_bytes, "manifest")?;
    let config_bytes = read_blob(dir, &manifest.config.digest, "config", limit)?;
    let config = ImageConfig::parse(&config_bytes)?;
    let mut layers = Vec::new();
    for layer in &manifest.layers {
        if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
            return Err(OciError::Unsupported(format!(
                "layer {} has media type `{}`; plain, gzip and zstd tar layers are read",
                layer.digest, layer.media_type
            )));
        }
        let rel = blob(&layer.digest)?;
        open_inside(dir, &rel, &format!("layer blob {}", layer.digest))?;
        layers.push((dir.join(rel), layer.digest.clone()));
    }
    Ok(Resolved {
        reference,
        manifest_digest,
        config_digest: manifest.config.digest,
        config,
        layers,
        layers_verified: false,
    })
}

/// The linux/amd64 entry of an index.
fn pick_platform<'a>(entries: &[&'a Descriptor]) -> Option<&'a Descriptor> {
    entries.iter().copied().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    })
}

fn read_saved(dir: &Path, limit: u64) -> Result<Resolved, OciError> {
    let bytes = read_inside(dir, Path::new("manifest.json"), limit, "manifest.json")?;
    let saved: Vec<SavedImage> = json(&bytes, "manifest.json")?;
    let image = match saved.as_slice() {
        [one] => one,
        [] => return Err(not_image(dir, "its manifest.json lists no image")),
        _ => return Err(not_image(dir, "it holds several images; save one")),
    };
    let inside = |name: &str| -> Result<PathBuf, OciError> {
        let rel = Path::new(name);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(OciError::LayerPath(name.to_owned()));
        }
        Ok(rel.to_owned())
    };
    let config_rel = inside(&image.config)?;
    let config_bytes = read_inside(dir, &config_rel, limit, &format!("config {}", image.config))?;
    let config_digest = format!("sha256:{:x}", Sha256::digest(&config_bytes));
    // The config's file is named by its digest: a mismatch is corruption.
    let stem = Path::new(&image.config)
        .file_name()
        .and_then(|s| s.to_str())
        .map(|s| s.trim_end_matches(".json").to_owned())
        .unwrap_or_default();
    if stem.len() == 64 && format!("sha256:{stem}") != config_digest {
        return Err(OciError::DigestMismatch {
            what: "config".into(),
            expected: format!("sha256:{stem}"),
            actual: config_digest,
        });
    }
    let config = ImageConfig::parse(&config_bytes)?;
    if config.rootfs.diff_ids.len() != image.layers.len() {
        return Err(not_image(
            dir,
            "its config and manifest.json list different layers",
        ));
    }
    let mut layers = Vec::new();
    for (name, diff_id) in image.layers.iter().zip(&config.rootfs.diff_ids) {
        let rel = inside(name)?;
        open_inside(dir, &rel, &format!("layer {name}"))?;
        let path = dir.join(rel);
        // Saved layers are uncompressed: their digest is the diff_id,
        // checked while they are applied.
        layers.push((path, diff_id.clone()));
    }
    Ok(Resolved {
        reference: image.repo_tags.as_ref().and_then(|t| t.first().cloned()),
        manifest_digest: format!("sha256:{:x}", Sha256::digest(&bytes)),
        config_digest,
        config,
        layers,
        layers_verified: false,
    })
}

/// Unpacks the tarball `archive` (a `docker save` or a tar of an OCI
/// layout) into the empty directory `into`.
pub fn unpack_archive(archive: &Path, into: &Path) -> Result<(), OciError> {
    let file = std::fs::File::open(archive)
        .map_err(|e| OciError::io(format!("opening {}", archive.display()), e))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    tar.set_preserve_permissions(false);
    // tar's unpack refuses entries that would land outside `into`.
    tar.unpack(into)
        .map_err(|e| not_image(archive, format!("not a readable image tarball: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ma-layout-{tag}-{}",
            crate::host::settings::unique_id()
        ));
        testkit::oci::write_layout(&dir);
        dir
    }

    /// Each blob of the layout, largest first (the busybox layer).
    fn blobs(dir: &Path) -> Vec<PathBuf> {
        let mut all: Vec<_> = std::fs::read_dir(dir.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        all.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
        all
    }

    #[test]
    fn blobs_are_read_only_as_regular_files_inside_the_layout() {
        let dir = layout("links");
        let image = read_dir(&dir, None, 1 << 20).unwrap();
        assert_eq!(image.layers.len(), 2);
        // A layer blob that is a link to /dev/zero, then one to a host file.
        let layer = blobs(&dir).remove(0);
        for target in ["/dev/zero", "/etc/hostname"] {
            std::fs::remove_file(&layer).unwrap();
            std::os::unix::fs::symlink(target, &layer).unwrap();
            let err = read_dir(&dir, None, 1 << 20).unwrap_err();
            assert!(err.to_string().contains("symbolic link"), "{err}");
            assert_eq!(err.code(), crate::code::ErrorCode::InvalidInput);
        }
        // The blobs directory itself through a link: refused the same way.
        let dir = layout("dirlink");
        let real = dir.join("real-blobs");
        std::fs::rename(dir.join("blobs"), &real).unwrap();
        std::os::unix::fs::symlink(&real, dir.join("blobs")).unwrap();
        let err = read_dir(&dir, None, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn manifests_and_configs_are_read_within_their_limit() {
        let dir = layout("big");
        let err = read_dir(&dir, None, 64).unwrap_err();
        assert!(
            matches!(err, OciError::OverLimit { limit: 64, .. }),
            "{err}"
        );
        read_dir(&dir, None, 4 << 20).unwrap();
    }

    /// A tar header of `kind` whose name (and link name) are written as
    /// they are, `..` and all, as a hostile tarball would carry them.
    fn raw_entry(
        tar: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        name: &str,
        link: &str,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_cksum();
        tar.append(&header, data).unwrap();
    }

    #[test]
    fn a_hostile_image_tarball_writes_nothing_outside_its_scratch() {
        use tar::EntryType::{Link, Regular, Symlink};
        let base = std::env::temp_dir().join(format!(
            "ma-layout-tarball-{}",
            crate::host::settings::unique_id()
        ));
        let outside = base.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "kept").unwrap();
        let (abs, abs_dir) = (outside.join("abs"), outside.to_str().unwrap().to_owned());
        // Each a tarball of its own, so every trick meets the unpacker.
        // (kind, name, link name, data)
        type Entry<'a> = (tar::EntryType, &'a str, &'a str, &'a [u8]);
        let cases: Vec<Vec<Entry>> = vec![
            vec![(Regular, "../outside/dotdot", "", b"x")],
            vec![(Regular, abs.to_str().unwrap(), "", b"x")],
            vec![
                (Symlink, "link", &abs_dir, b""),
                (Regular, "link/through", "", b"x"),
            ],
            vec![
                (Symlink, "rel", "../outside", b""),
                (Regular, "rel/secret", "", b"overwritten"),
            ],
            vec![
                (Link, "hard", "../outside/secret", b""),
                (Regular, "hard", "", b"overwritten"),
            ],
            vec![
                (Symlink, "s", "../outside/secret", b""),
                (Regular, "s", "", b"overwritten"),
            ],
        ];
        for (i, entries) in cases.iter().enumerate() {
            let into = base.join(format!("into-{i}"));
            std::fs::create_dir_all(&into).unwrap();
            let mut tar = tar::Builder::new(Vec::new());
            for (kind, name, link, data) in entries {
                raw_entry(&mut tar, *kind, name, link, data);
            }
            let archive = base.join(format!("image-{i}.tar"));
            std::fs::write(&archive, tar.into_inner().unwrap()).unwrap();
            // Refused or not, nothing outside `into` changed.
            let _ = unpack_archive(&archive, &into);
            let names: Vec<_> = std::fs::read_dir(&outside)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["secret"], "case {i}");
            let secret = std::fs::read_to_string(outside.join("secret")).unwrap();
            assert_eq!(secret, "kept", "case {i}");
            // And what it holds is no image.
            assert!(read_dir(&into, None, 1 << 20).is_err(), "case {i}");
        }
        let top = std::fs::read_dir(&base).unwrap().count();
        assert_eq!(
            top,
            1 + 2 * cases.len(),
            "only the canary, archives and scratches"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
