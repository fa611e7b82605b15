//! Inputs and outputs of the file-watch tools: file_watch,
//! file_watch_events, file_unwatch.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::guest::{ChangeKind, FileChange};

use crate::output::Render;

/// Longest `timeout_ms` of file_watch_events.
pub const MAX_EVENTS_WAIT_MS: u64 = 300_000;

/// `file_watch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileWatchParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute guest path: a directory (its entries' changes) or a file.
    pub path: String,
    /// Follow every directory below `path` too, those made later
    /// included; default false.
    #[serde(default)]
    pub recursive: bool,
}

/// `file_watch_events`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileWatchEventsParams {
    /// The watch, as file_watch returned it (`WORKSPACE/watch-N`).
    #[schemars(length(max = 200))]
    pub watch: String,
    /// The first event number wanted: 0, then the `next` of the previous
    /// call; default 0.
    #[serde(default)]
    pub since: u64,
    /// Wait up to this many milliseconds (0-300000) for an event when none
    /// is there yet; default 0.
    #[schemars(range(max = MAX_EVENTS_WAIT_MS))]
    pub timeout_ms: Option<u64>,
}

/// `file_unwatch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileUnwatchParams {
    /// The watch, as file_watch returned it.
    #[schemars(length(max = 200))]
    pub watch: String,
}

/// The result of `file_watch`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileWatchResult {
    /// The workspace.
    pub workspace: String,
    /// The watch: what file_watch_events and file_unwatch take.
    pub watch: String,
    /// The watched guest path.
    pub path: String,
    /// Whether subdirectories are followed.
    pub recursive: bool,
    /// Directories followed now.
    pub dirs: u32,
}

impl Render for FileWatchResult {
    fn render(&self) -> String {
        let below = if self.recursive {
            format!(" and below ({} directories)", self.dirs)
        } else {
            String::new()
        };
        format!(
            "watching {}{below} in {}: watch {}",
            self.path, self.workspace, self.watch
        )
    }
}

/// The result of `file_watch_events`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileWatchEventsResult {
    /// The watch.
    pub watch: String,
    /// Changes from `since`, oldest first: `kind` is created, modified,
    /// deleted, moved (`path` where it was, `to` where it went) or
    /// overflow (changes from `seq` on were lost).
    pub events: Vec<FileChange>,
    /// The `since` to ask for next.
    pub next: u64,
    /// The watched path was removed or moved away: no more events come.
    pub ended: bool,
}

impl Render for FileWatchEventsResult {
    fn render(&self) -> String {
        let mut lines: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                let kind = match e.kind {
                    ChangeKind::Created => "created",
                    ChangeKind::Modified => "modified",
                    ChangeKind::Deleted => "deleted",
                    ChangeKind::Moved => "moved",
                    ChangeKind::Overflow => "overflow (events lost)",
                    ChangeKind::Other => "changed",
                };
                match &e.to {
                    Some(to) => format!("{} {kind} {} -> {to}", e.seq, e.path),
                    None => format!("{} {kind} {}", e.seq, e.path),
                }
            })
            .collect();
        if lines.is_empty() {
            lines.push("no new events".into());
        }
        lines.push(format!(
            "next: {}{}",
            self.next,
            if self.ended {
                " (the watch has ended)"
            } else {
                ""
            }
        ));
        lines.join("\n")
    }
}

/// The result of `file_unwatch`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileUnwatchResult {
    /// The watch that ended.
    pub watch: String,
}

impl Render for FileUnwatchResult {
    fn render(&self) -> String {
        format!("stopped watch {}", self.watch)
    }
}
