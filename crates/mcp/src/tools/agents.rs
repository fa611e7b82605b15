//! Agent tools: agent_register, agent_list, agent_workspace. An MCP
//! session registers one agent; it gets a workspace of its own that goes
//! with the session.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::agents::AgentStore;
use workspace::store::spec::{Owner, WorkspaceSpec};

use std::time::Duration;

use super::{has_session, vcpus};
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::agents::*;
use crate::schema::lifecycle::DEFAULT_START_TIMEOUT_SECS;
use crate::schema::NoParams;
use crate::session::NotNow;
use crate::{MicroagentServer, ToolError};

/// The label an agent's workspace carries: the agent's name.
pub const AGENT_LABEL: &str = "microagent.agent";

impl MicroagentServer {
    /// Names this session's agent (`serve mcp --agent NAME`): recorded,
    /// with no workspace of its own; the record goes with the session.
    pub fn with_agent(self, name: &str) -> Result<Self, workspace::Error> {
        let info = self.ws.agents().register(name, Vec::new(), None)?;
        if self.session.set_agent(info.clone()).is_err() {
            let _ = self.ws.agents().remove(&info.agent_id);
        }
        Ok(self)
    }
}

#[tool_router(router = agents_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Register this session's agent: records {agent_id, name,
    /// capabilities} and makes its own workspace with the given cpus and
    /// memory (default: its image's), here or on `server`, started before
    /// the answer (`start: false`: made stopped). The workspace and the
    /// record go when the session ends; a start that fails leaves neither.
    /// One registration per session (CONFLICT after).
    #[tool(
        output_schema = crate::output::schema::<AgentWorkspace>(),
        annotations(
        title = "Register this session's agent",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn agent_register(
        &self,
        Parameters(p): Parameters<RegisterParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<AgentWorkspace> {
        let _registration = match self.session.begin_registration() {
            Ok(r) => r,
            Err(NotNow::Registered(agent)) => {
                return Err(ToolError::Conflict(format!(
                    "this session registered agent {} ({}) already: one agent per session",
                    agent.name, agent.agent_id
                )))
            }
            Err(NotNow::Registering) => {
                return Err(ToolError::Conflict(
                    "this session is registering an agent already: one agent per session".into(),
                ))
            }
        };
        if !has_session(&ctx) {
            return Err(ToolError::InvalidInput(
                "agent_register needs a session: this client speaks a stateless protocol version"
                    .into(),
            ));
        }
        AgentStore::check(&p.name, &p.capabilities).map_err(workspace::Error::from)?;
        let remote = p
            .server
            .clone()
            .filter(|s| s != workspace::servers::LOCAL_SERVER);
        let (image, sized) = self
            .image_and_sizes(p.image.as_deref(), None, remote.is_some(), &ctx)
            .await?;
        let suffix = workspace::host::settings::unique_id();
        let short: String = p.name.chars().take(40).collect();
        let name = format!(
            "{}-{}",
            short.trim_end_matches('-'),
            &suffix[suffix.len().saturating_sub(6)..]
        );
        let spec = WorkspaceSpec {
            image,
            vcpus: vcpus(p.cpus, sized.vcpus_or(None))?,
            mem_mib: sized.mem_mib_or(p.memory),
            labels: [(AGENT_LABEL.to_owned(), p.name.clone())].into(),
            // A server's VMM cannot watch this process: the session's end
            // deletes it there.
            owner: remote.is_none().then(Owner::this_process).flatten(),
            delete_with_owner: remote.is_none(),
            ..WorkspaceSpec::default()
        };
        // Made and started as the agent's: the session becomes the agent
        // only once its workspace is ready and its record written.
        let as_agent = std::sync::Arc::new(workspace::agents::access::Caller::new());
        as_agent.set_agent(&p.name);
        let view = self.ws.for_caller(as_agent);
        let meta = match &remote {
            Some(server) => {
                let given = workspace::servers::GivenSizes {
                    vcpus: p.cpus.is_some(),
                    mem: p.memory.is_some(),
                };
                view.server_pool()
                    .create_on_server(server, &name, &spec, given)
                    .await?
            }
            None => {
                let view = view.clone();
                self.on_workspace(&name, move |_, name| view.create(name, spec))
                    .await?
            }
        };
        self.session.adopt_for(&meta.name, Some(&p.name));
        let registered = async {
            let mut state = Some(meta.state);
            if p.start {
                let timeout = Duration::from_secs(DEFAULT_START_TIMEOUT_SECS);
                let mut progress = Progress::new(&ctx);
                let started = self
                    .start_in(&view, &meta.name, false, timeout, &ctx, &mut progress)
                    .await?;
                state = Some(started.state);
            }
            let (agent_name, workspace) = (p.name.clone(), meta.name.clone());
            let info = self
                .blocking(move |ws| {
                    Ok(ws
                        .agents()
                        .register(&agent_name, p.capabilities, Some(workspace))
                        .map_err(workspace::Error::from)?)
                })
                .await?;
            if let Err(first) = self.session.set_agent(info.clone()) {
                let _ = self.ws.agents().remove(&info.agent_id);
                return Err(ToolError::Conflict(format!(
                    "this session registered agent {} ({}) already: one agent per session",
                    first.name, first.agent_id
                )));
            }
            Ok((info, state))
        }
        .await;
        let (info, state) = match registered {
            Ok(done) => done,
            Err(e) => {
                // Nothing stays of a registration that failed: its
                // workspace goes through the view that made it.
                let (view, made) = (view.clone(), meta.name.clone());
                let gone = tokio::task::spawn_blocking(move || {
                    view.workspace(&made)?
                        .delete(workspace::DeleteOptions::default().force(true))
                })
                .await;
                if !matches!(gone, Ok(Ok(_))) {
                    tracing::warn!(
                        "the workspace {} of a failed agent_register stays: {gone:?}",
                        meta.name
                    );
                }
                return Err(e);
            }
        };
        Ok(Out(AgentWorkspace {
            agent_id: info.agent_id,
            workspace: info.workspace,
            state,
            server: remote,
        }))
    }

    /// The agents of live MCP sessions on this state directory, oldest
    /// first: {agent_id, name, capabilities, registered_at, workspace}.
    /// Agents whose session has gone are pruned.
    #[tool(
        output_schema = crate::output::schema::<AgentList>(),
        annotations(
        title = "List agents",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn agent_list(&self, _p: Parameters<NoParams>) -> ToolResult<AgentList> {
        let agents = self
            .blocking(|ws| Ok(ws.agents().list().map_err(workspace::Error::from)?))
            .await?;
        Ok(Out(AgentList { agents }))
    }

    /// Let another agent use a workspace this session's agent owns (and
    /// the snapshots of it taken from then on), or with share: false no
    /// longer. FORBIDDEN for a workspace this agent does not own.
    #[tool(
        output_schema = crate::output::schema::<workspace::Meta>(),
        annotations(
        title = "Share a workspace with another agent",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_share(
        &self,
        Parameters(p): Parameters<ShareParams>,
    ) -> ToolResult<workspace::Meta> {
        let share = p.share.unwrap_or(true);
        let meta = self
            .on_workspace(&p.name, move |ws, name| {
                ws.workspace(name)?.share_with(&p.agent, share)
            })
            .await?;
        Ok(Out(meta))
    }

    /// This session's agent and its workspace, with the workspace's state
    /// and server; NOT_FOUND before agent_register.
    #[tool(
        output_schema = crate::output::schema::<AgentWorkspace>(),
        annotations(
        title = "This session's agent workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn agent_workspace(&self, _p: Parameters<NoParams>) -> ToolResult<AgentWorkspace> {
        let agent = self.session.agent().ok_or_else(|| {
            ToolError::NotFound("this session has no agent: call agent_register".into())
        })?;
        let (mut state, mut server) = (None, None);
        if let Some(name) = agent.workspace.clone() {
            let placed = name.clone();
            server = self
                .blocking(move |ws| {
                    Ok(ws
                        .servers()
                        .placement(&placed)
                        .map_err(workspace::Error::from)?)
                })
                .await?
                .map(|p| p.server);
            state = self.meta(&name).await.ok().map(|m| m.state);
        }
        Ok(Out(AgentWorkspace {
            agent_id: agent.agent_id,
            workspace: agent.workspace,
            state,
            server,
        }))
    }
}
