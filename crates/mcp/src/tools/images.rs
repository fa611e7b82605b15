//! Image tools that name one image: image_inspect, image_import,
//! image_delete (image_list is with the information tools).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use super::would_or_did;
use crate::output::{Out, ToolResult};
use crate::schema::images::*;
use crate::MicroagentServer;

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
                Ok((ws.images().get(name)?, ws.image_users(name)?))
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
                    .images()
                    .import_path(name.as_deref(), &path, &mut |_| {})
                    .map_err(workspace::Error::from)?)
            })
            .await?;
        Ok(Out(ImageResult {
            image,
            used_by: Vec::new(),
        }))
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
            .on_workspace(&p.name, move |ws, name| ws.delete_image(name, preview))
            .await?;
        Ok(Out(ImageDeleteResult {
            preview,
            action: would_or_did(preview, "delete"),
            image,
        }))
    }
}
