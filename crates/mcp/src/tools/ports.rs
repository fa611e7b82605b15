//! Published-port tools: port_publish, port_list, port_unpublish; and
//! preview URLs of guest ports: port_preview, port_preview_list,
//! port_preview_revoke.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::store::ports::{PortMapping, DEFAULT_HOST_IP};

use crate::output::{Out, ToolResult};
use crate::schema::ports::*;
use crate::MicroagentServer;

fn result(workspace: String, meta: workspace::Meta) -> PortsResult {
    PortsResult {
        workspace,
        ports: meta.spec.ports,
        preview: None,
    }
}

#[tool_router(router = ports_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Publish a port: TCP connections to the host address (127.0.0.1 by
    /// default) reach 127.0.0.1:guest_port inside the workspace, through
    /// its VMM process and agent, with or without a network. Listens at
    /// once if the workspace runs, and at every start.
    #[tool(
        output_schema = crate::output::schema::<PortsResult>(),
        annotations(
        title = "Publish a port",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn port_publish(
        &self,
        Parameters(p): Parameters<PublishParams>,
    ) -> ToolResult<PortsResult> {
        let mapping = PortMapping {
            host_ip: p.host_ip.unwrap_or(DEFAULT_HOST_IP),
            host_port: p.host_port,
            guest_port: p.guest_port,
        };
        self.grants.check_port_address(mapping.host_ip)?;
        let meta = self
            .on_workspace(&p.workspace, move |ws, name| {
                ws.workspace(name)?.ports().publish(mapping)
            })
            .await?;
        Ok(Out(result(p.workspace, meta)))
    }

    /// List a workspace's published ports.
    #[tool(
        output_schema = crate::output::schema::<PortsResult>(),
        annotations(
        title = "List published ports",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn port_list(
        &self,
        Parameters(p): Parameters<ListPortsParams>,
    ) -> ToolResult<PortsResult> {
        let meta = self
            .on_workspace(&p.workspace, |ws, name| ws.workspace(name)?.get())
            .await?;
        Ok(Out(result(p.workspace, meta)))
    }

    /// Stop publishing a host port; connections already open run on.
    /// preview: true says what would stop and changes nothing.
    #[tool(
        output_schema = crate::output::schema::<PortsResult>(),
        annotations(
        title = "Unpublish a port",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn port_unpublish(
        &self,
        Parameters(p): Parameters<UnpublishParams>,
    ) -> ToolResult<PortsResult> {
        let ip = p.host_ip.unwrap_or(DEFAULT_HOST_IP);
        let port = p.host_port;
        if p.preview {
            let name = p.workspace.clone();
            let meta = self
                .blocking(move |ws| Ok(ws.workspace(&name)?.get()?))
                .await?;
            let addr = std::net::SocketAddr::new(ip, port);
            let Some(mapping) = meta.spec.ports.iter().find(|m| m.host_addr() == addr) else {
                return Err(workspace::Error::PortNotPublished {
                    workspace: meta.name,
                    addr,
                }
                .into());
            };
            let would = format!(
                "would stop publishing {addr} (to {}'s port {}); connections already open run on",
                meta.name, mapping.guest_port
            );
            let mut out = result(p.workspace, meta);
            out.ports.retain(|m| m.host_addr() != addr);
            out.preview = Some(would);
            return Ok(Out(out));
        }
        let meta = self
            .on_workspace(&p.workspace, move |ws, name| {
                ws.workspace(name)?.ports().unpublish(ip, port)
            })
            .await?;
        Ok(Out(result(p.workspace, meta)))
    }

    /// Make a preview URL of a guest port: an unguessable URL on this
    /// server's HTTP port (`/preview/<token>/`, on a host name of its own:
    /// `pv<id>.localhost`) that reaches the web app on 127.0.0.1:port in
    /// the workspace, HTTP and WebSocket, until it expires (24 h by
    /// default) or is revoked. Whoever has the URL reaches that port; no
    /// MCP token is needed or sent on. Over stdio
    /// (or `--http --dev`, which serves none) `url` is null and `path` is
    /// served by `microagent serve preview` or `serve mcp --http` on the
    /// same state directory.
    #[tool(
        output_schema = crate::output::schema::<PreviewResult>(),
        annotations(
        title = "Make a preview URL",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn port_preview(
        &self,
        Parameters(p): Parameters<PreviewParams>,
    ) -> ToolResult<PreviewResult> {
        // Served off loopback, a preview reaches the guest from other
        // machines: as a published port there would, it needs the grant.
        if let Some(served_on) = self.preview_base.as_ref().map(|b| b.ip) {
            self.grants.check_port_address(served_on)?;
        }
        let (port, ttl) = (p.port, p.expires_secs.map(std::time::Duration::from_secs));
        let made = self
            .on_workspace(&p.workspace, move |ws, name| {
                ws.workspace(name)?.previews().create(port, ttl)
            })
            .await?;
        let (url, sandboxed_url) = self.preview_base.as_ref().map(|b| b.urls(&made)).unzip();
        Ok(Out(PreviewResult {
            workspace: p.workspace,
            port,
            url,
            sandboxed_url,
            path: made.path,
            expires_at_ms: made.record.expires_at_ms,
        }))
    }

    /// List a workspace's live preview URLs: port, expiry and the agent
    /// that made each (their tokens are not kept, so not shown).
    #[tool(
        output_schema = crate::output::schema::<PreviewList>(),
        annotations(
        title = "List preview URLs",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn port_preview_list(
        &self,
        Parameters(p): Parameters<ListPreviewsParams>,
    ) -> ToolResult<PreviewList> {
        let listed = self
            .on_workspace(&p.workspace, |ws, name| {
                ws.workspace(name)?.previews().list()
            })
            .await?;
        Ok(Out(PreviewList {
            workspace: p.workspace,
            previews: listed
                .into_iter()
                .map(|r| PreviewListed {
                    port: r.port,
                    created_at_ms: r.created_at_ms,
                    expires_at_ms: r.expires_at_ms,
                    agent: r.agent,
                })
                .collect(),
        }))
    }

    /// Revoke a workspace's preview URLs of one guest port (every one of
    /// them when port is left out): they answer 404 from now on.
    #[tool(
        output_schema = crate::output::schema::<RevokedPreviews>(),
        annotations(
        title = "Revoke preview URLs",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn port_preview_revoke(
        &self,
        Parameters(p): Parameters<RevokePreviewParams>,
    ) -> ToolResult<RevokedPreviews> {
        let port = p.port;
        let revoked = self
            .on_workspace(&p.workspace, move |ws, name| {
                ws.workspace(name)?.previews().revoke(port)
            })
            .await?;
        Ok(Out(RevokedPreviews {
            workspace: p.workspace,
            revoked,
        }))
    }
}
