//! Inputs and outputs of the task tools: run_task, get_task_info,
//! get_task_logs, wait_next_event, list_tasks, cleanup_task, cancel_task,
//! list_slots.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::tasks::slots::Slots;
use workspace::tasks::{TaskInfo, TaskLogs};

use crate::output::Render;

/// Default `wait_next_event` wait, ms (30 minutes).
pub const DEFAULT_EVENT_WAIT_MS: u64 = 1_800_000;
/// Default lines of `get_task_logs`.
pub const DEFAULT_TASK_LOG_LINES: usize = 200;
/// Most bytes one `get_task_logs` returns (its `limit`).
pub const MAX_TASK_LOG_READ: u64 = 1 << 20;

/// `run_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunTaskParams {
    /// What to do: written to /workspace/task.md, which the repository's
    /// task command reads.
    pub description: String,
    /// An allowlisted repository's alias (list_repos).
    pub repo: String,
    /// The namespace it goes in (default: the session's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The workspace's image (default "debian"; it needs git).
    #[serde(default)]
    pub image: Option<String>,
    /// The branch to start from and merge onto (default: the repository's
    /// current branch).
    #[serde(default)]
    pub branch: Option<String>,
    /// Secrets the command gets as environment variables; each must be
    /// allowed by the server's --allow-secret (FORBIDDEN otherwise).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Keep the workspace (stopped) when the task ends.
    #[serde(default)]
    pub keep: bool,
    /// Refuse with CONFLICT instead of queueing when every slot is taken.
    #[serde(default)]
    pub no_queue: bool,
    /// Guest memory in MiB, 256 to 16384, or with a unit (`"2g"`); default
    /// the host's `task.mem_mib` (config.json), else 1024.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub mem_mib: Option<u64>,
}

/// What `run_task` started.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunTaskResult {
    /// The task's id: get_task_info, get_task_logs, wait_next_event.
    pub task_id: String,
    /// The task as it is now (pending or running).
    pub task: TaskInfo,
}

/// Inputs that name a task.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdParams {
    /// The task's id (from run_task or list_tasks).
    pub task_id: String,
}

/// `cancel_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelTaskParams {
    /// The task's id (from run_task or list_tasks).
    pub task_id: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `list_tasks`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksParams {
    /// The namespace to list (default: the session's); `*` lists every
    /// namespace.
    pub namespace: Option<String>,
    /// Other agents' tasks too (FORBIDDEN to use); default false.
    #[serde(default)]
    pub all_agents: bool,
}

/// `get_task_logs`: the last `tail` lines, or with `offset` the bytes from
/// there on; never more than `limit` bytes.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskLogsParams {
    /// The task's id.
    pub task_id: String,
    /// Lines from the end (default 200), within the last `limit` bytes.
    /// Not with `offset`.
    #[serde(default, alias = "lines")]
    pub tail: Option<usize>,
    /// Read forward from this byte offset of everything the command
    /// printed (a previous answer's `next_offset` reads on; an offset
    /// before `dropped_bytes` starts at the oldest byte kept).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes returned, 1 to 1048576 (default 65536).
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_TASK_LOG_READ))]
    pub limit: Option<u64>,
}

/// `wait_next_event`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitEventParams {
    /// Longest wait, ms, 0 to 86400000 (a day; a longer one waits a day);
    /// default 1800000, 30 minutes.
    #[serde(default)]
    #[schemars(range(min = 0, max = 86_400_000))]
    pub timeout_ms: Option<u64>,
}

/// `cleanup_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CleanupTaskParams {
    /// The task's id; it must have ended (cancel_task first).
    pub task_id: String,
    /// Delete `refs/tasks/<id>` from the repository too.
    #[serde(default)]
    pub delete_ref: bool,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// One task.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskResultOut {
    /// The task.
    #[serde(flatten)]
    pub task: TaskInfo,
    /// What a preview would do; nothing was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

/// What `wait_next_event` saw.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskEvent {
    /// True when no task ended within the wait.
    pub timeout: bool,
    /// How the task ended, `completed` or `failed` (at the top level, as
    /// microvm-orchestrator's `wait_next_event` answers).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The task that ended, at the top level too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The task that ended (completed or failed), reported once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskInfo>,
}

/// Every task.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskList {
    /// The tasks, oldest first.
    pub tasks: Vec<TaskInfo>,
}

/// A task's log.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskLogsOut {
    /// The log.
    #[serde(flatten)]
    pub logs: TaskLogs,
}

/// The slots.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SlotsOut {
    /// The slots.
    #[serde(flatten)]
    pub slots: Slots,
}

/// What `cleanup_task` removed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CleanupTaskResult {
    /// The task removed.
    pub task_id: String,
    /// `refs/tasks/<id>` was deleted too.
    pub ref_deleted: bool,
    /// What a preview would remove; nothing was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

fn line(t: &TaskInfo) -> String {
    let merge = t.merge_result.as_ref().map_or(String::new(), |m| {
        if m.merged {
            format!(", merged {} commit(s)", m.commits)
        } else {
            format!(
                ", not merged ({})",
                m.reason.as_deref().unwrap_or("see merge_result")
            )
        }
    });
    let status = t.status.as_str();
    format!(
        "task {} on {} ({}): {status}{merge}",
        t.task_id, t.repo, t.branch
    )
}

impl Render for RunTaskResult {
    fn render(&self) -> String {
        format!("{}; wait_next_event reports its end", line(&self.task))
    }
}

impl Render for TaskResultOut {
    fn render(&self) -> String {
        match &self.preview {
            Some(would) => would.clone(),
            None => line(&self.task),
        }
    }
}

impl Render for TaskEvent {
    fn render(&self) -> String {
        match &self.task {
            Some(t) => line(t),
            None => "no task ended within the wait".into(),
        }
    }
}

impl Render for TaskList {
    fn render(&self) -> String {
        if self.tasks.is_empty() {
            return "no tasks".into();
        }
        self.tasks.iter().map(line).collect::<Vec<_>>().join("\n")
    }
}

impl Render for TaskLogsOut {
    fn render(&self) -> String {
        let l = &self.logs;
        let dropped = match l.dropped_bytes {
            0 => String::new(),
            n => format!(
                "; the first {n} bytes were dropped (the log is capped at {} bytes)",
                l.max_log_bytes
            ),
        };
        format!(
            "{} ({}), bytes {} to {} of {}{dropped}:\n{}",
            l.task_id,
            l.path.display(),
            l.offset,
            l.next_offset,
            l.size,
            l.text
        )
    }
}

impl Render for SlotsOut {
    fn render(&self) -> String {
        let mut text = format!(
            "{} slot(s), {} free",
            self.slots.max_slots,
            self.slots.available.len()
        );
        for c in &self.slots.caches {
            text.push('\n');
            text.push_str(&c.line());
        }
        text
    }
}

impl Render for CleanupTaskResult {
    fn render(&self) -> String {
        match &self.preview {
            Some(would) => would.clone(),
            None => format!("removed task {}", self.task_id),
        }
    }
}
