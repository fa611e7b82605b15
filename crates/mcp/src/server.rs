//! The MCP server: a [`Workspaces`] behind a tool router. It keeps no state
//! of its own beyond a count of the calls in flight, so shutdown can let
//! them finish their cleanup, and the long calls it runs as MCP tasks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult,
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::task_manager::TaskManager;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};
use tokio::sync::Notify;
use workspace::Workspaces;

use crate::host_roots::HostRoots;
use crate::progress::Progress;
use crate::subscriptions::Subscriptions;
use crate::ToolError;

/// What the server tells clients (and their models) about itself.
pub const INSTRUCTIONS: &str = "microagent runs disposable Linux workspaces, each a KVM microVM with its own kernel, disk and guest agent. \
Usual flow: workspace_create (image `minimal` = busybox, `debian` = Python and apt), workspace_start, then workspace_exec and file_read/file_write/file_list/copy_in/copy_out, and workspace_delete when done. \
run_code runs Python in a one-shot debian workspace (or a given running one). \
For anything that runs longer than one call (servers, long builds, test suites) use process_start, then process_output with cursors and wait_secs, process_wait and process_signal: processes outlive this call and this server. \
Workspaces outlive this server; workspace_list shows them. Destructive tools (stop, halt, delete, file_write, copy_in, copy_out) accept preview: true to report what they would do without doing it. \
Failures are tool results with isError and a stable code (NOT_FOUND, INVALID_INPUT, NOT_RUNNING, CONFLICT, FORBIDDEN, HOST_UNSUPPORTED, TIMEOUT, INTERNAL); the contract tool lists the codes and limits.";

/// Counts the tool calls in flight.
#[derive(Debug, Default)]
pub struct Inflight {
    count: AtomicUsize,
    idle: Notify,
}

/// One call in flight; dropping it ends it.
#[derive(Debug)]
pub struct InflightGuard(Arc<Inflight>);

impl Inflight {
    /// Marks a call as started.
    pub fn enter(self: &Arc<Self>) -> InflightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self.clone())
    }

    /// Calls in flight now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, at most `timeout`; false when some
    /// still are.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count() == 0;
            }
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The long calls a server runs as MCP tasks (its clones share them).
#[derive(Clone, Default)]
pub struct CallTasks(TaskManager);

impl std::ops::Deref for CallTasks {
    type Target = TaskManager;
    fn deref(&self) -> &TaskManager {
        &self.0
    }
}

impl std::fmt::Debug for CallTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTasks").finish_non_exhaustive()
    }
}

/// The microagent MCP server over one workspace store.
#[derive(Debug, Clone)]
pub struct MicroagentServer {
    pub(crate) ws: Workspaces,
    /// The host directories copies and imports may use.
    pub(crate) host_roots: Arc<HostRoots>,
    /// What the operator allowed beyond the defaults.
    pub(crate) grants: crate::Grants,
    pub(crate) tool_router: ToolRouter<Self>,
    pub(crate) inflight: Arc<Inflight>,
    /// This session's workspaces, deleted when it ends.
    pub(crate) session: Arc<crate::session::SessionScope>,
    /// This session's resource subscriptions (`resources/subscribe`).
    pub(crate) subscriptions: Arc<Subscriptions>,
    /// Long calls running or done as MCP tasks (shared by every session:
    /// a stateless client's next request is a new session).
    pub(crate) tasks: CallTasks,
    /// Where this server serves preview URLs (over HTTP), if it does.
    pub(crate) preview_base: Option<Arc<PreviewBase>>,
    /// Over HTTP: how long rmcp keeps a session without an event, which
    /// a call running longer must not outlast.
    pub(crate) session_keep_alive: Option<Duration>,
}

/// The HTTP address preview URLs are served at.
#[derive(Debug)]
pub(crate) struct PreviewBase {
    /// `http` or `https`.
    pub(crate) scheme: &'static str,
    /// The server's address as clients reach it: previews on its own
    /// origin are sandboxed.
    pub(crate) reach: std::net::SocketAddr,
    /// The domain each preview's own host name is under, when they have
    /// their own origins (`<label>.<domain>:<port>`).
    pub(crate) domain: Option<String>,
    /// The address listened on (a grant decides whether it may be public).
    pub(crate) ip: std::net::IpAddr,
}

