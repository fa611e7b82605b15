//! The registry side of a pull, from an OCI or Docker registry (the
//! `oci-client` crate): the manifest for linux/amd64 and its config, then
//! each layer not already cached, into a blob directory by digest (so a
//! second pull of the same layers downloads nothing); `images::pull`
//! registers the result. Credentials come from the Docker config
//! (`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, helpers
//! included); plain HTTP is used only for a registry the caller marks
//! insecure. The manifest fetch is `manifest`, the registry's errors
//! `registry_error`.

mod manifest;
mod registry_error;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use tokio::io::AsyncWrite;

use base::images::oci::config::ImageConfig;
use base::images::oci::layout::Resolved;
use base::images::oci::rootfs::ConversionStep;
use base::images::oci::OciError;
use manifest::ManifestSource;
pub use registry_error::{PullError, RegistryError};

/// How many layers download at once (containerd's default).
const CONCURRENT_LAYERS: usize = 3;

/// What to pull.
#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    /// `alpine`, `python:3.12-slim`, `ghcr.io/org/tool:1`, `127.0.0.1:5000/x@sha256:...`.
    pub reference: String,
    /// Name to register it under (default: from the reference).
    pub name: Option<String>,
    /// Speak plain HTTP to this reference's registry.
    pub insecure: bool,
    /// Convert it into a root filesystem now, not at its first use.
    pub convert: bool,
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
    Convert(ConversionStep),
}

/// Numbers partial downloads apart.
static NEXT_PARTIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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

/// How long to wait for a registry to accept a connection, and for the
/// next bytes of an answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const READ_TIMEOUT: Duration = Duration::from_secs(120);

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
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        ..Default::default()
    };
    Client::try_from(config)
        .map_err(|e| OciError::Unsupported(format!("cannot make a registry client: {e}")))
}

/// Where a pull's progress goes.
pub type PullProgress = Arc<Mutex<dyn FnMut(PullEvent) + Send>>;

