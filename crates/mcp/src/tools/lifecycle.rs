//! Life-cycle tools: create, start, stop, halt, delete, list, inspect, logs,
//! events.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use workspace::store::repo_checkout::RepoCheckout;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::guest::MAX_EVENT_WAIT;
use workspace::store::spec::defaults;
use workspace::{ListFilter, Meta, WorkspaceInfo, WorkspaceSpec, Workspaces};

/// What `workspace_extend_ttl` adds when neither `by` nor `ttl_secs` is
/// given (agentkernel's default).
const DEFAULT_TTL_EXTENSION: &str = "1h";

use super::{has_session, in_range, seconds, vcpus};
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::lifecycle::*;
use crate::{MicroagentServer, ToolError};

impl MicroagentServer {
    /// The workspace record (crash detection included), off the runtime.
    pub(crate) async fn meta(&self, name: &str) -> Result<Meta, ToolError> {
        self.on_workspace(name, |ws, name| ws.workspace(name)?.get())
            .await
    }

    /// Starts `name`, reporting progress; a cancelled start halts the VM.
    pub(crate) async fn start_workspace(
        &self,
        name: &str,
        cold: bool,
        timeout: Duration,
        ctx: &RequestContext<RoleServer>,
        progress: &mut Progress,
    ) -> Result<Meta, ToolError> {
        self.start_in(&self.ws, name, cold, timeout, ctx, progress)
            .await
    }

    /// [`Self::start_workspace`] through `view` (another caller's view of
    /// the same state directory).
    pub(crate) async fn start_in(
        &self,
        view: &Workspaces,
        name: &str,
        cold: bool,
        timeout: Duration,
        ctx: &RequestContext<RoleServer>,
        progress: &mut Progress,
    ) -> Result<Meta, ToolError> {
        let console = Arc::new(Mutex::new(None::<String>));
        let seen = console.clone();
        let report = move |p: workspace::StartProgress| {
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = p.console;
        };
        let work = async {
            let start = async {
                if cold {
                    view.workspace(name)?.start_cold(timeout, report).await
                } else {
                    view.workspace(name)?.start(timeout, report).await
                }
            };
            tokio::select! {
                started = start => started.map(Some),
                () = ctx.ct.cancelled() => Ok(None),
            }
        };
        let status = |elapsed: Duration| {
            let line = console.lock().unwrap_or_else(|e| e.into_inner()).clone();
            format!(
                "booting {name}: {} s{}",
                elapsed.as_secs(),
                line.map(|l| format!(", console: {l}")).unwrap_or_default()
            )
        };
        match progress.drive(work, status).await? {
            Some(meta) => Ok(meta),
            None => {
                let (view, owned) = (view.clone(), name.to_owned());
                tokio::task::spawn_blocking(move || view.workspace(&owned)?.halt())
                    .await
                    .map_err(|e| ToolError::Internal(format!("halting {name}: {e}")))??;
                Err(ToolError::Cancelled(format!(
                    "the start of `{name}` was cancelled and its VM halted"
                )))
            }
        }
    }

    /// What stop and halt share: a workspace without a VM is left as it is
    /// (`verb` does nothing); a preview says what the tool `would` do;
    /// otherwise `change` runs and the result says it was `done`.
    async fn change_vm(
        &self,
        name: &str,
        preview: bool,
        (verb, done): (&str, &str),
        would: impl FnOnce(&Meta) -> String,
        change: impl Future<Output = Result<Meta, ToolError>>,
    ) -> ToolResult<ChangeResult> {
        let before = self.meta(name).await?;
        // A hibernated one has a machine to discard, or to hibernate as it is.
        let action = if !before.state.has_machine() {
            format!(
                "workspace `{name}` is {}; {verb} does nothing",
                before.state
            )
        } else if preview {
            would(&before)
        } else {
            return Ok(Out(ChangeResult {
                preview: false,
                action: format!("{done} workspace `{name}`"),
                workspace: change.await?,
            }));
        };
        Ok(Out(ChangeResult {
            preview,
            action,
            workspace: before,
        }))
    }
}

