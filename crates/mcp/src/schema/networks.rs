//! Inputs and outputs of the network tools: network_create, network_list,
//! network_inspect, network_delete, host_networking_setup.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::network::{AllowEntry, Backend, Egress, Subnet};
use workspace::{network::setup::HostChange, network::NetworkInfo};

use crate::output::Render;

/// `network_create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateNetworkParams {
    /// Network name (lowercase letters, digits, `-`).
    pub name: String,
    /// "user" (rootless NAT, no host setup; the default) or "tap" (a
    /// bridge with nftables egress rules; needs host_networking_setup).
    pub backend: Option<Backend>,
    /// Subnet, e.g. "10.89.5.0/24"; default 10.0.2.0/24 for user, a free
    /// 10.89.N.0/24 for tap.
    pub subnet: Option<Subnet>,
    /// "all" (default; on "user", all but the host's loopback, link-local
    /// and private addresses), "none" or "allowlist".
    pub egress: Option<Egress>,
    /// Rules: domains (each also the names under it; "*.d": only those
    /// under it), IPv4 addresses or CIDRs, and on "user" also with ":PORT",
    /// or "host:PORT"; a tap network takes them with "allowlist".
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// "tap" only: let its guests reach each other (default: each guest's
    /// bridge port is isolated).
    #[serde(default)]
    pub allow_peers: bool,
}

/// `workspace_set_egress`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEgressParams {
    /// Workspace name.
    pub workspace: String,
    /// Its mode: "all", "none" or "allowlist"; omitted: as it was.
    pub egress: Option<Egress>,
    /// Its own rules, replacing the ones it had (omitted: as they were; at most 256; the network's stay): a domain
    /// ("pypi.org": it and the names under it; "*.pythonhosted.org": only
    /// the names under it), an IPv4 address or CIDR with or without
    /// ":PORT", or "host:PORT" (a port on the host's loopback, reached in
    /// the guest as host.microagent.internal:PORT).
    pub allow: Option<Vec<AllowEntry>>,
}

/// A workspace's egress policy in force and what it refused.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EgressResult {
    /// The workspace.
    pub workspace: String,
    /// Its mode (its own, else its network's); none without a network.
    pub egress: Option<Egress>,
    /// The rules in force: the network's and its own.
    pub allow: Vec<AllowEntry>,
    /// While it runs on the "user" network: refusals since it started and
    /// the last ones (where it went, why), so an agent learns why its
    /// connection failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<workspace::EgressDenials>,
}

/// `network_inspect`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkNameParams {
    /// Network name.
    pub name: String,
}

/// `network_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteNetworkParams {
    /// Network name; refused (CONFLICT) while a workspace is on it.
    pub name: String,
    /// Only check and report what would be removed.
    #[serde(default)]
    pub preview: bool,
}

/// `network_list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListNetworksParams {}

/// `host_networking_setup`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostSetupParams {
    /// The token of an earlier preview: apply exactly that plan. Without
    /// it nothing changes and the plan and a token come back. (As
    /// `kernel_install` and `image_build` take it.)
    #[serde(default)]
    pub confirm: Option<String>,
    /// The same as `confirm`, under the name it had first.
    pub confirm_token: Option<String>,
    /// Remove everything the setup made instead (also previewed first).
    #[serde(default)]
    pub teardown: bool,
}

/// One network (network_create, network_inspect).
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkResult {
    /// The network and the workspaces on it.
    #[serde(flatten)]
    pub network: NetworkInfo,
}

/// `network_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkListResult {
    /// Every network, built-ins first.
    pub networks: Vec<NetworkInfo>,
}

/// `network_delete`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkDeleteResult {
    /// It was only a preview.
    pub preview: bool,
    /// `would delete` or `did delete`.
    pub action: String,
    /// The network.
    pub network: NetworkInfo,
}

/// `host_networking_setup`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HostSetupResult {
    /// The plan, its token (previews) and whether it was applied.
    #[serde(flatten)]
    pub change: HostChange,
}

fn line(n: &NetworkInfo) -> String {
    let net = &n.network;
    format!(
        "{}: backend {}, subnet {}, egress {}{}, workspaces: {}",
        net.name,
        net.backend.map_or("none".into(), |b| b.to_string()),
        net.subnet.map_or("-".into(), |s| s.to_string()),
        net.egress,
        if net.allow.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                net.allow
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        if n.workspaces.is_empty() {
            "none".into()
        } else {
            n.workspaces.join(", ")
        }
    )
}

impl Render for EgressResult {
    fn render(&self) -> String {
        let rules: Vec<String> = self.allow.iter().map(ToString::to_string).collect();
        let mut out = format!(
            "{}: egress {}, allow: {}",
            self.workspace,
            self.egress
                .map_or("none (no network)".into(), |e| e.to_string()),
            if rules.is_empty() {
                "-".into()
            } else {
                rules.join(", ")
            }
        );
        if let Some(r) = &self.refused {
            out.push_str(&format!("\nrefused {} since it started", r.denied));
            for d in &r.denials {
                out.push_str(&format!("\n  {d}"));
            }
        }
        out
    }
}

impl Render for NetworkResult {
    fn render(&self) -> String {
        line(&self.network)
    }
}

impl Render for NetworkListResult {
    fn render(&self) -> String {
        self.networks
            .iter()
            .map(line)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for NetworkDeleteResult {
    fn render(&self) -> String {
        format!("{} network {}", self.action, self.network.network.name)
    }
}

impl Render for HostSetupResult {
    fn render(&self) -> String {
        let plan = &self.change.preview.plan;
        let mut out = if plan.steps.is_empty() {
            format!("{}: nothing to do", plan.action)
        } else {
            let verb = if self.change.applied {
                "applied"
            } else {
                "would run (nothing changed yet)"
            };
            let steps: Vec<String> = plan
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| format!("{}. {}: {}", i + 1, s.what, s.command_line()))
                .collect();
            format!("{} {verb}:\n{}", plan.action, steps.join("\n"))
        };
        for note in &plan.notes {
            out.push_str(&format!("\nnote: {note}"));
        }
        if let Some(token) = &self.change.preview.token {
            out.push_str(&format!(
                "\nTo apply exactly this plan within 5 minutes, call host_networking_setup again with confirm \"{token}\" (the server needs CAP_NET_ADMIN)."
            ));
        }
        out
    }
}
