//! Inputs and outputs of the life-cycle tools: create, start, stop, halt,
//! delete, list, inspect, logs, events.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::events::{Event, EventKind};

use super::{StateName, WorkspaceView};
use crate::output::{bytes, Render};

/// Default seconds `workspace_start` waits for the boot.
pub const DEFAULT_START_TIMEOUT_SECS: u64 = 300;
/// Longest `workspace_start` wait.
pub const MAX_START_TIMEOUT_SECS: u64 = 3600;
/// Default seconds `workspace_stop` gives the guest.
pub const DEFAULT_STOP_TIMEOUT_SECS: u64 = 30;
/// Longest `workspace_stop` grace period.
pub const MAX_STOP_TIMEOUT_SECS: u64 = 600;
/// Default console lines of `workspace_logs`.
pub const DEFAULT_LOG_LINES: usize = 100;
/// Most console lines of one `workspace_logs` call.
pub const MAX_LOG_LINES: usize = 5000;

/// `workspace_create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// Workspace name: 1-63 of a-z, 0-9 and '-', starting with a letter and
    /// not ending with '-'.
    pub name: String,
    /// Image to boot (see `image_list`); default `minimal` (busybox). Use
    /// `debian` for Python, apt and a full userland.
    pub image: Option<String>,
    /// vCPUs, 1 to 8; default 1.
    pub vcpus: Option<u32>,
    /// Guest memory in MiB, 64 to 16384; default 256.
    pub mem_mib: Option<u64>,
    /// Writable disk in MiB, 64 to 1048576; default 1024. Sparse: only what
    /// the guest writes uses host disk.
    pub disk_mib: Option<u64>,
    /// Environment variables added to every command run in it (at most 64;
    /// keys of letters, digits and _ . - /).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels for `workspace_list` filters (at most 64).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Stop it this many seconds after each start (1 to 2592000); default:
    /// no TTL.
    pub ttl_secs: Option<u64>,
}

/// Inputs that only name a workspace.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    /// Workspace name.
    pub name: String,
}

/// `workspace_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartParams {
    /// Workspace name (stopped or crashed).
    pub name: String,
    /// Seconds to wait for the guest agent to answer, 1 to 3600; default
    /// 300. On timeout the VM is halted.
    pub timeout_secs: Option<u64>,
}

/// `workspace_stop`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    /// Workspace name.
    pub name: String,
    /// Seconds the guest gets to shut down cleanly before the VM is torn
    /// down, 1 to 600; default 30.
    pub timeout_secs: Option<u64>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_halt`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HaltParams {
    /// Workspace name.
    pub name: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// Workspace name.
    pub name: String,
    /// Halt it first if it is running (else a running workspace is refused
    /// with CONFLICT).
    #[serde(default)]
    pub force: bool,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only workspaces in this state.
    pub state: Option<StateName>,
    /// Only workspaces of this image.
    pub image: Option<String>,
    /// Only workspaces that have all these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `workspace_logs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    /// Workspace name.
    pub name: String,
    /// The last this many console lines, 1 to 5000; default 100.
    pub lines: Option<usize>,
}

/// `workspace_events`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsParams {
    /// Workspace name.
    pub name: String,
    /// Only events after this sequence number (the `next_after` of the
    /// previous call); default 0, all events.
    #[serde(default)]
    pub after: u64,
    /// When there is no such event yet, wait up to this many seconds for
    /// one, 0 to 600; default 0.
    #[serde(default)]
    pub wait_secs: u64,
}

/// A change to a workspace (stop, halt), done or previewed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The workspace afterwards (before, for a preview).
    pub workspace: WorkspaceView,
}

impl Render for ChangeResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!("{tag}{}\n{}", self.action, self.workspace.render())
    }
}

/// `workspace_delete`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DeleteResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The workspace as it was before the delete.
    pub workspace: WorkspaceView,
    /// Host disk bytes its files used (freed by the delete).
    pub disk_used_bytes: u64,
}

impl Render for DeleteResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!(
            "{tag}{} ({} of host disk)",
            self.action,
            bytes(self.disk_used_bytes)
        )
    }
}

