//! Inputs and outputs of the agent tools: agent_register, agent_list,
//! agent_workspace.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::agents::AgentInfo;

use crate::output::Render;

/// `agent_register`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterParams {
    /// The agent's name: 1-63 of a-z, 0-9 and '-', starting with a letter.
    pub name: String,
    /// What it can do, in free words (at most 32, each 1-64 bytes).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// vCPUs of its workspace (1-8; default: the image's, else 1).
    #[serde(default)]
    #[schemars(range(min = 1, max = workspace::LIMITS.max_vcpus))]
    pub cpus: Option<u32>,
    /// Memory of its workspace, MiB (64-16384) or with a unit (`"1g"`);
    /// default: the image's, else 256.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub memory: Option<u64>,
    /// Image of its workspace (default `minimal`).
    #[serde(default)]
    pub image: Option<String>,
    /// The server (`server_list`) to make its workspace on; default this
    /// host. Deleted there when the session ends, as here.
    #[serde(default)]
    pub server: Option<String>,
    /// Start the workspace before answering (default true): the answer
    /// names a running workspace. `false`: made stopped, for
    /// `workspace_start` later.
    #[serde(default = "starts")]
    pub start: bool,
}

fn starts() -> bool {
    true
}

/// This session's agent and its workspace.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AgentWorkspace {
    /// The agent's id.
    pub agent_id: String,
    /// Its workspace (running, unless registered with `start: false`),
    /// deleted when the session ends; none for an agent named by
    /// `serve mcp --agent`.
    pub workspace: Option<String>,
    /// The workspace's state when this answer was made (`running` after a
    /// start); none without a workspace or when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<workspace::State>,
    /// The server it lives on, when not this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Render for AgentWorkspace {
    fn render(&self) -> String {
        match &self.workspace {
            Some(ws) => format!(
                "agent {}: workspace {ws}{}{} (goes when this session ends)",
                self.agent_id,
                self.state.map(|s| format!(", {s}")).unwrap_or_default(),
                self.server
                    .as_deref()
                    .map(|s| format!(", on server {s}"))
                    .unwrap_or_default()
            ),
            None => format!("agent {}: no workspace of its own", self.agent_id),
        }
    }
}

/// `agent_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AgentList {
    /// The agents of live sessions, oldest first.
    pub agents: Vec<AgentInfo>,
}

impl Render for AgentList {
    fn render(&self) -> String {
        if self.agents.is_empty() {
            return "no agents registered".into();
        }
        self.agents
            .iter()
            .map(|a| {
                let ws = a.workspace.as_deref().unwrap_or("no workspace");
                format!("{} {} ({ws})", a.agent_id, a.name)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `workspace_share`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareParams {
    /// Workspace name (this session's agent must own it).
    pub name: String,
    /// The agent (its registered name) that may use it from now on.
    pub agent: String,
    /// false takes a share back; default true.
    pub share: Option<bool>,
}
