//! Tasks: a coding agent's run on a clone of an allowlisted repository, in
//! a workspace of its own, whose commits are merged back onto the branch
//! it started from. A task is a record in `<state>/tasks/<id>/` (`task.json`,
//! the command's `task.log`, the supervisor's `supervisor.log`), so it
//! outlives the CLI or MCP server that started it; a small supervisor
//! process drives it ([`run`]). Front ends reach tasks through the service
//! `ws.tasks()` ([`service`]). How commits come back onto the host branch
//! is [`merge`]; slots and their cache volumes are [`slots`] and
//! [`caches`].

mod caches;
pub mod log;
pub mod merge;
mod run;
pub mod service;
pub mod slots;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod redteam_hostile_tests;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;
use base::store::file_lock::FileLock;
use base::store::records::{RecordError, RecordLayout, RecordStore};
use base::store::spec::Owner;
use base::store::{StateDir, StoreError};

pub use merge::MergeResult;

/// The directory of tasks in the state directory.
pub const TASKS_DIR: &str = "tasks";
/// Where a task's description is written in the guest.
pub const GUEST_TASK_FILE: &str = "/workspace/task.md";
/// Where a task may write its result in the guest.
pub const GUEST_RESULT_FILE: &str = "/workspace/result.json";
/// Longest description, bytes.
pub const MAX_DESCRIPTION: usize = 64 * 1024;
/// Largest `result.json` read.
pub const MAX_RESULT_BYTES: u64 = 64 * 1024;
/// The host ref a task's commits are kept at (`<prefix><id>`).
pub const TASK_REF_PREFIX: &str = "refs/tasks/";
/// The arguments (before the task id) that make the task program a task's
/// supervisor.
pub const SUPERVISE_SUBCOMMAND: [&str; 2] = ["task", "supervise"];
/// The `config.json` object with task settings (`command`, `max_slots`,
/// `max_log_bytes`).
pub const CONFIG_KEY: &str = "task";

/// Why a task operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// No task has that id.
    #[error("task `{0}` does not exist")]
    NotFound(String),
    /// The request is unusable.
    #[error("{0}")]
    Invalid(String),
    /// No slot is free and the caller would not queue.
    #[error("all {0} task slots are taken")]
    NoSlot(u32),
    /// The task is still running.
    #[error("task `{0}` is still running")]
    Running(String),
    /// Reading or writing the state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, writing, listing or removing a task's record failed.
    #[error(transparent)]
    Record(RecordError),
    /// A host file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::ConcernError for TaskError {
    fn code(&self) -> ErrorCode {
        match self {
            TaskError::NotFound(_) => ErrorCode::NotFound,
            TaskError::Invalid(_) => ErrorCode::InvalidInput,
            TaskError::NoSlot(_) | TaskError::Running(_) => ErrorCode::Conflict,
            TaskError::Store(e) => e.code(),
            TaskError::Record(e) => e.code(),
            TaskError::Io { .. } => ErrorCode::Internal,
        }
    }
}

impl From<TaskError> for crate::error::Error {
    fn from(e: TaskError) -> Self {
        crate::error::Error::Task(crate::error::ConcernFailure::new(e))
    }
}

impl TaskError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| TaskError::Io { what, source }
    }
}

impl From<RecordError> for TaskError {
    fn from(e: RecordError) -> Self {
        match e {
            // Ids are made here, never typed: one that is no id is no task.
            RecordError::Name { name } => TaskError::NotFound(name),
            e => TaskError::Record(e),
        }
    }
}

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for a slot, or for its supervisor to begin.
    Pending,
    /// Its workspace is being made, or its command runs, or its commits
    /// are being merged.
    Running,
    /// Its command exited 0 (or its result.json says success).
    Completed,
    /// Its command failed, was cancelled, or a step failed.
    Failed,
}

impl TaskStatus {
    /// Its name, as records and front ends spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
        }
    }

    /// True once it will not change again.
    pub fn is_final(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed)
    }
}

