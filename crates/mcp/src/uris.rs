//! The URIs of the workspaces as MCP resources, made in one place for the
//! resources themselves and for tool results that link to them.

/// The inventory's URI.
pub const WORKSPACES_URI: &str = "microagent://workspaces";
/// What every workspace's URI starts with.
pub const WORKSPACE_PREFIX: &str = "microagent://workspace/";

/// The URI of workspace `name`'s file at the absolute guest `path`, which
/// `resources/read` reads.
pub fn file_uri(name: &str, path: &str) -> String {
    format!("{WORKSPACE_PREFIX}{name}/files{path}")
}
