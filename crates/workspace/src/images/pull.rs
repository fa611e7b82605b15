//! `image pull`: an image from a registry ([`oci_pull`](super::oci_pull)
//! fetches it, layers cached by digest in the registry's blob store),
//! recorded to be converted at its first use, or converted at once as an
//! import is (`convert`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::oci_pull::{report, Remote};
pub use super::oci_pull::{PullError, PullEvent, PullProgress, PullRequest};
use base::images::oci::rootfs::LayerArrival;
use base::images::oci::OciError;
use base::images::registry::{ImageError, ImageInfo, ImageRegistry};

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

/// When an image named by an OCI reference is pulled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PullPolicy {
    /// Never: the reference must have been pulled before.
    Never,
    /// When no image is registered under its name (the default).
    #[default]
    Missing,
    /// Every time (a changed image under the same name is refused).
    Always,
}

/// Whether `image` is an OCI reference (`python:3.12-alpine`,
/// `127.0.0.1:5000/team/tool:1`) rather than a registered image's name,
/// which has none of `/`, `:`, `.` or `@`.
pub fn is_reference(image: &str) -> bool {
    image.contains(['/', ':', '.', '@'])
}

/// Whether the registry of `reference` is on this machine's loopback
/// (spoken to in plain HTTP without asking, as Docker does).
pub fn on_loopback(reference: &str) -> bool {
    let Some((host, _)) = reference.split_once('/') else {
        return false;
    };
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The name an image pulled from `reference` is registered under when
/// none is given: its last path element and tag (`127.0.0.1:5000/team/tool:1`
/// is `tool-1`).
fn default_name(req: &PullRequest) -> Result<String, ImageError> {
    let reference = super::oci_pull::reference(req)?;
    super::oci::image_name(
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
    })
}

/// The registered image `image` names, for a new workspace: a registered
/// name as it is; an OCI reference is pulled first as `policy` says and
/// registered under its default name, which is returned. A pulled image
/// is converted. `progress` hears a pull's and a conversion's steps.
pub async fn resolve(
    registry: &ImageRegistry,
    image: &str,
    policy: PullPolicy,
    progress: PullProgress,
) -> Result<String, PullError> {
    if !is_reference(image) {
        // A pulled image is converted here, where its steps can be shown,
        // rather than silently by the create.
        if registry.find(image)?.is_some_and(|i| i.awaiting_conversion) {
            convert_pulled(registry, image, progress).await?;
        }
        return Ok(image.to_owned());
    }
    let req = PullRequest {
        reference: image.to_owned(),
        name: None,
        insecure: false,
        // Converted here, for the workspace about to be made of it.
        convert: true,
    };
    let name = default_name(&req)?;
    let found = registry.find(&name)?;
    // The name is the reference's last element: another registry's image
    // may hold it, and must not be taken for this one.
    let asked = super::oci_pull::reference(&req)?.whole();
    if let Some(found) = &found {
        let holds = found.origin.as_ref().map_or("", |o| o.reference.as_str());
        if holds != asked {
            return Err(ImageError::OtherReference {
                name,
                holds: holds.to_owned(),
                asked,
            }
            .into());
        }
    }
    if found.as_ref().is_some_and(|i| i.awaiting_conversion) && policy != PullPolicy::Always {
        convert_pulled(registry, &name, progress).await?;
        return Ok(name);
    }
    match (policy, found.is_some()) {
        (PullPolicy::Never, false) => Err(ImageError::NotPulled {
            reference: image.to_owned(),
            name,
        }
        .into()),
        (PullPolicy::Never | PullPolicy::Missing, true) => Ok(name),
        (PullPolicy::Missing | PullPolicy::Always, _) => {
            pull(registry, &req, progress).await.map(|p| p.image.name)
        }
    }
}

/// Pulls one process (the MCP server, many clients) runs at once; the
/// rest wait their turn. Each holds a conversion thread, three downloads
/// and a scratch tree.
const CONCURRENT_PULLS: usize = 4;

