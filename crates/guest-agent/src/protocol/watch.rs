//! File watches: the agent follows changes under a path (inotify) and
//! keeps them, numbered, for any later connection to read, as it keeps a
//! background process's output.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most watches an agent keeps at once.
pub const MAX_WATCHES: usize = 16;
/// Most directories one recursive watch follows.
pub const MAX_WATCH_DIRS: usize = 4096;
/// Most events one watch keeps; older ones give way (read as `overflow`).
pub const MAX_WATCH_EVENTS: usize = 1024;
/// Most events one `watch_events` answer carries.
pub const MAX_WATCH_READ: usize = 256;
/// Longest `watch_events` wait.
pub const MAX_WATCH_WAIT: Duration = Duration::from_secs(600);

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    /// Made, or moved in from outside the watch.
    Created,
    /// Its contents were written.
    Modified,
    /// Removed.
    Deleted,
    /// Renamed: `path` is where it was, `to` where it went (absent when
    /// it went outside the watch).
    Moved,
    /// Events were lost from `seq` on (the watch kept at most
    /// [`MAX_WATCH_EVENTS`], or the kernel's queue overflowed).
    Overflow,
    /// A kind a newer agent reports.
    #[serde(other)]
    Other,
}

/// One change, numbered in its watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Its number in the watch (from 0, without gaps).
    pub seq: u64,
    /// The absolute path (a name that is not UTF-8 is shown lossily).
    pub path: String,
    /// What happened.
    pub kind: WatchEventKind,
    /// Where a `moved` path went, when it is still inside the watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// When the agent saw it, ms since the Unix epoch (guest clock).
    pub at_ms: u64,
}

/// A watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEntry {
    /// Its id (`watch-N`).
    pub id: String,
    /// The watched path.
    pub path: String,
    /// Whether subdirectories are followed (those made later too).
    pub recursive: bool,
    /// Directories followed now.
    pub dirs: u32,
    /// The number the next event will get.
    pub next_seq: u64,
    /// Whether it has ended (its path was removed or moved away).
    pub ended: bool,
}

/// A `watch_events` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchBatch {
    /// The watch.
    pub watch: WatchEntry,
    /// Events from the `since` asked for, oldest first; an `overflow`
    /// first when some of those were lost.
    pub events: Vec<WatchEvent>,
    /// The `since` to ask for next.
    pub next: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_use_the_documented_json() {
        let moved = WatchEvent {
            seq: 3,
            path: "/w/a".into(),
            kind: WatchEventKind::Moved,
            to: Some("/w/b".into()),
            at_ms: 7,
        };
        assert_eq!(
            serde_json::to_string(&moved).unwrap(),
            r#"{"seq":3,"path":"/w/a","kind":"moved","to":"/w/b","at_ms":7}"#
        );
        let newer: WatchEvent =
            serde_json::from_str(r#"{"seq":1,"path":"/w","kind":"attrib","at_ms":1}"#).unwrap();
        assert_eq!((newer.kind, newer.to), (WatchEventKind::Other, None));
    }
}
