//! Image tools: image_inspect, image_import, image_pull, image_search,
//! image_delete (image_list is with the information tools).

use std::sync::{Arc, Mutex};

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::images::oci::rootfs::ConversionStep;
use workspace::images::pull::{PullEvent, PullPolicy, PullRequest, Pulled};

use super::would_or_did;
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::images::*;
use crate::{MicroagentServer, ToolError};

/// Every file and symlink below `dir` (an image layout is a few levels deep).
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) => out.push(path),
                Err(_) => {}
            }
        }
    }
    out
}

use workspace::images::oci::config::ImageDefaults;

impl MicroagentServer {
    /// The registered image a new workspace of `image` (default
    /// `minimal`) boots: an OCI reference is pulled first as `pull` says
    /// (default `missing`), and a pulled image converted, with progress.
    pub(crate) async fn image_for(
        &self,
        image: Option<&str>,
        pull: Option<PullPolicy>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<String, crate::error::ToolError> {
        let image = image.unwrap_or(workspace::store::spec::defaults::IMAGE);
        let step = if workspace::images::pull::is_reference(image) {
            format!("pulling {image}")
        } else if self
            .ws
            .image_registry()
            .find(image)
            .ok()
            .flatten()
            .is_some_and(|i| i.awaiting_conversion)
        {
            format!("converting {image}")
        } else {
            return Ok(image.to_owned());
        };
        let (images, reference) = (self.ws.image_registry().clone(), image.to_owned());
        let policy = pull.unwrap_or_default();
        let name = with_pull_progress(ctx, step, |events| async move {
            workspace::images::pull::resolve(&images, &reference, policy, events).await
        })
        .await
        .map_err(workspace::Error::from)?;
        Ok(name)
    }

    /// The image a new workspace gets and the sizes it gives those not
    /// asked for: here, [`Self::image_for`] and its registered defaults;
    /// on a server (`remote`), the name as given and no sizes, since the
    /// server pulls the image and sizes by it itself.
    pub(crate) async fn image_and_sizes(
        &self,
        image: Option<&str>,
        pull: Option<PullPolicy>,
        remote: bool,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(String, ImageDefaults), crate::error::ToolError> {
        if remote {
            let image = image.unwrap_or(workspace::store::spec::defaults::IMAGE);
            return Ok((image.to_owned(), ImageDefaults::default()));
        }
        let image = self.image_for(image, pull, ctx).await?;
        let sized = self.ws.image_defaults(&image);
        Ok((image, sized))
    }
}

/// Runs a pull (`call`, given the sink of its events) reporting progress:
/// the latest event, `first` until there is one.
async fn with_pull_progress<T, F, W>(ctx: &RequestContext<RoleServer>, first: String, call: F) -> T
where
    F: FnOnce(workspace::images::pull::PullProgress) -> W,
    W: std::future::Future<Output = T>,
{
    let status = Arc::new(Mutex::new(first));
    let latest = status.clone();
    let events = Arc::new(Mutex::new(move |event: PullEvent| {
        if let Ok(mut s) = latest.lock() {
            *s = describe(&event);
        }
    }));
    Progress::new(ctx)
        .drive(call(events), |_| {
            status.lock().map(|s| s.clone()).unwrap_or_default()
        })
        .await
}

#[tool_router(router = images_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// One image: its kernel and root filesystem (paths, sizes), where it
    /// came from, its manifest, and the workspaces that use it.
    #[tool(
        output_schema = crate::output::schema::<ImageResult>(),
        annotations(
        title = "Inspect an image",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn image_inspect(
        &self,
        Parameters(p): Parameters<ImageNameParams>,
    ) -> ToolResult<ImageResult> {
        let (image, used_by) = self
            .on_workspace(&p.name, |ws, name| {
                let image = ws
                    .image_registry()
                    .find(name)?
                    .ok_or_else(|| workspace::images::ImageError::NotFound(name.to_owned()))?;
                Ok((image, ws.images().users(name)?))
            })
            .await?;
        Ok(Out(ImageResult { image, used_by }))
    }

    /// Register a host directory holding `vmlinux` and `rootfs.ext4` as a
    /// new image (both are checked, then hard-linked or copied in).
    #[tool(
        output_schema = crate::output::schema::<ImageResult>(),
        annotations(
        title = "Import an image",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn image_import(
        &self,
        Parameters(p): Parameters<ImportImageParams>,
    ) -> ToolResult<ImageResult> {
        let path = self.host_roots.existing(&p.path)?;
        // The files inside may be symlinks: each must stay beneath a root too.
        if path.is_dir() {
            for entry in walk_files(&path) {
                self.host_roots.existing(&entry.to_string_lossy())?;
            }
        }
        let name = p.name;
        let image = self
            .blocking(move |ws| {
                Ok(ws
                    .image_registry()
                    .import_path(name.as_deref(), &path, &mut |_| {})
                    .map_err(workspace::Error::from)?)
            })
            .await?;
        Ok(Out(ImageResult {
            image,
            used_by: Vec::new(),
        }))
    }

    /// Pull an image from an OCI or Docker registry (Docker Hub short names
    /// like `alpine` or `python:3.12-slim`, GHCR, private registries with
    /// credentials from the Docker config) as a workspace image named after
    /// it: its layers are downloaded and checked, and its root filesystem
    /// made when a workspace first uses it (`convert`: now). Layers are
    /// cached: pulling again downloads only what changed, and an image
    /// already pulled with the same digest is returned unchanged. Sends
    /// progress (layers, bytes) when asked.
    #[tool(
        output_schema = crate::output::schema::<Pulled>(),
        annotations(
        title = "Pull an image",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    )
    )]
    async fn image_pull(
        &self,
        Parameters(p): Parameters<PullImageParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<Pulled> {
        let req = PullRequest {
            reference: p.reference,
            name: p.name,
            insecure: p.insecure,
            convert: p.convert,
        };
        let images = self.ws.image_registry().clone();
        let pull = with_pull_progress(&ctx, "reading the manifest".into(), |events| async move {
            workspace::images::pull::pull(&images, &req, events).await
        });
        // A cancelled pull is dropped: it leaves no image and no partial
        // download.
        let pulled = tokio::select! {
            pulled = pull => pulled.map_err(workspace::Error::from)?,
            () = ctx.ct.cancelled() => {
                return Err(ToolError::Cancelled("the pull was cancelled; nothing was registered".into()))
            }
        };
        Ok(Out(pulled))
    }

    /// Find images by name or description: those here (and the built-in
    /// ones not built yet) and the repositories of registries that list
    /// theirs. A found reference can be given as `image` directly.
    #[tool(
        output_schema = crate::output::schema::<workspace::images::search::SearchResults>(),
        annotations(
        title = "Search images",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    )
    )]
    async fn image_search(
        &self,
        Parameters(p): Parameters<crate::schema::images::SearchImagesParams>,
    ) -> ToolResult<workspace::images::search::SearchResults> {
        Ok(Out(self
            .ws
            .images()
            .search(&p.query, &p.registries)
            .await?))
    }