static PULL_TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(CONCURRENT_PULLS);

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Pulls `req` and registers it; `progress` hears each step. A registry on
/// loopback is spoken to in plain HTTP whether or not `req` says so.
/// Dropped before it ends, it leaves no image and no partial download (a
/// conversion under way finishes and is thrown away).
pub async fn pull(
    registry: &ImageRegistry,
    req: &PullRequest,
    progress: PullProgress,
) -> Result<Pulled, PullError> {
    let reference = super::oci_pull::reference(req)?;
    let name = match &req.name {
        Some(name) => name.clone(),
        None => default_name(req)?,
    };
    let source = PathBuf::from(reference.whole());
    let insecure = req.insecure || on_loopback(&req.reference);
    // Never closed, so a turn always comes.
    let _turn = PULL_TURNS.acquire().await;
    let remote = Remote::open(reference, insecure, registry.limits()).await?;
    // Pulled before and not converted yet: its layers are checked again
    // (one may have gone from the store since) and fetched if missing.
    let pulled_again = match registry.find(&name)? {
        Some(existing)
            if existing
                .origin
                .as_ref()
                .is_some_and(|o| o.manifest_digest == remote.manifest_digest) =>
        {
            if !existing.awaiting_conversion {
                return Ok(Pulled {
                    image: existing,
                    downloaded_bytes: 0,
                    cached_layers: remote.manifest.layers.len(),
                    unchanged: true,
                });
            }
            true
        }
        Some(_) => return Err(ImageError::Exists(name).into()),
        None => false,
    };
    let blobs = registry.blobs_dir();
    // The config is read, and its layers counted, whether or not the
    // conversion is now: a pull that cannot be converted fails here.
    let resolved = remote.resolved(&blobs)?;
    // Made before the conversion starts: an image without layers is
    // converted at once, and then nothing may fail after it.
    tokio::fs::create_dir_all(&blobs)
        .await
        .map_err(|e| OciError::io(format!("creating {}", blobs.display()), e))?;
    if !req.convert || pulled_again {
        if resolved.layers.len() != resolved.config.rootfs.diff_ids.len() {
            return Err(OciError::Unsupported(
                "its manifest and config list different numbers of layers".into(),
            )
            .into());
        }
        let mut pulled =
            fetch_for_later(registry, &remote, name.clone(), &blobs, progress.clone()).await?;
        pulled.unchanged = pulled_again;
        if req.convert {
            pulled.image = convert_pulled(registry, &name, progress).await?;
        }
        return Ok(pulled);
    }
    // A pull dropped during the conversion (a cancelled call) must not
    // register the image the conversion goes on to make.
    let dropped = Arc::new(AtomicBool::new(false));
    let _on_drop = SetOnDrop(dropped.clone());
    // Each layer is applied as soon as it and those below it are in,
    // while later ones still download. The conversion has a thread of
    // its own: it waits for layers whose downloads need the runtime's
    // blocking threads, which it must not hold.
    let (arrived, arrivals) = std::sync::mpsc::channel::<(usize, std::fs::File)>();
    let (done, converted) = tokio::sync::oneshot::channel();
    {
        let (registry, progress, dropped) = (registry.clone(), progress.clone(), dropped.clone());
        std::thread::Builder::new()
            .name("image-convert".into())
            .spawn(move || {
                let mut convert = |step| report(&progress, PullEvent::Convert(step));
                let mut here = std::collections::BTreeMap::new();
                let mut ready = |index| loop {
                    if let Some(file) = here.remove(&index) {
                        return LayerArrival::Open(file);
                    }
                    match arrivals.recv() {
                        Ok((i, file)) => {
                            here.insert(i, file);
                        }
                        // The fetch ended without it (failed, or dropped).
                        Err(_) => return LayerArrival::Never,
                    }
                };
                let image = registry.import_image(
                    &name,
                    &resolved,
                    &source,
                    &mut convert,
                    &mut ready,
                    &dropped,
                );
                let _ = done.send(image);
            })
            .map_err(|e| OciError::io("starting the image conversion", e))?;
    }
    let fetch = async move {
        let fetched = remote.fetch_layers(&blobs, &progress, Some(&arrived)).await;
        // The conversion hears that no more will come.
        drop(arrived);
        fetched
    };
    tokio::pin!(fetch, converted);
    let gone = || {
        OciError::io(
            "converting the image",
            std::io::Error::other("the conversion thread ended"),
        )
    };
    let (fetched, image) = tokio::select! {
        fetched = &mut fetch => (fetched, (&mut converted).await.map_err(|_| gone())?),
        // Ended before the last layer came: it failed (the downloads
        // stop), or the image has no layers.
        image = &mut converted => match image.map_err(|_| gone())? {
            Err(e) => return Err(e.into()),
            Ok(image) => (fetch.await, Ok(image)),
        },
    };
    match (fetched, image) {
        (Ok((downloaded, cached)), Ok(image)) => Ok(Pulled {
            image,
            downloaded_bytes: downloaded,
            cached_layers: cached,
            unchanged: false,
        }),
        // The conversion stopped for want of a layer: the fetch's failure
        // is the pull's.
        (Err(e), Err(ImageError::Oci(OciError::LayerNotFetched(_)))) => Err(e),
        // Otherwise the conversion's (a fetch it stopped says only that).
        (_, Err(e)) => Err(e.into()),
        // A conversion needs every layer, so it cannot finish before a
        // fetch that then fails (an image without layers has nothing to
        // fetch).
        (Err(e), Ok(_)) => Err(e),
    }
}

