//! Inputs and outputs of the background-process tools: process_start,
//! process_list, process_output, process_write_stdin, process_signal,
//! process_wait.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::ProcessInfo;

use super::exec::CommandArg;
use crate::output::Render;
use workspace::guest::copy::human_bytes;

/// Default bytes of each stream one process_output call returns.
pub const DEFAULT_READ_BYTES: u64 = 64 << 10;
/// Most bytes of each stream one process_output call returns.
pub const MAX_READ_BYTES: u64 = 4 << 20;
/// Longest `wait_secs` of process_output.
pub const MAX_OUTPUT_WAIT_SECS: u64 = 300;
/// Default `timeout_secs` of process_wait.
pub const DEFAULT_WAIT_SECS: u64 = 30;
/// Longest `timeout_secs` of process_wait.
pub const MAX_WAIT_SECS: u64 = 3600;

/// `process_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartParams {
    /// Workspace name (running).
    pub name: String,
    /// Program and arguments, e.g. ["python3", "-m", "http.server", "8000"];
    /// a single string is run as `shell` is. Give this or `shell`.
    pub command: Option<CommandArg>,
    /// A command line run with /bin/sh -c, e.g. "npm run dev > /tmp/dev.log
    /// 2>&1". Give this or `command`.
    pub shell: Option<String>,
    /// Extra environment variables (over the workspace's own).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of secrets given to the command as environment variables of
    /// the same name (set on the host with `microagent secret set NAME`;
    /// each must be allowed with `serve mcp --allow-secret NAME`, else
    /// FORBIDDEN). Their values are never returned: output shows `***`.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Working directory in the guest (absolute); default: the image's,
    /// else /.
    pub cwd: Option<String>,
    /// Run as this user: a name the guest's /etc/passwd lists (`root`,
    /// `node`), a uid, or `user:group`; default: the image's user, else
    /// root.
    #[serde(default)]
    pub user: Option<String>,
    /// Keep the process's stdin open for process_write_stdin; default false
    /// (it reads /dev/null).
    #[serde(default)]
    pub stdin: bool,
    /// Kill it after this many seconds, 1 to 86400; default: no limit.
    #[schemars(range(min = 1, max = crate::schema::exec::MAX_EXEC_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Bytes of each output stream kept in the guest, 0 to 16777216;
    /// default 1048576. Older output is dropped (process_output reports how
    /// much).
    #[schemars(range(min = 0, max = workspace::guest::MAX_PROCESS_RING))]
    pub ring_bytes: Option<u64>,
}

/// `process_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessListParams {
    /// Workspace name (running).
    pub name: String,
}

/// `process_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutputParams {
    /// Workspace name (running).
    pub name: String,
    /// Process id (from process_start or process_list).
    pub id: String,
    /// First stdout byte wanted: 0 for the start, or the previous call's
    /// `stdout_cursor`.
    #[serde(default)]
    pub stdout_cursor: u64,
    /// First stderr byte wanted: 0, or the previous call's `stderr_cursor`.
    #[serde(default)]
    pub stderr_cursor: u64,
    /// Wait up to this many seconds for new output (or the exit) when
    /// there is none yet, 0 to 300; default 0.
    #[schemars(range(min = 0, max = MAX_OUTPUT_WAIT_SECS))]
    pub wait_secs: Option<u64>,
    /// Bytes of each stream returned, 1 to 4194304; default 65536. Call
    /// again from the returned cursors for the rest.
    #[schemars(range(min = 1, max = MAX_READ_BYTES))]
    pub max_bytes: Option<u64>,
}

/// `process_write_stdin`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStdinParams {
    /// Workspace name (running).
    pub name: String,
    /// Process id (started with stdin true).
    pub id: String,
    /// Text to write (no newline is added).
    #[serde(default)]
    pub data: String,
    /// Close stdin afterwards (the process reads end of file).
    #[serde(default)]
    pub close: bool,
}

/// `process_signal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignalParams {
    /// Workspace name (running).
    pub name: String,
    /// Process id.
    pub id: String,
    /// Signal name or number: TERM (default), KILL, INT, HUP, 9, ...
    pub signal: Option<String>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `process_wait`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessWaitParams {
    /// Workspace name (running).
    pub name: String,
    /// Process id.
    pub id: String,
    /// Seconds to wait for the exit, 0 to 3600; default 30. The answer
    /// says `running` when it has not exited by then.
    #[schemars(range(min = 0, max = MAX_WAIT_SECS))]
    pub timeout_secs: Option<u64>,
}

/// One process (process_start, process_wait).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessResult {
    /// The workspace.
    pub workspace: String,
    /// The process.
    #[serde(flatten)]
    pub process: ProcessInfo,
}

impl Render for ProcessResult {
    fn render(&self) -> String {
        let p = &self.process;
        format!(
            "process {} (pid {}) in {}: {}; `{}`; {} of stdout, {} of stderr",
            p.id,
            p.pid,
            self.workspace,
            p.status(),
            p.command,
            human_bytes(p.stdout_bytes),
            human_bytes(p.stderr_bytes)
        )
    }
}

/// `process_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessListResult {
    /// The workspace.
    pub workspace: String,
    /// Its background processes, oldest first.
    pub processes: Vec<ProcessInfo>,
}

impl Render for ProcessListResult {
    fn render(&self) -> String {
        if self.processes.is_empty() {
            return format!("{} has no background processes", self.workspace);
        }
        self.processes
            .iter()
            .map(|p| format!("{} pid {} {}: `{}`", p.id, p.pid, p.status(), p.command))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `process_output`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessOutputResult {
    /// The workspace.
    pub workspace: String,
    /// The process as of this read.
    pub process: ProcessInfo,
    /// Stdout from the cursor asked for (invalid UTF-8 replaced).
    pub stdout: String,
    /// Stderr from the cursor asked for (invalid UTF-8 replaced).
    pub stderr: String,
    /// The stdout_cursor for the next call.
    pub stdout_cursor: u64,
    /// The stderr_cursor for the next call.
    pub stderr_cursor: u64,
    /// Stdout bytes no longer kept between the cursor asked for and what
    /// is returned (the ring overflowed).
    pub stdout_dropped: u64,
    /// Stderr bytes no longer kept.
    pub stderr_dropped: u64,
    /// The process exited and both streams are closed: nothing more will
    /// come.
    pub finished: bool,
}

impl Render for ProcessOutputResult {
    fn render(&self) -> String {
        let mut text = format!(
            "process {} {} (next: stdout_cursor {}, stderr_cursor {})",
            self.process.id,
            self.process.status(),
            self.stdout_cursor,
            self.stderr_cursor
        );
        if self.stdout_dropped + self.stderr_dropped > 0 {
            text.push_str(&format!(
                "; {} of stdout and {} of stderr were no longer kept",
                human_bytes(self.stdout_dropped),
                human_bytes(self.stderr_dropped)
            ));
        }
        for (what, out) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !out.is_empty() {
                text.push_str(&format!("\n--- {what}\n{out}"));
            }
        }
        text
    }
}

/// `process_write_stdin`, `process_signal`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessActionResult {
    /// The workspace.
    pub workspace: String,
    /// The process.
    pub id: String,
    /// What was done (or, for a preview, would be).
    pub action: String,
    /// Only a preview: nothing was done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preview: bool,
}

impl Render for ProcessActionResult {
    fn render(&self) -> String {
        format!("process {} in {}: {}", self.id, self.workspace, self.action)
    }
}
