//! `image_search`'s input, and how its result reads.

use schemars::JsonSchema;
use serde::Deserialize;
use workspace::images::search::SearchResults;

use crate::output::Render;

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
