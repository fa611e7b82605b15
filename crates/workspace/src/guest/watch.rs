//! File watches in a workspace (`dev.watches()`): started by one caller,
//! read from sequence numbers and stopped by any later one (another CLI
//! run, a restarted MCP server), since the guest agent keeps them.

use std::time::Duration;

use guest_agent::protocol as wire;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;

pub use wire::{MAX_WATCHES, MAX_WATCH_DIRS, MAX_WATCH_EVENTS, MAX_WATCH_READ, MAX_WATCH_WAIT};

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Made, or moved in from outside the watch.
    Created,
    /// Its contents were written.
    Modified,
    /// Removed.
    Deleted,
    /// Renamed: `path` where it was, `to` where it went.
    Moved,
    /// Changes from `seq` on were lost (more than the watch keeps).
    Overflow,
    /// A kind this library does not know (a newer agent).
    Other,
}

impl From<wire::WatchEventKind> for ChangeKind {
    fn from(k: wire::WatchEventKind) -> Self {
        match k {
            wire::WatchEventKind::Created => Self::Created,
            wire::WatchEventKind::Modified => Self::Modified,
            wire::WatchEventKind::Deleted => Self::Deleted,
            wire::WatchEventKind::Moved => Self::Moved,
            wire::WatchEventKind::Overflow => Self::Overflow,
            wire::WatchEventKind::Other => Self::Other,
        }
    }
}

/// One change, numbered in its watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct FileChange {
    /// Its number in the watch (from 0, without gaps).
    pub seq: u64,
    /// The guest path (guest data: shown, never used on the host).
    pub path: String,
    /// What happened.
    pub kind: ChangeKind,
    /// Where a moved path went, when still inside the watch.
    pub to: Option<String>,
    /// When the guest saw it, Unix ms (the guest's clock).
    pub at_unix_ms: u64,
}

/// A watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WatchInfo {
    /// Its id (what the other watch calls take).
    pub id: String,
    /// The watched guest path.
    pub path: String,
    /// Whether subdirectories are followed.
    pub recursive: bool,
    /// Directories followed now.
    pub dirs: u32,
    /// The number the next change will get.
    pub next_seq: u64,
    /// Its path was removed or moved away: no more changes come.
    pub ended: bool,
}

impl From<wire::WatchEntry> for WatchInfo {
    fn from(w: wire::WatchEntry) -> Self {
        Self {
            id: w.id,
            path: w.path,
            recursive: w.recursive,
            dirs: w.dirs,
            next_seq: w.next_seq,
            ended: w.ended,
        }
    }
}

/// Changes of a watch from a sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FileChanges {
    /// The watch as of this read.
    pub watch: WatchInfo,
    /// Oldest first; an `overflow` first when some were lost.
    pub changes: Vec<FileChange>,
    /// The `since` to ask for next.
    pub next: u64,
}

/// Whether `id` is an agent's watch id, `watch-N`.
pub fn is_watch_id(id: &str) -> bool {
    id.strip_prefix("watch-")
        .is_some_and(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A workspace's file watches (`dev.watches()`), kept by its guest agent.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceWatches<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's file watches.
    pub fn watches(self) -> WorkspaceWatches<'a> {
        WorkspaceWatches { ws: self }
    }
}

impl WorkspaceWatches<'_> {
    /// Refuses a workspace on a server (not served there yet).
    fn here(self) -> Result<()> {
        if self.ws.remote()?.is_some() {
            return Err(Error::InvalidInput(
                "file watches are not served for workspaces on a server yet".into(),
            ));
        }
        Ok(())
    }

    /// Starts following changes under the guest `path` (a directory, with
    /// `recursive` every directory below it too, or a file).
    pub async fn watch_start(self, path: &str, recursive: bool) -> Result<WatchInfo> {
        self.here()?;
        // An image made before watches has an agent without them: say so,
        // rather than the agent's "unknown request".
        let hello = self
            .ws
            .agent()
            .await?
            .hello()
            .await
            .map_err(Error::agent("hello"))?;
        if !hello.capabilities.iter().any(|c| c == "watch") {
            return Err(Error::InvalidInput(format!(
                "workspace {} runs an image whose agent has no file watches (made before them): rebuild or pull its image again",
                self.ws.name
            )));
        }
        let info: WatchInfo = self
            .ws
            .agent()
            .await?
            .watch_start(path, recursive)
            .await
            .map_err(Error::agent("watch_start"))?
            .into();
        // The id goes into what callers are handed (`WORKSPACE/ID` over
        // MCP): only the agent's own form.
        if !is_watch_id(&info.id) {
            return Err(Error::agent("watch_start")(
                guest_agent::ClientError::Unexpected {
                    got: "a watch id not of the form watch-N".into(),
                },
            ));
        }
        Ok(info)
    }

    /// Changes of watch `id` from `since`, waiting up to `wait` (at most
    /// 10 min) for one when none is there yet.
    pub async fn watch_events(self, id: &str, since: u64, wait: Duration) -> Result<FileChanges> {
        self.here()?;
        let batch = self
            .ws
            .agent()
            .await?
            .watch_events(id, since, wait.min(MAX_WATCH_WAIT))
            .await
            .map_err(Error::agent("watch_events"))?;
        Ok(FileChanges {
            watch: batch.watch.into(),
            changes: batch
                .events
                .into_iter()
                .map(|e| FileChange {
                    seq: e.seq,
                    path: e.path,
                    kind: e.kind.into(),
                    to: e.to,
                    at_unix_ms: e.at_ms,
                })
                .collect(),
            next: batch.next,
        })
    }

    /// Ends watch `id`.
    pub async fn watch_stop(self, id: &str) -> Result<()> {
        self.here()?;
        self.ws
            .agent()
            .await?
            .watch_stop(id)
            .await
            .map_err(Error::agent("watch_stop"))
    }

    /// Its watches, oldest first.
    pub async fn watch_list(self) -> Result<Vec<WatchInfo>> {
        self.here()?;
        let list = self
            .ws
            .agent()
            .await?
            .watch_list()
            .await
            .map_err(Error::agent("watch_list"))?;
        Ok(list.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_own_id_form_is_taken() {
        assert!(is_watch_id("watch-1") && is_watch_id("watch-12345"));
        for bad in [
            "watch-",
            "watch-1/../x",
            "x/watch-1",
            "watch--1",
            "",
            "watch-1a",
        ] {
            assert!(!is_watch_id(bad), "{bad}");
        }
    }

    #[test]
    fn every_kind_the_agent_reports_has_a_name_of_its_own() {
        use wire::WatchEventKind as W;
        let kinds = [
            W::Created,
            W::Modified,
            W::Deleted,
            W::Moved,
            W::Overflow,
            W::Other,
        ];
        let names: Vec<String> = kinds
            .into_iter()
            .map(|k| serde_json::to_string(&ChangeKind::from(k)).unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "\"created\"",
                "\"modified\"",
                "\"deleted\"",
                "\"moved\"",
                "\"overflow\"",
                "\"other\""
            ]
        );
    }
}
