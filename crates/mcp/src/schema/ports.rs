//! Inputs and outputs of the published-port tools: port_publish, port_list,
//! port_unpublish, and the preview URLs of guest ports: port_preview,
//! port_preview_list, port_preview_revoke.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::store::ports::PortMapping;

use crate::output::Render;
use workspace::store::previews::describe;

/// `port_publish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    /// Workspace name (running or stopped: a running one listens at once,
    /// and every start listens again).
    pub workspace: String,
    /// Host TCP port, 1 to 65535; refused (CONFLICT) when in use.
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: u16,
    /// TCP port on the guest's loopback (127.0.0.1) each connection reaches.
    #[schemars(range(min = 1, max = 65535))]
    pub guest_port: u16,
    /// Host address to listen on; default "127.0.0.1" (this machine only).
    /// A non-loopback address is FORBIDDEN unless the server was started
    /// with --allow-public-ports.
    pub host_ip: Option<std::net::IpAddr>,
}

/// `port_unpublish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnpublishParams {
    /// Workspace name.
    pub workspace: String,
    /// The published host port.
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: u16,
    /// Its host address; default "127.0.0.1".
    pub host_ip: Option<std::net::IpAddr>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `port_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPortsParams {
    /// Workspace name.
    pub workspace: String,
}

/// A workspace's published ports (the result of every port tool).
#[derive(Debug, Serialize, JsonSchema)]
pub struct PortsResult {
    /// The workspace.
    pub workspace: String,
    /// Its published ports (for a preview: as they would be).
    pub ports: Vec<PortMapping>,
    /// What a preview would do; nothing was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

impl Render for PortsResult {
    fn render(&self) -> String {
        if let Some(would) = &self.preview {
            return would.clone();
        }
        if self.ports.is_empty() {
            return format!("{} publishes no ports", self.workspace);
        }
        self.ports
            .iter()
            .map(|p| {
                format!(
                    "{} -> {} 127.0.0.1:{}",
                    p.host_addr(),
                    self.workspace,
                    p.guest_port
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `port_preview`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewParams {
    /// Workspace name (it need not run: the first request wakes it).
    pub workspace: String,
    /// TCP port on the guest's loopback the web app listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// How long the URL works, seconds; default 86400 (24 h), at most
    /// 2592000 (30 days).
    #[schemars(range(min = 1, max = 2_592_000))]
    pub expires_secs: Option<u64>,
}

/// `port_preview_revoke`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokePreviewParams {
    /// Workspace name.
    pub workspace: String,
    /// The guest port whose preview URLs stop working; every one of the
    /// workspace's when left out.
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
}

/// A preview URL just made.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PreviewResult {
    /// The workspace.
    pub workspace: String,
    /// The guest port it reaches.
    pub port: u16,
    /// The whole URL, when this server serves previews (over HTTP): on
    /// the preview's own origin (`http://pv<id>.localhost:PORT/...`,
    /// which browsers and curl resolve to loopback themselves), so its
    /// pages share no storage or cookies with other sites' and previews';
    /// otherwise null, and `path` is served by `microagent serve mcp
    /// --http ADDR` on the same state directory.
    pub url: Option<String>,
    /// The same preview on the server's own address, for clients that do
    /// not resolve `*.localhost` (most HTTP libraries): a browser runs its
    /// pages sandboxed there (no storage, cookies or same-origin calls).
    pub sandboxed_url: Option<String>,
    /// `/preview/<token>/`: the path it is served at.
    pub path: String,
    /// When it stops working, Unix ms.
    pub expires_at_ms: u64,
}

impl Render for PreviewResult {
    fn render(&self) -> String {
        let at = self.url.as_deref().unwrap_or(&self.path);
        format!(
            "{at} reaches {}'s port {} until {} (Unix ms)",
            self.workspace, self.port, self.expires_at_ms
        )
    }
}

/// What `port_preview_revoke` did.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RevokedPreviews {
    /// The workspace.
    pub workspace: String,
    /// How many preview URLs stopped working.
    pub revoked: usize,
}

impl Render for RevokedPreviews {
    fn render(&self) -> String {
        format!(
            "revoked {} preview URL(s) of {}",
            self.revoked, self.workspace
        )
    }
}

/// `port_preview_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPreviewsParams {
    /// Workspace name.
    pub workspace: String,
}

/// One live preview URL of a workspace (its token is not kept).
#[derive(Debug, Serialize, JsonSchema)]
pub struct PreviewListed {
    /// The guest port it reaches.
    pub port: u16,
    /// When it was made, Unix ms.
    pub created_at_ms: u64,
    /// When it stops working, Unix ms.
    pub expires_at_ms: u64,
    /// The agent that made it, if an agent's session did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// A workspace's live preview URLs.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PreviewList {
    /// The workspace.
    pub workspace: String,
    /// Its live previews, by port.
    pub previews: Vec<PreviewListed>,
}

impl Render for PreviewList {
    fn render(&self) -> String {
        if self.previews.is_empty() {
            return format!("{} has no preview URLs", self.workspace);
        }
        self.previews
            .iter()
            .map(|p| describe(p.port, p.expires_at_ms, p.agent.as_deref()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
