//! `image build` as `ws.images()` runs it: preview-then-confirm of the
//! plan `images::build` makes, then the build itself (`steps`: on a booted
//! image, or from Debian packages).

use crate::error::Result;
use crate::host::confirm::Confirmer;
use crate::images::build::steps;
use crate::images::build::{build_plan, check, debian, BuildBase, ImageBuild, ImageBuildRequest};
use crate::workspaces::services::Images;
use base::host::plan::Preview;
use base::host::plan::ProgressFn;
use base::host::settings::now_ms;

impl Images<'_> {
    /// Previews (without `confirm`) or applies (with the preview's token)
    /// an image build. `progress` hears each step.
    pub async fn build(
        self,
        req: &ImageBuildRequest,
        confirm: Option<&str>,
        progress: ProgressFn,
    ) -> Result<ImageBuild> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.all.state_dir().root(), token)?;
        }
        let base = check(req)?;
        let images = self.all.image_registry();
        images.check_free(&req.name)?;
        // The kernel and our init come from `minimal`: needed either way.
        let minimal = images.get(base::images::registry::BUILTIN_IMAGES[0])?;
        let (base_info, missing) = match &base {
            BuildBase::Image(name) => (Some(images.get(name)?), Vec::new()),
            BuildBase::Debian(_) => (
                None,
                base::host::settings::missing_debs(
                    debian::Mode::for_this_process().host_packages(),
                ),
            ),
        };
        let base_bytes = base_info.as_ref().map_or(0, |i| i.rootfs_bytes);
        let plan = build_plan(
            req,
            &base,
            base_bytes,
            &missing,
            &images.root().join(&req.name),
        );
        let confirmer = Confirmer::open(self.all.state_dir().root())?;
        let Some(token) = confirm else {
            return Ok(ImageBuild {
                preview: confirmer.preview(plan, now_ms()),
                applied: false,
                image: None,
            });
        };
        confirmer.check(&plan, token, now_ms())?;
        plan.check_privilege(token)?;
        confirmer.spend(token, now_ms())?;
        let image = steps::apply(self.all, req, &plan, &minimal, base_info, progress).await?;
        Ok(ImageBuild {
            preview: Preview {
                plan,
                token: None,
                expires_at_ms: None,
            },
            applied: true,
            image: Some(image),
        })
    }
}
