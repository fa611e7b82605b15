//! Container images (OCI and Docker) as workspace images: an image's
//! layers, uncompressed (`compression`), are applied in order to a
//! directory tree (`unpack`), our guest init and agent are added under
//! `/.microagent/` (so the image's own
//! files stay as they are), and the tree becomes an ext4 root image
//! (`rootfs`). The image config's Env, WorkingDir, User and Cmd become the
//! defaults of workspaces made of it.
//!
//! Sources: an OCI image layout directory, a tar of one, or a
//! `docker save` tarball (`layout`), or a registry (`pull`).

pub mod compression;
pub mod config;
mod layer_reader;
pub mod layout;
pub mod owners;
pub mod rootfs;
pub(crate) mod tree;
pub mod unpack;

use std::io;
use std::path::PathBuf;

use crate::code::ErrorCode;

pub use config::{ImageDefaults, OciOrigin};

/// Why a container image could not be read or converted.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// Reading or writing files failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The source is not an image this reads.
    #[error("{}: {problem}", path.display())]
    NotAnImage {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A JSON document of the image is malformed.
    #[error("the image's {what} is not valid")]
    Json {
        /// Which document.
        what: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// Something the image needs that this does not do.
    #[error("{0}")]
    Unsupported(String),
    /// A digest that is not `sha256:` and 64 hex digits.
    #[error("`{0}` is not a sha256 digest")]
    BadDigest(String),
    /// Content that does not match its digest.
    #[error("the {what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Which content.
        what: String,
        /// The digest the image names.
        expected: String,
        /// The digest of the bytes read.
        actual: String,
    },
    /// A layer entry whose path (or link target) climbs out of the root.
    #[error("a layer entry `{0}` has a path outside the image's root")]
    LayerPath(String),
    /// A layer entry below something that is not a directory.
    #[error("a layer entry `{0}` lies below a file")]
    NotADirectory(String),
    /// An image is larger than a limit allows (a gzip bomb, a manifest
    /// that claims too much): `Limits::max_image_*`, `max_layer_bytes`.
    #[error("the image is over the limit of {limit} {what}")]
    OverLimit {
        /// What was counted: `uncompressed bytes`, `entries`, ...
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// A layer the conversion waited for never came (its pull failed or
    /// was dropped).
    #[error("layer {0} of the image never arrived")]
    LayerNotFetched(usize),
    /// A host tool (mkfs.ext4, debugfs) failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its exit status and stderr.
        detail: String,
    },
}

/// A workspace image name for a container image reference: its last path
/// part and tag, lowercased, other characters as `-` (`python:3.12-slim`
/// is `python-3-12-slim`; the `latest` tag is left out).
pub fn image_name(reference: Option<&str>) -> Option<String> {
    let reference = reference?.trim();
    let last = reference.rsplit('/').next()?;
    let last = last.split('@').next()?;
    let last = last.strip_suffix(":latest").unwrap_or(last);
    let mut name = String::new();
    for c in last.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
        } else if !name.ends_with('-') && !name.is_empty() {
            name.push('-');
        }
    }
    let name = name.trim_end_matches('-');
    let name: String = name.chars().take(63).collect();
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return (!name.is_empty()).then(|| format!("img-{name}"));
    }
    Some(name)
}

impl OciError {
    /// Reading or writing files failed while doing `what`.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        OciError::Io {
            what: what.into(),
            source,
        }
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            OciError::Io { .. } | OciError::Tool { .. } | OciError::LayerNotFetched(_) => {
                ErrorCode::Internal
            }
            OciError::NotAnImage { .. }
            | OciError::Json { .. }
            | OciError::Unsupported(_)
            | OciError::BadDigest(_)
            | OciError::DigestMismatch { .. }
            | OciError::OverLimit { .. }
            | OciError::LayerPath(_)
            | OciError::NotADirectory(_) => ErrorCode::InvalidInput,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_images() {
        assert_eq!(
            image_name(Some("python:3.12-slim")).as_deref(),
            Some("python-3-12-slim")
        );
        assert_eq!(
            image_name(Some("docker.io/library/alpine:latest")).as_deref(),
            Some("alpine")
        );
        assert_eq!(
            image_name(Some("127.0.0.1:5000/team/Tool:1")).as_deref(),
            Some("tool-1")
        );
        assert_eq!(image_name(Some("3proxy")).as_deref(), Some("img-3proxy"));
        assert_eq!(image_name(Some("")), None);
        assert_eq!(image_name(None), None);
    }
}