impl PreviewBase {
    /// The URL of `made` on its own origin (else on the server's), and on
    /// the server's origin, sandboxed.
    pub(crate) fn urls(
        &self,
        made: &workspace::store::previews::IssuedPreview,
    ) -> (String, String) {
        let sandboxed = format!("{}://{}{}", self.scheme, self.reach, made.path);
        let own = self
            .origin_of(&made.origin_label)
            .map(|o| format!("{o}{}", made.path));
        (own.unwrap_or_else(|| sandboxed.clone()), sandboxed)
    }

    /// `scheme://pv<id>.<domain>:<port>`: the form of each preview's own
    /// origin, when they have one.
    pub(crate) fn origin_form(&self) -> Option<String> {
        let prefix = workspace::store::previews::ORIGIN_LABEL_PREFIX;
        self.origin_of(&format!("{prefix}<id>"))
    }

    /// The own origin of the preview labelled `label`, when previews have
    /// them.
    fn origin_of(&self, label: &str) -> Option<String> {
        let domain = self.domain.as_ref()?;
        Some(format!(
            "{}://{label}.{domain}:{}",
            self.scheme,
            self.reach.port()
        ))
    }
}

impl MicroagentServer {
    /// A server for the workspaces of `ws`, whose tools read and write
    /// host files only beneath `host_roots`.
    pub fn new(ws: Workspaces, host_roots: HostRoots) -> Self {
        let mut tool_router = Self::lifecycle_router()
            + Self::agents_router()
            + Self::exec_router()
            + Self::files_router()
            + Self::file_ops_router()
            + Self::info_router()
            + Self::snapshots_router()
            + Self::ports_router()
            + Self::networks_router()
            + Self::images_router()
            + Self::volumes_router()
            + Self::repos_router()
            + Self::tasks_router()
            + Self::host_router()
            + Self::run_router()
            + Self::processes_router()
            + Self::watch_router()
            + Self::browser_router()
            + Self::code_router();
        #[cfg(feature = "conformance-fixture")]
        {
            tool_router += Self::conformance_router();
        }
        for route in tool_router.map.values_mut() {
            let tool = &mut route.attr;
            crate::json_schema::standardize(Arc::make_mut(&mut tool.input_schema));
            if let Some(output) = tool.output_schema.as_mut() {
                crate::json_schema::standardize(Arc::make_mut(output));
            }
        }
        let caller = Arc::new(workspace::agents::access::Caller::new());
        let ws = ws.for_caller(caller.clone());
        Self {
            session: Arc::new(crate::session::SessionScope::new(ws.clone(), caller)),
            subscriptions: Arc::new(Subscriptions::new(ws.clone())),
            ws,
            host_roots: Arc::new(host_roots),
            grants: crate::Grants::default(),
            tool_router,
            inflight: Arc::default(),
            tasks: CallTasks::default(),
            preview_base: None,
            session_keep_alive: None,
        }
    }

    /// The same server for a new session: its own session-scoped
    /// workspaces, the calls in flight counted with every other session's.
    pub fn for_new_session(&self) -> Self {
        let caller = Arc::new(workspace::agents::access::Caller::new());
        let ws = self.ws.for_caller(caller.clone());
        Self {
            session: Arc::new(crate::session::SessionScope::new(ws.clone(), caller)),
            subscriptions: Arc::new(Subscriptions::new(ws.clone())),
            ws,
            ..self.clone()
        }
    }

    /// This session's scope (ending it deletes its workspaces).
    pub fn session(&self) -> Arc<crate::session::SessionScope> {
        self.session.clone()
    }

    /// The same server for a new session over HTTP, where a session lives
    /// while its client sends requests at least every `keep_alive`: its
    /// resource subscriptions end when the client has gone silent longer.
    pub fn for_new_http_session(&self, keep_alive: Duration) -> Self {
        let mut server = self.for_new_session();
        server.subscriptions = Arc::new(Subscriptions::with_silence_limit(
            server.ws.clone(),
            Some(keep_alive),
        ));
        server.session_keep_alive = Some(keep_alive);
        server
    }

    /// The same server, serving preview URLs at `base` (`serve mcp
    /// --http`).
    pub(crate) fn serving_previews_at(mut self, base: PreviewBase) -> Self {
        self.preview_base = Some(Arc::new(base));
        self
    }

    /// The same server with `grants` (none by default).
    pub fn with_grants(mut self, grants: crate::Grants) -> Self {
        self.grants = grants;
        self
    }

    /// The workspace store.
    pub fn workspaces(&self) -> &Workspaces {
        &self.ws
    }

    /// The calls in flight (shared with every clone of this server).
    pub fn inflight(&self) -> Arc<Inflight> {
        self.inflight.clone()
    }