/// `workspace_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    /// How many matched.
    pub count: usize,
    /// The matching workspaces, by name.
    pub workspaces: Vec<WorkspaceView>,
}

impl Render for ListResult {
    fn render(&self) -> String {
        if self.workspaces.is_empty() {
            return "no workspaces".into();
        }
        self.workspaces
            .iter()
            .map(Render::render)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `workspace_inspect`'s result: the record plus what is known live.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InspectResult {
    /// The record.
    #[serde(flatten)]
    pub workspace: WorkspaceView,
    /// Its directory on the host.
    pub dir: PathBuf,
    /// Milliseconds since creation.
    pub age_ms: u64,
    /// Milliseconds since the current run started.
    pub uptime_ms: Option<u64>,
    /// Host bytes its writable disk uses.
    pub disk_used_bytes: u64,
}

impl Render for InspectResult {
    fn render(&self) -> String {
        let mut text = self.workspace.render();
        text.push_str(&format!(
            "\nage {} s, disk uses {}",
            self.age_ms / 1000,
            bytes(self.disk_used_bytes)
        ));
        if let Some(up) = self.uptime_ms {
            text.push_str(&format!(", up {} s", up / 1000));
        }
        text
    }
}

/// `workspace_logs`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LogsResult {
    /// The workspace.
    pub name: String,
    /// Serial console lines, oldest first.
    pub lines: Vec<String>,
}

impl Render for LogsResult {
    fn render(&self) -> String {
        if self.lines.is_empty() {
            format!("{}: the console log is empty", self.name)
        } else {
            self.lines.join("\n")
        }
    }
}

/// One logged event.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EventView {
    /// Sequence number: 1, 2, 3, ... in order.
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// created, started, exec_started, exec_finished, stopped, crashed or
    /// ttl_expired.
    pub kind: String,
    /// The exec (exec_started, exec_finished).
    pub exec_id: Option<String>,
    /// What ran (exec_started).
    pub command: Option<String>,
    /// Exit code (exec_finished, when it exited).
    pub code: Option<i32>,
    /// Signal number (exec_finished, when a signal ended it).
    pub signal: Option<i32>,
    /// Why (crashed).
    pub reason: Option<String>,
}

impl From<Event> for EventView {
    fn from(e: Event) -> Self {
        let mut view = EventView {
            seq: e.seq,
            at_ms: e.at_ms,
            kind: String::new(),
            exec_id: None,
            command: None,
            code: None,
            signal: None,
            reason: None,
        };
        view.kind = match e.kind {
            EventKind::Created => "created",
            EventKind::Started => "started",
            EventKind::ExecStarted { exec_id, command } => {
                view.exec_id = Some(exec_id);
                view.command = Some(command);
                "exec_started"
            }
            EventKind::ExecFinished {
                exec_id,
                code,
                signal,
            } => {
                view.exec_id = Some(exec_id);
                view.code = code;
                view.signal = signal;
                "exec_finished"
            }
            EventKind::Stopped => "stopped",
            EventKind::Crashed { reason } => {
                view.reason = Some(reason);
                "crashed"
            }
            EventKind::TtlExpired => "ttl_expired",
        }
        .into();
        view
    }
}

/// `workspace_events`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EventsResult {
    /// The events after `after`, oldest first (empty when the wait ran out).
    pub events: Vec<EventView>,
    /// Pass this as `after` next time to get only newer events.
    pub next_after: u64,
}

impl Render for EventsResult {
    fn render(&self) -> String {
        if self.events.is_empty() {
            return format!("no new events (next_after {})", self.next_after);
        }
        self.events
            .iter()
            .map(|e| {
                let mut line = format!("#{} {}", e.seq, e.kind);
                if let Some(c) = &e.command {
                    line.push_str(&format!(" `{c}`"));
                }
                if let Some(c) = e.code {
                    line.push_str(&format!(" exit {c}"));
                }
                if let Some(s) = e.signal {
                    line.push_str(&format!(" signal {s}"));
                }
                if let Some(r) = &e.reason {
                    line.push_str(&format!(": {r}"));
                }
                line
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
