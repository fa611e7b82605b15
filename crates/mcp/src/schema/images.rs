//! Inputs and outputs of the image tools that name one image
//! (image_inspect, image_import, image_delete), and image_search's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::images::search::SearchResults;
use workspace::images::ImageInfo;

use crate::output::Render;

/// `image_inspect`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageNameParams {
    /// Image name (see `image_list`).
    pub name: String,
}

/// `image_import`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportImageParams {
    /// Name for the new image (a container image's defaults to its tag:
    /// `python:3.12-slim` is `python-3-12-slim`; required for a kernel and
    /// root filesystem directory).
    #[serde(default)]
    pub name: Option<String>,
    /// Host path, relative to the server's working directory: a container
    /// image (an OCI image layout directory, a tar of one, or a `docker
    /// save` tarball), or a directory holding `vmlinux` (an ELF kernel) and
    /// `rootfs.ext4` (and optionally `manifest.json`).
    #[serde(alias = "dir")]
    pub path: String,
}

/// `image_pull`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImageParams {
    /// Image reference: `alpine`, `python:3.12-slim`, `ghcr.io/org/tool:1`,
    /// `registry.example:5000/team/app@sha256:...`.
    pub reference: String,
    /// Name to register it under (default: from the reference;
    /// `python:3.12-slim` is `python-3-12-slim`).
    #[serde(default)]
    pub name: Option<String>,
    /// Speak plain HTTP to the registry (a local or test registry only).
    #[serde(default)]
    pub insecure: bool,
    /// Make its root filesystem now (default: at its first use, so the
    /// pull is the download alone).
    #[serde(default)]
    pub convert: bool,
}

/// `image_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteImageParams {
    /// Image name; refused (CONFLICT) while a workspace uses it.
    pub name: String,
    /// Only check and report what would be removed.
    #[serde(default)]
    pub preview: bool,
}

/// One image and the workspaces that use it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageResult {
    /// The image.
    #[serde(flatten)]
    pub image: ImageInfo,
    /// Workspaces that use it.
    pub used_by: Vec<String>,
}

/// `image_delete`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ImageDeleteResult {
    /// It was only a preview.
    pub preview: bool,
    /// `would delete` or `did delete`.
    pub action: String,
    /// The image.
    pub image: ImageInfo,
}

impl Render for ImageResult {
    fn render(&self) -> String {
        format!(
            "{}: kernel {} bytes, root filesystem {} bytes, used by {}",
            self.image.name,
            self.image.kernel_bytes,
            self.image.rootfs_bytes,
            if self.used_by.is_empty() {
                "no workspace".into()
            } else {
                self.used_by.join(", ")
            }
        )
    }
}

impl Render for ImageDeleteResult {
    fn render(&self) -> String {
        format!("{} image {}", self.action, self.image.name)
    }
}

impl Render for workspace::images::pull::Pulled {
    fn render(&self) -> String {
        if self.unchanged {
            return format!("{} is up to date (same manifest digest)", self.image.name);
        }
        let rootfs = if self.image.awaiting_conversion {
            "root filesystem made at its first use".to_owned()
        } else {
            format!("root filesystem {} bytes", self.image.rootfs_bytes)
        };
        format!(
            "pulled as {}: {} bytes downloaded, {} layer(s) from the cache, {rootfs}",
            self.image.name, self.downloaded_bytes, self.cached_layers
        )
    }
}

/// `image_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchImagesParams {
    /// Text to look for in names and descriptions (any case; empty lists
    /// everything).
    #[serde(default)]
    pub query: String,
    /// Registries to search too (`host` or `host:port`; those the server's
    /// config.json lists under `search_registries` always are). A registry
    /// that does not list its repositories (Docker Hub) is reported in
    /// `unreachable`.
    #[serde(default)]
    pub registries: Vec<String>,
}

impl Render for SearchResults {
    fn render(&self) -> String {
        let mut lines: Vec<String> = self
            .local
            .iter()
            .map(|i| {
                let built = if i.registered {
                    ""
                } else {
                    " (built-in, not built yet)"
                };
                let about = i
                    .description
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                format!("{}{built}{about}", i.name)
            })
            .collect();
        lines.extend(
            self.remote
                .iter()
                .map(|r| format!("{} (pull it, or use it as image)", r.reference)),
        );
        lines.extend(
            self.unreachable
                .iter()
                .map(|p| format!("could not search {}: {}", p.registry, p.message)),
        );
        if lines.is_empty() {
            return "no image matches".into();
        }
        lines.join("\n")
    }
}
