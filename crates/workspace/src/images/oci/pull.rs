//! Pulling an image from an OCI or Docker registry (the `oci-client`
//! crate): the manifest for linux/amd64 and its config, then each layer not
//! already cached, into `<state>/images/.blobs/sha256/` by digest (so a
//! second pull of the same layers downloads nothing), then the same
//! conversion as an import. Credentials come from the Docker config
//! (`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, helpers
//! included); plain HTTP is used only for a registry the caller marks
//! insecure.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWrite;

use super::config::ImageConfig;
use super::layout::Resolved;
use super::rootfs::Step;
use super::OciError;
use crate::images::registry::{ImageError, ImageInfo, ImageRegistry};

/// What to pull.
#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    /// `alpine`, `python:3.12-slim`, `ghcr.io/org/tool:1`, `127.0.0.1:5000/x@sha256:...`.
    pub reference: String,
    /// Name to register it under (default: from the reference).
    pub name: Option<String>,
    /// Speak plain HTTP to this reference's registry.
    pub insecure: bool,
}

/// Progress of a pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// The manifest is read: this many layers of this many bytes.
    Resolved {
        /// Layers in the image.
        layers: usize,
        /// Their compressed size.
        bytes: u64,
    },
    /// Layer `index` (from 1) is cached already.
    Cached {
        /// Which layer.
        index: usize,
    },
    /// Bytes of layer `index` arrived (`done` of `size` so far).
    Downloading {
        /// Which layer.
        index: usize,
        /// Received.
        done: u64,
        /// The layer's size.
        size: u64,
    },
    /// Conversion into a workspace image.
    Convert(Step),
}

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

/// Why the registry could not give the image.
#[derive(Debug, thiserror::Error)]
#[error("pulling `{reference}` from its registry failed")]
pub struct RegistryError {
    /// The reference.
    pub reference: String,
    /// What the client said.
    #[source]
    pub source: OciDistributionError,
}

impl RegistryError {
    /// The stable code: a missing image or tag is NOT_FOUND, refused
    /// credentials FORBIDDEN, a digest mismatch INVALID_INPUT, the rest
    /// (unreachable, server errors) INTERNAL.
    pub fn code(&self) -> crate::code::ErrorCode {
        use crate::code::ErrorCode;
        match &self.source {
            OciDistributionError::ImageManifestNotFoundError(_) => ErrorCode::NotFound,
            OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. } => ErrorCode::Forbidden,
            OciDistributionError::DigestError(_)
            | OciDistributionError::UnsupportedMediaTypeError(_)
            | OciDistributionError::UnsupportedSchemaVersionError(_) => ErrorCode::InvalidInput,
            OciDistributionError::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        oci_client::errors::OciErrorCode::ManifestUnknown
                            | oci_client::errors::OciErrorCode::NameUnknown
                    )
                }) =>
            {
                ErrorCode::NotFound
            }
            _ => ErrorCode::Internal,
        }
    }
}

/// Numbers partial downloads apart.
static NEXT_PARTIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where pulled layers are kept, by digest.
fn blob_dir(registry: &ImageRegistry) -> PathBuf {
    registry.root().join(".blobs/sha256")
}

fn auth_for(registry_host: &str) -> RegistryAuth {
    match docker_credential::get_credential(registry_host) {
        Ok(docker_credential::DockerCredential::UsernamePassword(user, password)) => {
            RegistryAuth::Basic(user, password)
        }
        // An identity token (OAuth refresh token) or no credentials:
        // anonymous, as `docker pull` would be without a login.
        _ => RegistryAuth::Anonymous,
    }
}

fn client(reference: &Reference, insecure: bool) -> Result<Client, OciError> {
    // reqwest's rustls needs a process-wide provider; a second install fails
    // harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = ClientConfig {
        protocol: if insecure {
            ClientProtocol::HttpsExcept(vec![reference.resolve_registry().to_owned()])
        } else {
            ClientProtocol::Https
        },
        platform_resolver: Some(Box::new(linux_amd64_resolver)),
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    };
    Client::try_from(config)
        .map_err(|e| OciError::Unsupported(format!("cannot make a registry client: {e}")))
}