/// Tells `progress` of `event`.
pub(crate) fn report(progress: &PullProgress, event: PullEvent) {
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
    progress: PullProgress,
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

/// The cached blob at `path`, open, if it is whole: a regular file (not a
/// link) of `size` bytes whose content has `digest`, read through the
/// open file, so what is checked is what a conversion reads (a damaged one
/// is fetched again).
async fn open_cached(path: &Path, size: u64, digest: &str) -> Option<std::fs::File> {
    let (path, digest) = (path.to_owned(), digest.to_owned());
    tokio::task::spawn_blocking(move || {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() != size {
            return None;
        }
        let this = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        base::images::oci::layout::verify_file(&this, &digest, "layer").ok()?;
        Some(file)
    })
    .await
    .ok()
    .flatten()
}

/// `path` opened and synced: the download is on disk before it is kept
/// under its digest (a failing disk fails the pull, not the next
/// conversion), and the open file is what the conversion reads.
async fn open_synced(path: &Path) -> std::io::Result<std::fs::File> {
    let file = tokio::fs::File::open(path).await?;
    file.sync_all().await?;
    Ok(file.into_std().await)
}

/// Removes a file when dropped, which a kept download (renamed away) no
/// longer is.
struct RemoveUnlessKept(PathBuf);

impl Drop for RemoveUnlessKept {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Removes the partial downloads of pulls whose process is gone (killed
/// mid-download): `HEX.partial-PID-N`.
fn sweep_partials(blobs: &Path) {
    let Ok(entries) = std::fs::read_dir(blobs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((_, rest)) = name.to_str().and_then(|n| n.split_once(".partial-")) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// An image's manifest and config, read from its registry, with the client
/// that fetches its layers.
pub(crate) struct Remote {
    client: Client,
    reference: Reference,
    /// The image's manifest for linux/amd64.
    pub manifest: oci_client::manifest::OciImageManifest,
    /// Its digest.
    pub manifest_digest: String,
    /// The image's configuration, as the registry sent it (parsed when
    /// its layers are fetched).
    config_json: String,
}

/// Parses `req`'s reference.
pub(crate) fn reference(req: &PullRequest) -> Result<Reference, OciError> {
    req.reference.trim().parse().map_err(|e| {
        OciError::Unsupported(format!(
            "`{}` is not an image reference: {e}",
            req.reference
        ))
    })
}

impl Remote {
    /// Reads `reference`'s manifest and config from its registry; the
    /// config and every layer must declare sizes within `limits`.
    pub(crate) async fn open(
        reference: Reference,
        insecure: bool,
        limits: &base::store::spec::Limits,
    ) -> Result<Remote, PullError> {
        let client = client(&reference, insecure)?;
        // Credentials go only over TLS: a registry spoken to in plain HTTP
        // gets none.
        let auth = if insecure {
            RegistryAuth::Anonymous
        } else {
            auth_for(reference.resolve_registry())
        };
        let registry_error = |source| RegistryError {
            reference: reference.whole(),
            source,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| registry_error(e.into()))?;
        let source = ManifestSource {
            client: &client,
            http,
            auth: &auth,
            insecure,
            limit: limits.max_image_metadata_bytes,
        };
        let (manifest, manifest_digest) = source.image_manifest(&reference).await?;
        let declared = |size: i64, limit: u64, what: &'static str| {
            if size < 0 || size as u64 > limit {
                return Err(OciError::OverLimit { what, limit });
            }
            Ok(size as u64)
        };
        let config_size = declared(
            manifest.config.size,
            limits.max_image_metadata_bytes,
            "config bytes",
        )?;
        for layer in &manifest.layers {
            declared(layer.size, limits.max_layer_bytes, "bytes in one layer")?;
        }
        // At most the declared size: the writer refuses more.
        let mut config = crate::host::host_write::Budgeted::new(Vec::new(), config_size);
        client
            .pull_blob(&reference, &manifest.config, &mut config)
            .await
            .map_err(registry_error)?;
        let config_json = String::from_utf8(config.into_inner())
            .map_err(|_| OciError::Unsupported("the image's config is not UTF-8 JSON".into()))?;
        Ok(Remote {
            client,
            reference,
            manifest,
            manifest_digest,
            config_json,
        })
    }

    /// The reference, whole (`registry/repository:tag`).
    pub(crate) fn reference_whole(&self) -> String {
        self.reference.whole()
    }

    /// The image's configuration, as the registry sent it.
    pub(crate) fn config_json(&self) -> &str {
        &self.config_json
    }

    /// The image as it will be once its layers are in `blobs`: each
    /// layer's file there is named by its digest, so a conversion can
    /// begin before the downloads end.
    pub(crate) fn resolved(&self, blobs: &Path) -> Result<Resolved, PullError> {
        let config = ImageConfig::parse(self.config_json.as_bytes())?;
        let layers = self
            .manifest
            .layers
            .iter()
            .map(|layer| {
                let hex = base::images::oci::unpack::digest_hex(&layer.digest)?;
                Ok((blobs.join(hex), layer.digest.clone()))
            })
            .collect::<Result<Vec<_>, OciError>>()?;
        Ok(Resolved {
            reference: Some(self.reference.whole()),
            manifest_digest: self.manifest_digest.clone(),
            config_digest: self.manifest.config.digest.clone(),
            config,
            layers,
            // pull_blob checks each download's digest, open_cached each
            // cached blob's, before `arrived` is handed it.
            layers_verified: true,
        })
    }

    /// Fetches each layer not already in `blobs` (an existing directory;
    /// by digest) into it,
    /// handing `arrived` (if any: a conversion under way) each layer's
    /// index (from 0) and its file, open, once it is there and checked, in
    /// whatever order they come; returns the bytes downloaded and the
    /// number of layers found cached. A `arrived` no longer listening (the
    /// conversion ended) ends it.
    pub(crate) async fn fetch_layers(
        &self,
        blobs: &Path,
        progress: &PullProgress,
        arrived: Option<&std::sync::mpsc::Sender<(usize, std::fs::File)>>,
    ) -> Result<(u64, usize), PullError> {
        let total: u64 = self
            .manifest
            .layers
            .iter()
            .map(|l| l.size.max(0) as u64)
            .sum();
        report(
            progress,
            PullEvent::Resolved {
                layers: self.manifest.layers.len(),
                bytes: total,
            },
        );
        sweep_partials(blobs);
        // Three at a time, as containerd fetches: a registry serves each
        // connection at its own pace.
        use futures_util::stream::{self, StreamExt, TryStreamExt};
        // What this pull put in the store: taken out again if it fails, so
        // a failed pull leaves the store as it was.
        let kept = Mutex::new(Vec::new());
        let mut fetches = Vec::new();
        for (i, layer) in self.manifest.layers.iter().enumerate() {
            let fetch = self.fetch_layer(i + 1, layer, blobs, progress, &kept);
            fetches.push(async move {
                let (bytes, file) = fetch.await?;
                let Some(arrived) = arrived else {
                    return Ok::<_, PullError>(bytes);
                };
                if arrived.send((i, file)).is_err() {
                    // The conversion ended (it failed): its error is the
                    // pull's, and the rest need not come.
                    return Err(OciError::LayerNotFetched(i + 1).into());
                }
                Ok::<_, PullError>(bytes)
            });
        }
        let fetched: Result<Vec<Option<u64>>, PullError> = stream::iter(fetches)
            .buffer_unordered(CONCURRENT_LAYERS)
            .try_collect()
            .await;
        let kept = kept.into_inner().unwrap_or_else(|p| p.into_inner());
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(e) => {
                for path in kept {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
        };
        let downloaded = fetched.iter().flatten().sum();
        let cached = fetched.iter().filter(|b| b.is_none()).count();
        Ok((downloaded, cached))
    }

    /// Layer `index` (from 1) in `blobs` under its digest: the bytes
    /// downloaded (`None`: it was there, intact) and the file, open.
    async fn fetch_layer(
        &self,
        index: usize,
        layer: &oci_client::manifest::OciDescriptor,
        blobs: &Path,
        progress: &PullProgress,
        kept: &Mutex<Vec<PathBuf>>,
    ) -> Result<(Option<u64>, std::fs::File), PullError> {
        let hex = base::images::oci::unpack::digest_hex(&layer.digest)?;
        let path = blobs.join(hex);
        let size = layer.size.max(0) as u64;
        if let Some(file) = open_cached(&path, size, &layer.digest).await {
            report(progress, PullEvent::Cached { index });
            return Ok((None, file));
        }
        // Unique per download: two pulls in one process may fetch the
        // same layer at once.
        let n = NEXT_PARTIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = blobs.join(format!("{hex}.partial-{}-{n}", std::process::id()));
        // A pull dropped mid-download (a cancelled call, or another
        // layer's failure) leaves none.
        let _unfinished = RemoveUnlessKept(partial.clone());
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
        let fetched = self.client.pull_blob(&self.reference, layer, writer).await;
        if let Err(source) = fetched {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(RegistryError {
                reference: self.reference.whole(),
                source,
            }
            .into());
        }
        let file = match open_synced(&partial).await {
            Ok(file) => file,
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(OciError::io(format!("writing {}", partial.display()), e).into());
            }
        };
        // Renamed and recorded with no await between: a pull dropped
        // meanwhile cannot keep a layer it does not know of.
        std::fs::rename(&partial, &path)
            .map_err(|e| OciError::io(format!("keeping layer {}", layer.digest), e))?;
        kept.lock().unwrap_or_else(|p| p.into_inner()).push(path);
        Ok((Some(size), file))
    }
}
