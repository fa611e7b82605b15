//! Network tools: network_create, network_list, network_inspect,
//! network_delete, host_networking_setup.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::network::{Backend, Egress, NetworkRequest};

use super::would_or_did;
use crate::error::ToolError;
use crate::output::{Out, ToolResult};
use crate::schema::networks::*;
use crate::MicroagentServer;

#[tool_router(router = networks_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Create a network for workspace_create's `network`: "user" backend
    /// (rootless NAT, works at once) or "tap" (egress "all", "none" or
    /// "allowlist" of domains and CIDRs, enforced by nftables; needs
    /// host_networking_setup before its workspaces start).
    #[tool(
        output_schema = crate::output::schema::<NetworkResult>(),
        annotations(
        title = "Create a network",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn network_create(
        &self,
        Parameters(p): Parameters<CreateNetworkParams>,
    ) -> ToolResult<NetworkResult> {
        let (backend, egress) = (
            p.backend.unwrap_or(Backend::User),
            p.egress.unwrap_or(Egress::All),
        );
        self.grants.check_network(backend, egress, &p.allow)?;
        let req = NetworkRequest {
            backend,
            subnet: p.subnet,
            egress,
            allow: p.allow,
            allow_peers: p.allow_peers,
        };
        let network = self
            .on_workspace(&p.name, move |ws, name| ws.networks().create(name, &req))
            .await?;
        Ok(Out(NetworkResult { network }))
    }

    /// Set a workspace's egress policy: its mode and its own rules (a
    /// domain, *.domain, an address or CIDR with or without :PORT,
    /// host:PORT). In force at once for new connections when it runs, and
    /// at every start. Without egress or allow it changes nothing and
    /// shows the policy and what was refused (call it after a connection
    /// failed to learn why).
    #[tool(
        output_schema = crate::output::schema::<EgressResult>(),
        annotations(
        title = "Set a workspace's egress policy",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_set_egress(
        &self,
        Parameters(p): Parameters<SetEgressParams>,
    ) -> ToolResult<EgressResult> {
        self.grants
            .check_egress_rules(p.allow.as_deref().unwrap_or_default())?;
        let (egress, allow) = (p.egress, p.allow);
        let info = self
            .on_workspace(&p.workspace, move |ws, name| {
                let handle = ws.workspace(name)?;
                if egress.is_some() || allow.is_some() {
                    let spec = handle.get()?.spec;
                    handle
                        .egress()
                        .set(egress.or(spec.egress), allow.unwrap_or(spec.allow))?;
                }
                handle.inspect()
            })
            .await?;
        let network = info.network;
        Ok(Out(EgressResult {
            workspace: p.workspace,
            egress: network.as_ref().map(|n| n.egress),
            allow: network.map(|n| n.allow).unwrap_or_default(),
            refused: info.refused,
        }))
    }

    /// List the networks (built-in "user" and "none" first) with their
    /// backend, subnet, egress policy and workspaces.
    #[tool(
        output_schema = crate::output::schema::<NetworkListResult>(),
        annotations(
        title = "List networks",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn network_list(
        &self,
        Parameters(_): Parameters<ListNetworksParams>,
    ) -> ToolResult<NetworkListResult> {
        let networks = self.blocking(|ws| Ok(ws.networks().list()?)).await?;
        Ok(Out(NetworkListResult { networks }))
    }

    /// One network: backend, subnet, gateway, bridge, egress policy,
    /// allowlist and the workspaces on it.
    #[tool(
        output_schema = crate::output::schema::<NetworkResult>(),
        annotations(
        title = "Inspect a network",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn network_inspect(
        &self,
        Parameters(p): Parameters<NetworkNameParams>,
    ) -> ToolResult<NetworkResult> {
        let network = self
            .on_workspace(&p.name, |ws, name| ws.networks().inspect(name))
            .await?;
        Ok(Out(NetworkResult { network }))
    }

    /// Delete a network no workspace is on (CONFLICT otherwise, naming
    /// them). preview: true only checks.
    #[tool(
        output_schema = crate::output::schema::<NetworkDeleteResult>(),
        annotations(
        title = "Delete a network",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn network_delete(
        &self,
        Parameters(p): Parameters<DeleteNetworkParams>,
    ) -> ToolResult<NetworkDeleteResult> {
        let preview = p.preview;
        let network = self
            .on_workspace(&p.name, move |ws, name| ws.networks().delete(name, preview))
            .await?;
        Ok(Out(NetworkDeleteResult {
            preview,
            action: would_or_did(preview, "delete"),
            network,
        }))
    }

    /// Set up (or with teardown: true, remove) the host side of the tap
    /// networks: bridges, IPv4 forwarding, our nftables table, a dnsmasq
    /// per network. Without confirm (or confirm_token) nothing changes: the exact
    /// commands come back with a token valid for 5 minutes; call again
    /// with it to apply that plan once (refused if the plan changed since;
    /// FORBIDDEN unless the server was started with --allow-host-changes).
    #[tool(
        output_schema = crate::output::schema::<HostSetupResult>(),
        annotations(
        title = "Set up host networking",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn host_networking_setup(
        &self,
        Parameters(p): Parameters<HostSetupParams>,
    ) -> ToolResult<HostSetupResult> {
        let cli = if p.teardown {
            "network teardown"
        } else {
            "network setup"
        };
        let token = match (p.confirm, p.confirm_token) {
            (Some(a), Some(b)) if a != b => {
                return Err(ToolError::InvalidInput(
                    "confirm and confirm_token are the same token under two names; give one".into(),
                ))
            }
            (a, b) => a.or(b),
        };
        self.grants
            .check_host_change(token.is_some(), "host_networking_setup", cli)?;
        let change = self
            .blocking(move |ws| {
                let token = token.as_deref();
                Ok(if p.teardown {
                    ws.networks().teardown(token)?
                } else {
                    ws.networks().setup(token)?
                })
            })
            .await?;
        Ok(Out(HostSetupResult { change }))
    }
}