/// What a task says of itself in `/workspace/result.json`, or what its
/// exit status and commits say when it writes none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct TaskResult {
    /// Whether it did what it was asked.
    pub success: bool,
    /// A short account of what it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Files it changed.
    #[serde(default)]
    pub files_changed: Vec<String>,
    /// What went wrong, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How long each phase took, ms since the epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct TaskTimings {
    /// When it was asked for.
    pub created_ms: u64,
    /// When its workspace began to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When its command began to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_started_ms: Option<u64>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
}

/// A task as its record keeps it and front ends show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct TaskInfo {
    /// Its id.
    pub task_id: String,
    /// Where it is.
    pub status: TaskStatus,
    /// The allowlisted repository.
    pub repo: String,
    /// The host branch it started from, and its commits are merged onto.
    pub branch: String,
    /// The commit `branch` was at when it was asked for.
    pub base: String,
    /// The image of its workspace.
    pub image: String,
    /// What it was asked to do.
    pub description: String,
    /// Names of the secrets it gets (never their values).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Its workspace (kept after the end with `keep`).
    pub workspace: String,
    /// Keep the workspace (stopped) when it ends.
    pub keep: bool,
    /// The slot it runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Its workspace's memory, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mib: Option<u64>,
    /// Its command's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<TaskResult>,
    /// How its commits came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_result: Option<MergeResult>,
    /// What failed, when a step (not the command) failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Phases.
    pub timings: TaskTimings,
    /// The supervisor process driving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<Owner>,
    /// The guest exec of its command, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
    /// A cancel was asked for.
    #[serde(default)]
    pub cancelled: bool,
    /// `wait_next_event` has returned its end.
    #[serde(default)]
    pub reported: bool,
    /// The namespace it was asked for in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The agent whose session asked for it: its workspace is the agent's
    /// too, and other agents may not see or change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

fn default_namespace() -> String {
    base::store::name::DEFAULT_NAMESPACE.to_owned()
}

/// Task settings of `config.json`'s `task` object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct TaskConfig {
    /// The command a task runs when its repository names none.
    #[serde(default)]
    pub command: Option<String>,
    /// Most tasks running at once.
    #[serde(default)]
    pub max_slots: Option<u32>,
    /// The cap of each task's log, bytes (default
    /// [`log::DEFAULT_MAX_LOG_BYTES`], at least [`log::MIN_MAX_LOG_BYTES`]).
    #[serde(default)]
    pub max_log_bytes: Option<u64>,
    /// The memory of a task's workspace when its request names none
    /// (default [`service::TASK_MEM_MIB`]); also what the default number
    /// of slots divides by.
    #[serde(default)]
    pub mem_mib: Option<u64>,
}

impl TaskConfig {
    /// The cap of each task's log.
    pub fn log_cap(&self) -> u64 {
        self.max_log_bytes
            .unwrap_or(log::DEFAULT_MAX_LOG_BYTES)
            .max(log::MIN_MAX_LOG_BYTES)
    }

    /// The memory of a task whose request names none.
    pub fn task_mem_mib(&self) -> u64 {
        self.mem_mib.unwrap_or(service::TASK_MEM_MIB)
    }
}

impl TaskConfig {
    /// The settings of the state directory at `root` (defaults when the
    /// file or the object is missing; an unreadable file is an error).
    pub fn load(root: &Path) -> Result<Self, TaskError> {
        let section = base::host::settings::config_section(root, CONFIG_KEY)
            .map_err(|e| TaskError::Invalid(base::error_chain::error_chain(&e)))?;
        Ok(section.map(|(config, _)| config).unwrap_or_default())
    }
}

/// What to run.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct TaskRequest {
    /// What the task is asked to do (written to /workspace/task.md).
    pub description: String,
    /// The allowlisted repository.
    pub repo: String,
    /// The image (default `debian`).
    pub image: Option<String>,
    /// The branch to start from and merge onto (default: the
    /// repository's current branch).
    pub branch: Option<String>,
    /// Secrets the command gets as environment variables.
    pub secrets: Vec<String>,
    /// Keep the workspace (stopped) afterwards.
    pub keep: bool,
    /// Refuse (CONFLICT) instead of queueing when every slot is taken.
    pub no_queue: bool,
    /// Guest memory, MiB (default `config.json`'s `task.mem_mib`, else
    /// 1024).
    pub mem_mib: Option<u64>,
}