#[tool_router(router = lifecycle_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Create a workspace (stopped; workspace_start boots it). Its writable
    /// disk is made now; the image is read-only and shared.
    #[tool(
        output_schema = crate::output::schema::<Meta>(),
        annotations(
        title = "Create a workspace",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn workspace_create(
        &self,
        Parameters(p): Parameters<CreateParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<Meta> {
        for port in &p.ports {
            self.grants.check_port_address(port.host_ip)?;
        }
        self.grants.check_egress_rules(&p.allow)?;
        if p.session_scoped && !has_session(&ctx) {
            return Err(ToolError::InvalidInput(
                "session_scoped needs a session: this client speaks a stateless protocol version"
                    .into(),
            ));
        }
        let stays_here = !p.ports.is_empty()
            || !p.volumes.is_empty()
            || p.repo.is_some()
            || p.egress.is_some()
            || !p.allow.is_empty()
            || p.session_scoped
            || !p.services.is_empty();
        let server = match p.server.clone() {
            Some(server) => Some(server),
            None if stays_here => None,
            None => {
                let image = p.image.as_deref().unwrap_or(defaults::IMAGE);
                self.workspaces()
                    .server_pool()
                    .place_by_score(image)
                    .await?
            }
        };
        let remote = server.filter(|s| s != workspace::servers::LOCAL_SERVER);
        if remote.is_some() && !p.services.is_empty() {
            return Err(ToolError::InvalidInput(
                "a workspace with services runs on this host: leave `server` out".into(),
            ));
        }
        // Checked before any of their images is pulled.
        let mut services: Vec<_> = p.services.into_iter().map(ServiceParam::spec).collect();
        workspace::store::spec::services::validate(&services)
            .map_err(|e| ToolError::InvalidInput(e.to_string()))?;
        for service in &mut services {
            service.image = self.image_for(Some(&service.image), p.pull, &ctx).await?;
        }
        // Sizes not given are the image's (a remote server's are its own).
        let (image, sized) = self
            .image_and_sizes(p.image.as_deref(), p.pull, remote.is_some(), &ctx)
            .await?;
        let given = workspace::servers::GivenSizes {
            vcpus: p.vcpus.is_some(),
            mem: p.mem_mib.is_some(),
        };
        let spec = WorkspaceSpec {
            // The VMM stops when this server ends; the next listing deletes it.
            owner: p
                .session_scoped
                .then(workspace::store::spec::Owner::this_process)
                .flatten(),
            delete_with_owner: p.session_scoped,
            image,
            vcpus: vcpus(p.vcpus, sized.vcpus_or(None))?,
            mem_mib: sized.mem_mib_or(p.mem_mib),
            disk_mib: p.disk_mib.unwrap_or(defaults::DISK_MIB),
            env: p.env,
            labels: p.labels,
            ttl_secs: match (p.ttl_secs, p.ttl.as_deref()) {
                (Some(_), Some(_)) => {
                    return Err(ToolError::InvalidInput(
                        "give ttl_secs or ttl, not both".into(),
                    ))
                }
                (Some(secs), None) => Some(secs),
                (None, Some(text)) => Some(workspace::store::spec::parse_duration(text)?),
                (None, None) => None,
            },
            idle_pause_secs: p.idle_pause_secs,
            idle_hibernate_secs: p.idle_hibernate_secs,
            network: p
                .network
                .unwrap_or_else(|| workspace::store::name::DEFAULT_NETWORK.into()),
            ports: p.ports,
            egress: p.egress,
            allow: p.allow,
            volumes: crate::schema::volumes::mounts(&p.volumes),
            repo: match (p.repo, p.branch) {
                (None, Some(_)) => {
                    return Err(ToolError::InvalidInput(
                        "branch needs repo: name the repository to clone".into(),
                    ))
                }
                (repo, branch) => repo.map(|r| RepoCheckout::new(r, branch)),
            },
            services,
            ..WorkspaceSpec::default()
        };
        let meta = match remote {
            Some(server) => {
                super::seen_from(self.workspaces(), p.namespace.as_deref())?
                    .server_pool()
                    .create_on_server(&server, &p.name, &spec, given)
                    .await?
            }
            None => {
                let namespace = p.namespace;
                let meta = self
                    .on_workspace(&p.name, move |ws, name| {
                        super::seen_from(ws, namespace.as_deref())?.create(name, spec)
                    })
                    .await?;
                if p.session_scoped {
                    self.session.adopt(&meta.name);
                }
                meta
            }
        };
        if !p.start {
            return Ok(Out(meta));
        }
        let timeout = Duration::from_secs(DEFAULT_START_TIMEOUT_SECS);
        let mut progress = Progress::new(&ctx);
        let started = self
            .start_workspace(&meta.name, false, timeout, &ctx, &mut progress)
            .await?;
        Ok(Out(started))
    }

    /// Extend a workspace's TTL (`by`: "1h", "30m", ...; default "1h") or
    /// set it (`ttl_secs`). A running workspace's deadline moves; later
    /// starts use the new TTL. Without a TTL, `by` gives it one.
    #[tool(
        output_schema = crate::output::schema::<Meta>(),
        annotations(
        title = "Extend a workspace's TTL",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn workspace_extend_ttl(
        &self,
        Parameters(p): Parameters<ExtendTtlParams>,
    ) -> ToolResult<Meta> {
        let meta = match (p.by.as_deref(), p.ttl_secs) {
            (by, None) => {
                let by = by.unwrap_or(DEFAULT_TTL_EXTENSION);
                let by = workspace::store::spec::parse_duration(by)?;
                self.on_workspace(&p.name, move |ws, name| ws.workspace(name)?.extend_ttl(by))
                    .await?
            }
            (None, Some(secs)) => {
                self.on_workspace(&p.name, move |ws, name| {
                    ws.workspace(name)?.set_ttl(Some(secs))
                })
                .await?
            }
            (Some(_), Some(_)) => {
                return Err(ToolError::InvalidInput(
                    "give either by (a duration such as \"1h\") or ttl_secs, not both".into(),
                ))
            }
        };
        Ok(Out(meta))
    }

    /// Boot a stopped (or crashed) workspace and wait until its agent
    /// answers. Sends progress with the newest console line when asked;
    /// cancelling the call halts the VM.
    #[tool(
        output_schema = crate::output::schema::<Meta>(),
        annotations(
        title = "Start a workspace",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_start(
        &self,
        Parameters(p): Parameters<StartParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<Meta> {
        let timeout = seconds(
            "timeout_secs",
            p.timeout_secs,
            DEFAULT_START_TIMEOUT_SECS,
            MAX_START_TIMEOUT_SECS,
        )?;
        let mut progress = Progress::new(&ctx);
        let meta = self
            .start_workspace(&p.name, p.cold, timeout, &ctx, &mut progress)
            .await?;
        Ok(Out(meta))
    }

    /// Shut a workspace down cleanly (the guest syncs and powers off); the
    /// VM is torn down if it takes longer than the timeout. Processes in it
    /// end; its disk is kept. preview: true reports what would happen.
    #[tool(
        output_schema = crate::output::schema::<ChangeResult>(),
        annotations(
        title = "Stop a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_stop(
        &self,
        Parameters(p): Parameters<StopParams>,
    ) -> ToolResult<ChangeResult> {
        let timeout = seconds(
            "timeout_secs",
            p.timeout_secs,
            DEFAULT_STOP_TIMEOUT_SECS,
            MAX_STOP_TIMEOUT_SECS,
        )?;
        let would = |before: &Meta| {
            format!(
                "would shut workspace `{}` down ({}): its processes end; the VM is torn down if the guest takes more than {} s",
                before.name,
                before.state,
                timeout.as_secs()
            )
        };
        let stop = async {
            self.ws
                .workspace(&p.name)?
                .stop(timeout)
                .await
                .map_err(Into::into)
        };
        self.change_vm(&p.name, p.preview, ("stop", "stopped"), would, stop)
            .await
    }

    /// Hibernate a running workspace: its whole machine (memory, processes,
    /// open files) is written into its directory and its VM ends, so it
    /// costs no memory and no CPU (open connections through its network
    /// are lost; its published ports wait). Any later call on it (exec, files,
    /// processes, workspace_start) restores it as it was, in about a warm
    /// start's time. workspace_stop discards the hibernated machine.
    /// preview: true reports what would happen.
    #[tool(
        output_schema = crate::output::schema::<ChangeResult>(),
        annotations(
        title = "Hibernate a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_hibernate(
        &self,
        Parameters(p): Parameters<HibernateParams>,
    ) -> ToolResult<ChangeResult> {
        let timeout = seconds(
            "timeout_secs",
            p.timeout_secs,
            workspace::DEFAULT_HIBERNATE_TIMEOUT.as_secs(),
            MAX_STOP_TIMEOUT_SECS,
        )?;
        let would = |before: &Meta| {
            format!(
                "would write workspace `{}` ({}, {} MiB of memory at most) into its directory and end its VM; the next call restores it",
                before.name, before.state, before.spec.mem_mib
            )
        };
        let hibernate = async {
            self.ws
                .workspace(&p.name)?
                .hibernate(timeout)
                .await
                .map_err(Into::into)
        };
        self.change_vm(
            &p.name,
            p.preview,
            ("hibernate", "hibernated"),
            would,
            hibernate,
        )
        .await
    }

    /// Tear a workspace's VM down at once (like pulling the plug: guest
    /// writes not yet on disk are lost). preview: true reports what would
    /// happen.
    #[tool(
        output_schema = crate::output::schema::<ChangeResult>(),
        annotations(
        title = "Halt a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_halt(
        &self,
        Parameters(p): Parameters<HaltParams>,
    ) -> ToolResult<ChangeResult> {
        let would = |before: &Meta| {
            format!(
                "would kill the VM of workspace `{}` ({}, VMM pid {}): its processes end and unsynced guest writes are lost",
                before.name,
                before.state,
                before.runtime.as_ref().map_or(0, |r| r.pid)
            )
        };
        let halt = self.on_workspace(&p.name, |ws, name| ws.workspace(name)?.halt());
        self.change_vm(&p.name, p.preview, ("halt", "halted"), would, halt)
            .await
    }

    /// Delete a workspace: its disk, logs and record. A running one is
    /// refused unless force: true (which halts it first). preview: true
    /// reports what would happen.
    #[tool(
        output_schema = crate::output::schema::<DeleteResult>(),
        annotations(
        title = "Delete a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_delete(
        &self,
        Parameters(p): Parameters<DeleteParams>,
    ) -> ToolResult<DeleteResult> {
        let (preview, force) = (p.preview, p.force);
        let info = self
            .on_workspace(&p.name, move |ws, name| {
                let dev = ws.workspace(name)?;
                match dev.before_delete()? {
                    Some(info) => Ok(info),
                    // Placed on a server that does not know it (a create
                    // cut short): the delete forgets the placement, and
                    // says NOT_FOUND.
                    None => {
                        if !preview {
                            dev.delete(workspace::DeleteOptions::default().force(force))?;
                        }
                        Err(workspace::Error::WorkspaceNotFound(dev.name().to_owned()))
                    }
                }
            })
            .await?;
        info.meta
            .check_delete(workspace::DeleteOptions::default().force(p.force))?;
        let running = info.meta.state.has_vmm();
        let halt = if running {
            ", halting its VM first"
        } else {
            ""
        };
        if p.preview {
            return Ok(Out(DeleteResult {
                preview: true,
                action: format!(
                    "would delete workspace `{}` ({}){halt}: its disk and logs are removed for good",
                    p.name, info.meta.state
                ),
                workspace: info.meta,
                disk_used_bytes: info.disk_used_bytes,
            }));
        }
        let meta = self
            .on_workspace(&p.name, move |ws, name| {
                ws.workspace(name)?
                    .delete(workspace::DeleteOptions::default().force(p.force))
            })
            .await?;
        Ok(Out(DeleteResult {
            preview: false,
            action: format!("deleted workspace `{}`{halt}", p.name),
            workspace: meta,
            disk_used_bytes: info.disk_used_bytes,
        }))
    }

    /// List workspaces, optionally only those in a state, of an image, or
    /// with labels.
    #[tool(
        output_schema = crate::output::schema::<ListResult>(),
        annotations(
        title = "List workspaces",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_list(
        &self,
        Parameters(p): Parameters<ListParams>,
    ) -> ToolResult<ListResult> {
        let filter = ListFilter {
            state: p.state,
            image: p.image,
            labels: p.labels.into_iter().collect(),
            all_agents: p.all_agents,
            agent: p.user,
        };
        let namespace = p.namespace;
        let workspaces = self
            .blocking(move |ws| Ok(super::seen_from(ws, namespace.as_deref())?.list(&filter)?))
            .await?;
        Ok(Out(ListResult {
            count: workspaces.len(),
            workspaces,
        }))
    }

    /// Show one workspace: spec, state, VMM, ages, disk use, how its last
    /// run ended.
    #[tool(
        output_schema = crate::output::schema::<WorkspaceInfo>(),
        annotations(
        title = "Inspect a workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_inspect(
        &self,
        Parameters(p): Parameters<NameParams>,
    ) -> ToolResult<WorkspaceInfo> {
        let info = self
            .on_workspace(&p.name, |ws, name| ws.workspace(name)?.inspect())
            .await?;
        Ok(Out(info))
    }

    /// The last lines of a workspace's serial console (kernel and init
    /// messages; useful when a start fails), or with `service` of one of
    /// its services' output.
    #[tool(
        output_schema = crate::output::schema::<LogsResult>(),
        annotations(
        title = "Read a workspace's console log",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_logs(
        &self,
        Parameters(p): Parameters<LogsParams>,
    ) -> ToolResult<LogsResult> {
        let lines = in_range(
            "lines",
            p.lines.unwrap_or(DEFAULT_LOG_LINES) as u64,
            1,
            MAX_LOG_LINES as u64,
        )? as usize;
        let lines = match p.service {
            Some(service) => {
                let out = self
                    .ws
                    .workspace(&p.name)?
                    .service_output(&service, [0, 0], Duration::ZERO)
                    .await?;
                let all: Vec<String> = [&out.stdout.bytes, &out.stderr.bytes]
                    .iter()
                    .flat_map(|b| {
                        String::from_utf8_lossy(b)
                            .lines()
                            .map(str::to_owned)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                all[all.len().saturating_sub(lines)..].to_vec()
            }
            None => {
                self.on_workspace(&p.name, move |ws, name| {
                    ws.workspace(name)?.logs(Some(lines))
                })
                .await?
            }
        };
        Ok(Out(LogsResult {
            name: p.name,
            lines,
        }))
    }

    /// A workspace's events (created, started, exec_started, exec_finished,
    /// stopped, crashed, ttl_expired) after a cursor, waiting up to
    /// wait_secs for one when there is none yet. Pass next_after back as
    /// after to follow.
    #[tool(
        output_schema = crate::output::schema::<EventsResult>(),
        annotations(
        title = "Read or wait for workspace events",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn workspace_events(
        &self,
        Parameters(p): Parameters<EventsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<EventsResult> {
        let wait = in_range("wait_secs", p.wait_secs, 0, MAX_EVENT_WAIT.as_secs())?;
        let events = tokio::select! {
            got = self.ws.workspace(&p.name)?.events(p.after, Duration::from_secs(wait)) => got?,
            () = ctx.ct.cancelled() => {
                return Err(ToolError::Cancelled("the wait for events was cancelled".into()))
            }
        };
        let next_after = events.last().map_or(p.after, |e| e.seq);
        Ok(Out(EventsResult { events, next_after }))
    }
}
