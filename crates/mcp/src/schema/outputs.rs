//! Files a command left behind (`outputs`), as a tool result carries
//! them: a summary in the structured content, and each file as content
//! beside the text (images as image content so clients show plots, other
//! files as embedded resources, text inline and the rest base64; a file
//! past the caps as a link to its copy on the host).

use base64::Engine;
use rmcp::model::{ContentBlock, Resource, ResourceContents};
use schemars::JsonSchema;
use serde::Serialize;
use workspace::guest::{OutputFile, Outputs};

/// How one matched file came back.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct OutputSummary {
    /// Its absolute guest path.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its media type, from its name.
    pub mime_type: String,
    /// `image` (image content), `text` or `blob` (an embedded resource),
    /// or `link` (past the caps: a resource link to `host_path`).
    pub returned: String,
    /// Where a file past the caps was copied on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
}

/// The summaries, and the content blocks, of `outputs` from `workspace`.
pub fn content(workspace: &str, outputs: &Outputs) -> (Vec<OutputSummary>, Vec<ContentBlock>) {
    outputs
        .files
        .iter()
        .map(|f| {
            let (returned, block) = block(workspace, f);
            let summary = OutputSummary {
                path: f.path.clone(),
                size: f.size,
                mime_type: f.mime.to_owned(),
                returned: returned.to_owned(),
                host_path: f.kept.as_ref().map(|p| p.display().to_string()),
            };
            (summary, block)
        })
        .unzip()
}

fn block(workspace: &str, f: &OutputFile) -> (&'static str, ContentBlock) {
    let uri = crate::uris::file_uri(workspace, &f.path);
    let b64 = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
    match &f.data {
        None => {
            let host = f
                .kept
                .as_ref()
                .map_or(uri.clone(), |p| format!("file://{}", p.display()));
            let link = Resource::new(host, f.path.clone())
                .with_mime_type(f.mime)
                .with_size(f.size)
                .with_description("past the inline cap: copied to the host");
            ("link", ContentBlock::resource_link(link))
        }
        Some(data) if f.mime.starts_with("image/") => {
            ("image", ContentBlock::image(b64(data), f.mime))
        }
        Some(data) => match std::str::from_utf8(data) {
            Ok(text) if f.mime != "application/octet-stream" || !text.contains('\0') => {
                let mime = if f.mime == "application/octet-stream" {
                    "text/plain"
                } else {
                    f.mime
                };
                let contents = ResourceContents::text(text, uri).with_mime_type(mime);
                ("text", ContentBlock::resource(contents))
            }
            _ => {
                let contents = ResourceContents::blob(b64(data), uri).with_mime_type(f.mime);
                ("blob", ContentBlock::resource(contents))
            }
        },
    }
}