/// Where a pull's progress goes.
type Progress = Arc<Mutex<dyn FnMut(PullEvent) + Send>>;

fn report(progress: &Progress, event: PullEvent) {
    if let Ok(mut p) = progress.lock() {
        p(event);
    }
}

/// Layer `index` as it is written: counts the bytes, reports them, and
/// refuses more than the descriptor's `size`.
struct Counted<W> {
    inner: W,
    index: usize,
    written: u64,
    size: u64,
    progress: Progress,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.written + buf.len() as u64 > self.size {
            return Poll::Ready(Err(std::io::Error::other(
                "the registry sent more bytes than the layer's size",
            )));
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.written += n as u64;
            let event = PullEvent::Downloading {
                index: self.index,
                done: self.written,
                size: self.size,
            };
            report(&self.progress, event);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Pulls `req` and registers it; `progress` hears each step.
pub async fn pull(
    registry: &ImageRegistry,
    req: &PullRequest,
    progress: Progress,
) -> Result<Pulled, ImageError> {
    let reference: Reference = req.reference.trim().parse().map_err(|e| {
        ImageError::Oci(OciError::Unsupported(format!(
            "`{}` is not an image reference: {e}",
            req.reference
        )))
    })?;
    let name = match &req.name {
        Some(name) => name.clone(),
        None => super::image_name(
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
    let registry_error = |source| {
        ImageError::Registry(RegistryError {
            reference: reference.whole(),
            source,
        })
    };
    let client = client(&reference, req.insecure)?;
    let auth = auth_for(reference.resolve_registry());
    let (manifest, manifest_digest, config_json) = client
        .pull_manifest_and_config(&reference, &auth)
        .await
        .map_err(registry_error)?;
    match registry.get(&name) {
        Ok(existing)
            if existing
                .origin
                .as_ref()
                .is_some_and(|o| o.manifest_digest == manifest_digest) =>
        {
            return Ok(Pulled {
                image: existing,
                downloaded_bytes: 0,
                cached_layers: manifest.layers.len(),
                unchanged: true,
            });
        }
        Ok(_) => return Err(ImageError::Exists(name)),
        Err(ImageError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let config = ImageConfig::parse(config_json.as_bytes())?;
    let total: u64 = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
    report(
        &progress,
        PullEvent::Resolved {
            layers: manifest.layers.len(),
            bytes: total,
        },
    );
    let blobs = blob_dir(registry);
    tokio::fs::create_dir_all(&blobs)
        .await
        .map_err(|e| OciError::io(format!("creating {}", blobs.display()), e))?;
    let (mut downloaded, mut cached) = (0u64, 0usize);
    let mut layers = Vec::new();
    for (i, layer) in manifest.layers.iter().enumerate() {
        let index = i + 1;
        let hex = super::unpack::digest_hex(&layer.digest)?;
        let path = blobs.join(hex);
        let size = layer.size.max(0) as u64;
        if tokio::fs::metadata(&path)
            .await
            .is_ok_and(|m| m.len() == size)
        {
            cached += 1;
            report(&progress, PullEvent::Cached { index });
        } else {
            // Unique per download: two pulls in one process may fetch the
            // same layer at once.
            let n = NEXT_PARTIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let partial = blobs.join(format!("{hex}.partial-{}-{n}", std::process::id()));
            let file = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| OciError::io(format!("creating {}", partial.display()), e))?;
            let writer = Counted {
                inner: file,
                index,
                written: 0,
                size,
                progress: progress.clone(),
            };
            let fetched = client.pull_blob(&reference, layer, writer).await;
            if let Err(e) = fetched {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(registry_error(e));
            }
            tokio::fs::rename(&partial, &path)
                .await
                .map_err(|e| OciError::io(format!("keeping layer {}", layer.digest), e))?;
            downloaded += size;
        }
        layers.push((path, layer.digest.clone()));
    }
    let resolved = Resolved {
        reference: Some(reference.whole()),
        manifest_digest,
        config_digest: manifest.config.digest.clone(),
        config,
        layers,
    };
    let registry = registry.clone();
    let source = PathBuf::from(reference.whole());
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