    /// Delete an image no workspace uses (CONFLICT otherwise, naming
    /// them). preview: true only checks.
    #[tool(
        output_schema = crate::output::schema::<ImageDeleteResult>(),
        annotations(
        title = "Delete an image",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn image_delete(
        &self,
        Parameters(p): Parameters<DeleteImageParams>,
    ) -> ToolResult<ImageDeleteResult> {
        let preview = p.preview;
        let image = self
            .on_workspace(&p.name, move |ws, name| ws.images().delete(name, preview))
            .await?;
        Ok(Out(ImageDeleteResult {
            preview,
            action: would_or_did(preview, "delete"),
            image,
        }))
    }
}

/// A progress message for a pull event.
fn describe(event: &PullEvent) -> String {
    match event {
        PullEvent::Resolved { layers, bytes } => format!("{layers} layer(s), {bytes} bytes"),
        PullEvent::Cached { index } => format!("layer {index}: cached"),
        PullEvent::Downloading { index, done, size } => {
            format!("layer {index}: {done} of {size} bytes")
        }
        PullEvent::Convert(ConversionStep::Layer { index, count }) => {
            format!("applying layer {index} of {count}")
        }
        PullEvent::Convert(ConversionStep::Filesystem) => "writing the root filesystem".into(),
    }
}