impl TaskRequest {
    /// Run `description` on `repo`.
    pub fn new(description: impl Into<String>, repo: impl Into<String>) -> Self {
        Self {
            description: description.into(),
            repo: repo.into(),
            ..Self::default()
        }
    }
}

/// A range of a task's command log. Offsets count bytes of everything the
/// command printed: the log keeps only its newest part past its cap, and a
/// cut does not move them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct TaskLogs {
    /// The task.
    pub task_id: String,
    /// The log file on the host (the command's output, secrets masked).
    pub path: PathBuf,
    /// The bytes read, as text (an invalid UTF-8 sequence shows as U+FFFD).
    pub text: String,
    /// Where they start.
    pub offset: u64,
    /// Where they end: the `offset` that reads on from here.
    pub next_offset: u64,
    /// Bytes the command printed so far.
    pub size: u64,
    /// Bytes dropped from the log's start to keep it under its cap (no
    /// longer readable).
    pub dropped_bytes: u64,
    /// The log's cap, bytes.
    pub max_log_bytes: u64,
    /// The supervisor's own log (its steps and failures).
    pub supervisor_log: PathBuf,
}

/// The task records of one state directory.
#[derive(Clone, Debug)]
pub struct TaskStore {
    records: RecordStore<TaskInfo>,
}

/// Whether `id` may be a task's id (and so a folder's name).
fn is_task_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl TaskStore {
    /// The tasks of `state`: a folder each, its record `task.json`, which
    /// updates lock with `task.lock`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            records: RecordStore::new(
                state.root().join(TASKS_DIR),
                RecordLayout::Folder("task.json"),
                is_task_id,
            ),
        }
    }

    /// The tasks directory.
    pub fn root(&self) -> &Path {
        self.records.dir()
    }

    /// Task `id`'s directory (whether or not it exists).
    pub fn dir(&self, id: &str) -> Result<PathBuf, TaskError> {
        Ok(self.records.files().home(id)?)
    }

    /// The command log of task `id`.
    pub fn log_path(&self, id: &str) -> Result<PathBuf, TaskError> {
        Ok(self.dir(id)?.join("task.log"))
    }

    /// The supervisor's own log of task `id`.
    pub fn supervisor_log(&self, id: &str) -> Result<PathBuf, TaskError> {
        Ok(self.dir(id)?.join("supervisor.log"))
    }

    /// The lock every change of the set of tasks takes (slot choice).
    pub fn lock_all(&self) -> Result<FileLock, TaskError> {
        base::store::make_private_dir(self.root())?;
        let path = self.root().join("tasks.lock");
        FileLock::exclusive(&path).map_err(TaskError::io(format!("locking {}", path.display())))
    }

    /// Writes a new task's record.
    pub fn insert(&self, info: &TaskInfo) -> Result<(), TaskError> {
        Ok(self.records.put(&info.task_id, info)?)
    }

    /// Task `id`.
    pub fn get(&self, id: &str) -> Result<TaskInfo, TaskError> {
        self.records
            .get(id)?
            .ok_or_else(|| TaskError::NotFound(id.to_owned()))
    }

    /// Changes task `id` under its lock; returns it as changed.
    pub fn update(
        &self,
        id: &str,
        change: impl FnOnce(&mut TaskInfo),
    ) -> Result<TaskInfo, TaskError> {
        self.records
            .update(id, change)?
            .ok_or_else(|| TaskError::NotFound(id.to_owned()))
    }

    /// Every task, oldest first.
    pub fn list(&self) -> Result<Vec<TaskInfo>, TaskError> {
        let mut out = Vec::new();
        for id in self.records.names()? {
            match self.get(&id) {
                Ok(info) => out.push(info),
                Err(e) => tracing::warn!("skipping task {id}: {e}"),
            }
        }
        out.sort_by_key(|t| (t.timings.created_ms, t.task_id.clone()));
        Ok(out)
    }

    /// Removes task `id`'s record and logs (gone already: nothing to do).
    pub fn remove(&self, id: &str) -> Result<(), TaskError> {
        self.records.remove(id)?;
        Ok(())
    }
}

