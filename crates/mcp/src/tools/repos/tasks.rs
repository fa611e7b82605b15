//! Task tools: run_task, get_task_info, get_task_logs, wait_next_event,
//! list_tasks, cleanup_task, cancel_task, list_slots. A task outlives the
//! server: its supervisor is a process of its own, its state a record on
//! disk, so a new server sees it (and reports its end once).

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::tasks::log::{LogRange, DEFAULT_LOG_READ};
use workspace::tasks::TaskRequest;

use crate::output::{Out, ToolResult};
use crate::schema::repos::tasks::*;
use crate::MicroagentServer;

#[tool_router(router = tasks_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Start a coding-agent task on an allowlisted repository: a fresh
    /// workspace (warm start) with the repository cloned at
    /// /workspace/repo, the description in /workspace/task.md, the
    /// repository's task command run as `user`. On exit its commits are
    /// kept at refs/tasks/<id> and merged onto the branch (fast-forward,
    /// else rebase; a dirty checked-out worktree is never touched). Returns
    /// the task_id at once; wait_next_event reports the end.
    #[tool(
        output_schema = crate::output::schema::<RunTaskResult>(),
        annotations(
        title = "Run a task",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn run_task(
        &self,
        Parameters(p): Parameters<RunTaskParams>,
    ) -> ToolResult<RunTaskResult> {
        self.grants.check_secrets(&p.secrets)?;
        let mut req = TaskRequest::new(p.description, p.repo);
        req.image = p.image;
        req.branch = p.branch;
        req.secrets = p.secrets;
        req.keep = p.keep;
        req.no_queue = p.no_queue;
        req.mem_mib = p.mem_mib;
        let namespace = p.namespace;
        let task = self
            .blocking(move |ws| {
                Ok(crate::tools::seen_from(ws, namespace.as_deref())?
                    .tasks()
                    .run(&req)?)
            })
            .await?;
        Ok(Out(RunTaskResult {
            task_id: task.task_id.clone(),
            task,
        }))
    }

    /// One task: status (pending, running, completed, failed), result,
    /// merge_result, exit_code, timings.
    #[tool(
        output_schema = crate::output::schema::<TaskResultOut>(),
        annotations(
        title = "Get a task",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn get_task_info(
        &self,
        Parameters(p): Parameters<TaskIdParams>,
    ) -> ToolResult<TaskResultOut> {
        let task = self
            .blocking(move |ws| Ok(ws.tasks().info(&p.task_id)?))
            .await?;
        Ok(Out(TaskResultOut {
            task,
            preview: None,
        }))
    }

    /// A task's command output (secrets shown as ***): the last `tail`
    /// lines (default 200), or with `offset` the bytes from there on
    /// (`next_offset` reads on); at most `limit` bytes (default 65536, at
    /// most 1048576). Offsets count everything the command printed; the
    /// log keeps its newest part under a cap, and `dropped_bytes` says how
    /// much went.
    #[tool(
        output_schema = crate::output::schema::<TaskLogsOut>(),
        annotations(
        title = "Get a task's logs",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn get_task_logs(
        &self,
        Parameters(p): Parameters<TaskLogsParams>,
    ) -> ToolResult<TaskLogsOut> {
        let limit = crate::tools::in_range(
            "limit",
            p.limit.unwrap_or(DEFAULT_LOG_READ),
            1,
            MAX_TASK_LOG_READ,
        )?;
        let range = match (p.offset, p.tail) {
            (Some(_), Some(_)) => {
                return Err(crate::ToolError::InvalidInput(
                    "give `offset` (read forward) or `tail` (last lines), not both".into(),
                ))
            }
            (Some(offset), None) => LogRange::From { offset, limit },
            (None, tail) => LogRange::Tail {
                lines: tail.unwrap_or(DEFAULT_TASK_LOG_LINES),
                limit,
            },
        };
        let logs = self
            .blocking(move |ws| Ok(ws.tasks().logs(&p.task_id, range)?))
            .await?;
        Ok(Out(TaskLogsOut { logs }))
    }

    /// Wait until a task ends (completed or failed) that has not been
    /// reported yet, and report it (each task once, also across server
    /// restarts); {timeout: true} when none ends within timeout_ms.
    /// Cancelling this wait does not cancel any task.
    #[tool(
        output_schema = crate::output::schema::<TaskEvent>(),
        annotations(
        title = "Wait for the next task to end",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn wait_next_event(
        &self,
        Parameters(p): Parameters<WaitEventParams>,
    ) -> ToolResult<TaskEvent> {
        let wait = Duration::from_millis(p.timeout_ms.unwrap_or(DEFAULT_EVENT_WAIT_MS));
        let task = self.ws.tasks().wait_next_event(wait).await?;
        Ok(Out(TaskEvent {
            timeout: task.is_none(),
            ended: task.as_ref().map(|t| t.status.as_str().to_owned()),
            task_id: task.as_ref().map(|t| t.task_id.clone()),
            task,
        }))
    }

    /// Every task, oldest first.
    #[tool(
        output_schema = crate::output::schema::<TaskList>(),
        annotations(
        title = "List tasks",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn list_tasks(&self, Parameters(p): Parameters<ListTasksParams>) -> ToolResult<TaskList> {
        let tasks = self
            .blocking(move |ws| {
                let ws = crate::tools::seen_from(ws, p.namespace.as_deref())?;
                Ok(ws.tasks().list(p.all_agents)?)
            })
            .await?;
        Ok(Out(TaskList { tasks }))
    }

    /// Cancel a task: its command is killed; what it committed is kept at
    /// refs/tasks/<id> (not merged) and its workspace removed. An ended task
    /// is left as it is. preview: true says what would happen.
    #[tool(
        output_schema = crate::output::schema::<TaskResultOut>(),
        annotations(
        title = "Cancel a task",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn cancel_task(
        &self,
        Parameters(p): Parameters<CancelTaskParams>,
    ) -> ToolResult<TaskResultOut> {
        if p.preview {
            let id = p.task_id.clone();
            let task = self.blocking(move |ws| Ok(ws.tasks().info(&id)?)).await?;
            let would = if task.status.is_final() {
                format!(
                    "nothing: task {} has ended ({})",
                    task.task_id,
                    task.status.as_str()
                )
            } else {
                format!(
                    "would cancel task {} ({}): its command is killed, its commits kept at refs/tasks/{} (not merged), its workspace removed",
                    task.task_id, task.status.as_str(), task.task_id
                )
            };
            return Ok(Out(TaskResultOut {
                task,
                preview: Some(would),
            }));
        }
        let task = self.ws.tasks().cancel(&p.task_id).await?;
        Ok(Out(TaskResultOut {
            task,
            preview: None,
        }))
    }

    /// Remove an ended task's record, logs and kept workspace;
    /// delete_ref: true deletes refs/tasks/<id> too. A task still running
    /// is CONFLICT (cancel_task first). preview: true says what would go.
    #[tool(
        output_schema = crate::output::schema::<CleanupTaskResult>(),
        annotations(
        title = "Clean up a task",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn cleanup_task(
        &self,
        Parameters(p): Parameters<CleanupTaskParams>,
    ) -> ToolResult<CleanupTaskResult> {
        let (delete_ref, preview) = (p.delete_ref, p.preview);
        let task = self
            .blocking(move |ws| Ok(ws.tasks().cleanup(&p.task_id, delete_ref, preview)?))
            .await?;
        let would = preview.then(|| {
            format!(
                "would remove task {} ({}): its record and logs, its workspace `{}` if kept{}",
                task.task_id,
                task.status.as_str(),
                task.workspace,
                if delete_ref {
                    format!(", and refs/tasks/{}", task.task_id)
                } else {
                    String::new()
                }
            )
        });
        Ok(Out(CleanupTaskResult {
            task_id: task.task_id,
            ref_deleted: delete_ref && !preview,
            preview: would,
        }))
    }

    /// The task slots: how many tasks may run at once, which are held
    /// (slot, task_id, repo) and which are free; and the task cache
    /// volumes this session may use (each its agent's, per repository and
    /// slot).
    #[tool(
        output_schema = crate::output::schema::<SlotsOut>(),
        annotations(
        title = "List task slots",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn list_slots(&self) -> ToolResult<SlotsOut> {
        let slots = self.blocking(|ws| Ok(ws.tasks().slots()?)).await?;
        Ok(Out(SlotsOut { slots }))
    }
}
