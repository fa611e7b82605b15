//! Image tools that name one image: image_inspect, image_import,
//! image_delete (image_list is with the information tools).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

use super::would_or_did;
use crate::output::{Out, ToolResult};
use crate::schema::images::*;
use crate::MicroagentServer;

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
        let dir = self.host_roots.existing(&p.dir)?;
        // The files inside may be symlinks: each must stay beneath a root too.
        for file in [
            workspace::image::KERNEL_FILE,
            workspace::image::ROOTFS_FILE,
            workspace::image::MANIFEST_FILE,
        ] {
            let path = dir.join(file);
            if path.symlink_metadata().is_ok() {
                self.host_roots.existing(&path.to_string_lossy())?;
            }
        }
        let image = self
            .on_workspace(&p.name, move |ws, name| {
                Ok(ws.images().import_dir(name, &dir)?)
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
