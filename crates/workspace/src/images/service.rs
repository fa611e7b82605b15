//! The images of a collection as front ends use them, the service
//! `ws.images()`: who uses an image, deleting one (its pool drained
//! first), search here and in registries, and builds (`build::run`). The
//! registry itself is `ws.image_registry()`; pulls are `images::pull`, on
//! the registry alone.

use crate::error::Result;
use crate::workspaces::manager::ListFilter;
use crate::workspaces::services::Images;
use base::images::registry::ImageInfo;

impl Images<'_> {
    /// Workspaces that use image `name` (to an agent, the library's own
    /// makers of code kernels are not named, only counted).
    pub fn users(self, image: &str) -> Result<Vec<String>> {
        let shown = |name: String| {
            let ready = crate::workspaces::tenancy::READY_NAMESPACE;
            if self.all.caller().is_some() && base::store::name::namespace_of(&name) == ready {
                "a workspace making code kernels ahead".to_owned()
            } else {
                name
            }
        };
        Ok(self
            .all
            .list_everywhere(&ListFilter {
                image: Some(image.to_owned()),
                ..ListFilter::default()
            })?
            .into_iter()
            .map(|m| shown(m.name))
            .collect())
    }

    /// Removes image `name` unless a workspace uses it.
    pub fn remove(self, name: &str) -> Result<()> {
        self.delete(name, false).map(drop)
    }

    /// Removes image `name` unless a workspace uses it (CONFLICT naming
    /// them); with `preview` it only checks. Returns what goes.
    pub fn delete(self, name: &str, preview: bool) -> Result<ImageInfo> {
        // Found, not converted: a pulled image awaiting its first use
        // goes as it is.
        let info = self
            .all
            .image_registry()
            .find(name)?
            .ok_or_else(|| base::images::registry::ImageError::NotFound(name.to_owned()))?;
        let users = self.users(name)?;
        if preview && users.is_empty() {
            return Ok(info);
        }
        if users.is_empty() && !preview {
            self.all
                .pools()
                .drain(&info.name, "its image was deleted")?;
        }
        self.all.image_registry().remove(name, users)?;
        Ok(info)
    }

    /// Images by name or description here, and in `registries` and those
    /// `config.json` lists (see [`crate::images::search`]).
    pub async fn search(
        self,
        query: &str,
        registries: &[String],
    ) -> Result<crate::images::search::SearchResults> {
        let mut all = crate::images::search::configured_registries(self.all.state_dir().root());
        all.extend(registries.iter().cloned());
        Ok(crate::images::search::search(self.all.image_registry(), query, &all).await?)
    }
}
