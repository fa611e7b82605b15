//! Every tool's input (`Parameters<T>`) and output types, with the JSON
//! schemas clients see, and the short text rendering of each output. Inputs
//! reject unknown fields, so a misspelt argument is refused (INVALID_INPUT)
//! rather than silently ignored.
//!
//! Outputs that are the library's own records (`workspace::Meta`,
//! `WorkspaceInfo`, `Event`, `doctor::Report`, `contract::Contract`,
//! `image::ImageInfo`) are returned as they are, with the JSON schemas their
//! `schemars` feature derives, so the MCP server and the CLI's `--json`
//! print the same shapes; the types here wrap them only where a tool adds
//! something (a preview's `action`, an image's users, the MCP limits). This
//! module holds what several tool families share: the rendering of the
//! workspace record, and the input of tools without arguments.

pub mod agents;
pub mod browser;
pub mod code;
pub mod exec;
pub mod file_ops;
pub mod files;
pub mod host;
pub mod images;
pub mod info;
pub mod lifecycle;
pub mod networks;
pub mod outputs;
pub mod ports;
pub mod processes;
pub mod repos;
pub mod snapshots;
pub mod volumes;
pub mod watch;

use schemars::JsonSchema;
use serde::Deserialize;
use workspace::Meta;

use crate::output::Render;

impl Render for Meta {
    fn render(&self) -> String {
        let spec = &self.spec;
        let mut line = format!(
            "{}: {} ({} image, {} vCPU, {} MiB memory, {} MiB disk{})",
            self.name,
            self.state,
            spec.image,
            spec.vcpus,
            spec.mem_mib,
            spec.disk_mib,
            spec.ttl_secs
                .map(|t| format!(", ttl {t} s"))
                .unwrap_or_default()
        );
        if let Some(cause) = self.runtime.as_ref().and_then(|r| r.paused) {
            line.push_str(&format!("; paused ({})", cause.name()));
        }
        line.push_str(&format!("; network {}", spec.network));
        if !spec.ports.is_empty() {
            let ports: Vec<String> = spec.ports.iter().map(ToString::to_string).collect();
            line.push_str(&format!("; ports {}", ports.join(" ")));
        }
        if let Some(exit) = &self.last_exit {
            line.push_str(&format!("; last run: {}", exit.reason));
        }
        line
    }
}

/// Inputs of tools that take no arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}