/// Fetches `remote`'s layers into `blobs` and records the image as pulled,
/// to be converted at its first use.
async fn fetch_for_later(
    registry: &ImageRegistry,
    remote: &Remote,
    name: String,
    blobs: &std::path::Path,
    progress: PullProgress,
) -> Result<Pulled, PullError> {
    let (downloaded, cached) = remote.fetch_layers(blobs, &progress, None).await?;
    let pulled = base::images::registry::PulledImage {
        name,
        reference: remote.reference_whole(),
        manifest_digest: remote.manifest_digest.clone(),
        config_digest: remote.manifest.config.digest.clone(),
        config_json: remote.config_json().to_owned(),
        layers: remote
            .manifest
            .layers
            .iter()
            .map(|l| l.digest.clone())
            .collect(),
        pulled_at_ms: base::host::settings::now_ms(),
    };
    let registry = registry.clone();
    let image = tokio::task::spawn_blocking(move || registry.record_pulled(&pulled))
        .await
        .map_err(|e| OciError::io("recording the pull", std::io::Error::other(e)))??;
    Ok(Pulled {
        image,
        downloaded_bytes: downloaded,
        cached_layers: cached,
        unchanged: false,
    })
}

/// Converts the pulled image `name` (on a blocking thread: it writes a
/// whole root filesystem), telling `progress` each step.
pub async fn convert_pulled(
    registry: &ImageRegistry,
    name: &str,
    progress: PullProgress,
) -> Result<ImageInfo, PullError> {
    let (registry, name) = (registry.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || {
        registry.convert_pulled(&name, &mut |step| {
            report(&progress, PullEvent::Convert(step))
        })
    })
    .await
    .map_err(|e| OciError::io("converting the image", std::io::Error::other(e)))?
    .map_err(PullError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_names_are_told_apart() {
        for r in [
            "python:3.12-alpine",
            "127.0.0.1:5000/team/tool:1",
            "ghcr.io/org/tool",
            "alpine@sha256:0123",
        ] {
            assert!(is_reference(r), "{r}");
        }
        for n in ["minimal", "debian", "tool-1"] {
            assert!(!is_reference(n), "{n}");
        }
    }

    #[test]
    fn loopback_registries_are_known() {
        for r in [
            "127.0.0.1:5000/team/tool:1",
            "localhost:5000/x",
            "localhost/x",
            "[::1]:5000/x:1",
            "127.0.0.2/x",
        ] {
            assert!(on_loopback(r), "{r}");
        }
        for r in [
            "python:3.12",
            "ghcr.io/org/tool:1",
            "10.0.0.1:5000/x",
            "docker.io/library/alpine",
        ] {
            assert!(!on_loopback(r), "{r}");
        }
    }

    #[tokio::test]
    async fn a_reference_never_takes_an_image_pulled_from_elsewhere_under_its_name() {
        let root = std::env::temp_dir().join(format!("ma-resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let state = base::store::StateDir::at(root.join("state")).unwrap();
        let registry = ImageRegistry::new(&state, None, vmm_core::KernelVariant::Compat);
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
        });
        registry
            .record_pulled(&base::images::registry::PulledImage {
                name: "python-3-12".into(),
                reference: "evil.example/x/python:3.12".into(),
                manifest_digest: format!("sha256:{}", "c".repeat(64)),
                config_digest: format!("sha256:{}", "d".repeat(64)),
                config_json: config.to_string(),
                layers: Vec::new(),
                pulled_at_ms: 1,
            })
            .unwrap();
        let quiet: PullProgress = Arc::new(std::sync::Mutex::new(|_: PullEvent| {}));
        for policy in [PullPolicy::Never, PullPolicy::Missing, PullPolicy::Always] {
            let err = resolve(&registry, "python:3.12", policy, quiet.clone())
                .await
                .unwrap_err();
            let err = crate::error::Error::from(err);
            assert_eq!(err.code(), base::code::ErrorCode::Conflict, "{err}");
            assert!(err.to_string().contains("evil.example"), "{err}");
        }
        // Nothing was converted or changed.
        assert!(
            registry
                .find("python-3-12")
                .unwrap()
                .unwrap()
                .awaiting_conversion
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_pulled_reference_is_named_after_its_last_element_and_tag() {
        let req = |r: &str| PullRequest {
            reference: r.into(),
            ..PullRequest::default()
        };
        assert_eq!(
            default_name(&req("127.0.0.1:5000/team/tool:1")).unwrap(),
            "tool-1"
        );
        assert_eq!(
            default_name(&req("python:3.12-alpine")).unwrap(),
            "python-3-12-alpine"
        );
        assert_eq!(default_name(&req("alpine")).unwrap(), "alpine");
    }
}
