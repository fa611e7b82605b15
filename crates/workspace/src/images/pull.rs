//! `image pull`: an image from a registry ([`oci::pull`](super::oci::pull)
//! fetches it, layers cached by digest in `<state>/images/.blobs/sha256/`)
//! converted as an import is and registered.

use std::path::PathBuf;

use super::oci::pull::{report, PullError, Remote};
pub use super::oci::pull::{PullEvent, PullProgress, PullRequest};
use super::oci::OciError;
use super::registry::{ImageError, ImageInfo, ImageRegistry};

/// What a pull did.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(serde::Serialize)]
pub struct Pulled {
    /// The registered image.
    pub image: ImageInfo,
    /// Bytes downloaded (0 when every layer was cached or the image was
    /// registered already).
    pub downloaded_bytes: u64,
    /// Layers found in the cache.
    pub cached_layers: usize,
    /// The image was registered already with this manifest: nothing done.
    pub unchanged: bool,
}

impl From<PullError> for ImageError {
    fn from(e: PullError) -> Self {
        match e {
            PullError::Oci(e) => ImageError::Oci(e),
            PullError::Registry(e) => ImageError::Registry(e),
        }
    }
}

/// Pulls `req` and registers it; `progress` hears each step.
pub async fn pull(
    registry: &ImageRegistry,
    req: &PullRequest,
    progress: PullProgress,
) -> Result<Pulled, ImageError> {
    let reference = super::oci::pull::reference(req)?;
    let name = match &req.name {
        Some(name) => name.clone(),
        None => super::oci::image_name(
            Some(reference.repository())
                .map(|repo| match reference.tag() {
                    Some(tag) => format!("{repo}:{tag}"),
                    None => repo.to_owned(),
                })
                .as_deref(),
        )
        .ok_or_else(|| {
            ImageError::Oci(OciError::Unsupported(format!(
                "cannot name an image after `{}`; give a name",
                req.reference
            )))
        })?,
    };
    let source = PathBuf::from(reference.whole());
    let remote = Remote::open(reference, req.insecure, registry.limits()).await?;
    match registry.get(&name) {
        Ok(existing)
            if existing
                .origin
                .as_ref()
                .is_some_and(|o| o.manifest_digest == remote.manifest_digest) =>
        {
            return Ok(Pulled {
                image: existing,
                downloaded_bytes: 0,
                cached_layers: remote.manifest.layers.len(),
                unchanged: true,
            });
        }
        Ok(_) => return Err(ImageError::Exists(name)),
        Err(ImageError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    // Pulled layers are kept by digest beside the images.
    let blobs = registry.root().join(".blobs/sha256");
    let (resolved, downloaded, cached) = remote.fetch_layers(&blobs, &progress).await?;
    let registry = registry.clone();
    let image = tokio::task::spawn_blocking(move || {
        let mut convert = |step| report(&progress, PullEvent::Convert(step));
        registry.import_image(&name, &resolved, &source, &mut convert)
    })
    .await
    .map_err(|e| OciError::io("converting the image", std::io::Error::other(e.to_string())))??;
    Ok(Pulled {
        image,
        downloaded_bytes: downloaded,
        cached_layers: cached,
        unchanged: false,
    })
}