    /// Every tool this server offers.
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }
}

/// The tools that send progress notifications of their own.
const REPORTS_ITS_OWN_PROGRESS: [&str; 12] = [
    "code_session_start",
    "code_run",
    "process_output",
    "file_watch_events",
    "process_wait",
    "run",
    "workspace_start",
    "workspace_exec",
    "run_code",
    "snapshot_take",
    "snapshot_restore",
    "workspace_fork",
];

/// What rmcp starts the text of a result with when the arguments did not
/// deserialize into the tool's input type.
const ARGUMENT_ERROR: &str = "failed to deserialize parameters: ";

/// Arguments that do not fit the input schema are a tool error (MCP
/// SEP-1303: the model sees it and can correct itself); rmcp reports them as
/// text only, so this gives them the INVALID_INPUT code every other tool
/// error has.
pub(crate) fn with_error_code(response: CallToolResponse) -> CallToolResponse {
    let CallToolResponse::Complete(result) = &response else {
        return response;
    };
    if result.is_error != Some(true) || result.structured_content.is_some() {
        return response;
    }
    let Some(why) = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .and_then(|t| t.text.strip_prefix(ARGUMENT_ERROR))
    else {
        return response;
    };
    ToolError::InvalidInput(format!(
        "the arguments do not fit the tool's input schema: {why}"
    ))
    .to_result()
    .into()
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for MicroagentServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("microagent", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS.to_owned())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.subscriptions.touch();
        let name = request.name.to_string();
        if Self::answers_with_task(&name, &context) {
            return Ok(CallToolResponse::Task(self.start_task(request, context)));
        }
        let _busy = self.inflight.enter();
        // Every call reports progress when the client asked for it: those
        // below with their own words, the rest with how long they have run.
        let mut heartbeat =
            (!REPORTS_ITS_OWN_PROGRESS.contains(&name.as_str())).then(|| Progress::new(&context));
        let peer = context.peer.clone();
        let call = ToolCallContext::new(self, request, context);
        let work = self.tool_router.call(call);
        let driven = async {
            match heartbeat.as_mut() {
                Some(p) => {
                    p.drive(work, |elapsed| {
                        format!("{name}: running for {} s", elapsed.as_secs())
                    })
                    .await
                }
                None => work.await,
            }
        };
        let response = match self.session_keep_alive {
            // A call longer than the session's keep-alive (a kernel's
            // first import, a long command) must not end its session.
            Some(limit) => crate::progress::keeping_session(driven, peer, limit).await?,
            None => driven.await?,
        };
        Ok(with_error_code(response))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.subscriptions.touch();
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&request.task_id)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.subscriptions.touch();
        self.resource_list().await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(Self::resource_templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.subscriptions.touch();
        let _busy = self.inflight.enter();
        Ok(self.resource_read(&request.uri).await?.into())
    }

    // Clients before protocol 2026-07-28 subscribe this way (rmcp calls it
    // legacy); `listen` below serves the newer ones.
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.touch();
        let _busy = self.inflight.enter();
        self.resource_subscribe(
            &request.uri,
            &self.subscriptions,
            crate::subscriptions::UpdateSink::Session(context.peer),
        )
        .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.touch();
        self.subscriptions.unsubscribe(&request.uri);
        Ok(())
    }

    async fn ping(&self, _context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.subscriptions.touch();
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(Self::subscribable(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.resource_listen(context).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inflight_waits_for_the_last_call() {
        let inflight = Arc::new(Inflight::default());
        assert!(inflight.wait_idle(Duration::from_millis(1)).await);
        let guard = inflight.enter();
        assert!(!inflight.wait_idle(Duration::from_millis(20)).await);
        let waiter = {
            let inflight = inflight.clone();
            tokio::spawn(async move { inflight.wait_idle(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(inflight.count(), 0);
    }

    #[test]
    fn the_tools_named_in_lists_exist() {
        let dir = std::env::temp_dir().join(format!("mcp-names-{}", std::process::id()));
        let ws = Workspaces::builder().state_dir(&dir).build().unwrap();
        let roots = HostRoots::new(std::slice::from_ref(&std::env::temp_dir())).unwrap();
        let names: Vec<String> = MicroagentServer::new(ws, roots)
            .tools()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        let listed = REPORTS_ITS_OWN_PROGRESS
            .iter()
            .chain(&crate::long_calls::TASK_TOOLS);
        for tool in listed {
            assert!(names.iter().any(|n| n == tool), "{tool}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