/// The id a new task gets.
pub(crate) fn new_task_id() -> String {
    base::host::settings::unique_id()
}

/// The workspace task `id` runs in.
pub fn workspace_of(id: &str) -> String {
    format!("task-{id}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::ConcernError;

    pub(crate) fn info(id: &str, created_ms: u64) -> TaskInfo {
        TaskInfo {
            task_id: id.into(),
            status: TaskStatus::Pending,
            repo: "proj".into(),
            branch: "main".into(),
            base: "a".repeat(40),
            image: "debian".into(),
            description: "do it".into(),
            secrets: vec![],
            workspace: workspace_of(id),
            keep: false,
            slot: None,
            mem_mib: None,
            exit_code: None,
            result: None,
            merge_result: None,
            error: None,
            timings: TaskTimings {
                created_ms,
                ..TaskTimings::default()
            },
            supervisor: None,
            exec_id: None,
            cancelled: false,
            reported: false,
            namespace: default_namespace(),
            agent: None,
        }
    }

    #[test]
    fn records_round_trip_and_list_oldest_first() {
        let root = std::env::temp_dir().join(format!("ma-tasks-{}", new_task_id()));
        let state = StateDir::at(&root).unwrap();
        let store = TaskStore::new(&state);
        assert!(store.list().unwrap().is_empty());
        store.insert(&info("b2", 2)).unwrap();
        store.insert(&info("a1", 1)).unwrap();
        let ids: Vec<_> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|t| t.task_id)
            .collect();
        assert_eq!(ids, ["a1", "b2"]);
        let done = store
            .update("a1", |t| t.status = TaskStatus::Completed)
            .unwrap();
        assert!(done.status.is_final());
        assert_eq!(
            serde_json::to_value(done.status).unwrap(),
            done.status.as_str(),
            "the name is the record's"
        );
        assert_eq!(store.get("a1").unwrap().status, TaskStatus::Completed);
        assert_eq!(store.get("nope").unwrap_err().code(), ErrorCode::NotFound);
        assert_eq!(store.get("../x").unwrap_err().code(), ErrorCode::NotFound);
        assert!(workspace_of("a1").starts_with("task-"));
        store.remove("a1").unwrap();
        assert_eq!(store.list().unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn config_reads_the_task_object() {
        let root = std::env::temp_dir().join(format!("ma-taskcfg-{}", new_task_id()));
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(TaskConfig::load(&root).unwrap(), TaskConfig::default());
        std::fs::write(
            root.join(base::host::settings::CONFIG_FILE),
            r#"{"task": {"command": "make", "max_slots": 2, "max_log_bytes": 1000, "mem_mib": 256}, "other": 1}"#,
        )
        .unwrap();
        let c = TaskConfig::load(&root).unwrap();
        assert_eq!((c.command.as_deref(), c.max_slots), (Some("make"), Some(2)));
        assert_eq!(c.task_mem_mib(), 256);
        assert_eq!(TaskConfig::default().task_mem_mib(), service::TASK_MEM_MIB);
        assert_eq!(c.log_cap(), log::MIN_MAX_LOG_BYTES, "a cap has a floor");
        assert_eq!(TaskConfig::default().log_cap(), log::DEFAULT_MAX_LOG_BYTES);
        std::fs::write(
            root.join(base::host::settings::CONFIG_FILE),
            r#"{"task": 3}"#,
        )
        .unwrap();
        assert_eq!(
            TaskConfig::load(&root).unwrap_err().code(),
            ErrorCode::InvalidInput
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
