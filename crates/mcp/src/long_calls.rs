//! Long tool calls as MCP tasks (the `io.modelcontextprotocol/tasks`
//! extension of protocol 2026-07-28, as rmcp serves it): a client that
//! declares the extension gets a task id at once for the tools below,
//! polls `tasks/get` until the tool's result is in it, and may cancel with
//! `tasks/cancel`, which cancels the call as a cancelled request would (a
//! guest process is killed, a pull leaves nothing). Other clients, and
//! other tools, are answered as before, with progress notifications.

use std::time::Duration;

use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CreateTaskResult, ProtocolVersion};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskOptions};
use rmcp::{ErrorData, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::MicroagentServer;

/// The tools a task-aware client gets as tasks (the browser's: any call
/// may start Chromium, which takes minutes where guest kernel mode is
/// emulated).
pub const TASK_TOOLS: [&str; 14] = [
    "browser_click",
    "browser_close",
    "browser_fill",
    "browser_open",
    "browser_screenshot",
    "browser_snapshot",
    "image_pull",
    "image_build",
    "kernel_install",
    "run",
    "run_code",
    "snapshot_take",
    "workspace_start",
    "run_task",
];

/// How long a task and its result are kept: past it an unfinished one is
/// failed and a finished one forgotten. Above the longest build.
const TASK_TTL: Duration = Duration::from_secs(6 * 3600);
/// How often clients are asked to poll.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a cancelled call may take to clean up before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(30);

impl MicroagentServer {
    /// Whether this call of `tool` is answered with a task: the tool is
    /// long and the client speaks 2026-07-28 or later and declared the
    /// extension (before that version the extension does not apply,
    /// whatever the client declared).
    pub(crate) fn answers_with_task(tool: &str, context: &RequestContext<RoleServer>) -> bool {
        // Versions are dates: they order as text.
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        TASK_TOOLS.contains(&tool)
            && modern
            && context
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks())
    }

    /// Starts `request` as a task and returns its handle.
    pub(crate) fn start_task(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CreateTaskResult {
        let this = self.clone();
        let mut context = context;
        // The request's own token is cancelled once the handle is sent;
        // the task's lives until the task ends or is cancelled.
        context.ct = CancellationToken::new();
        // Tasks report no progress notifications (the request is over).
        context.meta.remove("progressToken");
        let options = TaskOptions::new()
            .with_ttl_ms(TASK_TTL.as_millis() as u64)
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64)
            .with_status_message(format!("{} running", request.name));
        let task = self.tasks.spawn(options, move |task| {
            Box::pin(async move {
                let _busy = this.inflight.enter();
                let cancel = context.ct.clone();
                let call = ToolCallContext::new(&this, request, context);
                let work = this.tool_router.call(call);
                tokio::pin!(work);
                let response = tokio::select! {
                    done = &mut work => done?,
                    () = task.cancelled() => {
                        cancel.cancel();
                        let _ = tokio::time::timeout(CANCEL_GRACE, work).await;
                        return Err(TaskExit::Cancelled);
                    }
                };
                match crate::server::with_error_code(response) {
                    CallToolResponse::Complete(result) => Ok(result),
                    _ => Err(TaskExit::Error(ErrorData::internal_error(
                        "the tool asked for input, which a task cannot give it",
                        None,
                    ))),
                }
            })
        });
        CreateTaskResult::new(task)
    }
}
