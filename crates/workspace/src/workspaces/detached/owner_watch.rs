//! Workspaces that go with their owner (an MCP session's, `delete_with_owner`)
//! are deleted within seconds of the owner's end even when it was killed
//! outright and could not delete them itself: a detached watcher (`serve
//! watch-owner PID TICKS`, started once per owner process) waits on the
//! owner's pidfd and then deletes them, as a listing would.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::workspaces::manager::{ListFilter, Workspaces};
use base::store::spec::Owner;

/// The subcommand words the watcher runs as, before PID and TICKS.
pub const WATCH_OWNER_SUBCOMMAND: [&str; 2] = ["serve", "watch-owner"];

/// Where watchers log, in the state directory.
const WATCH_LOG: &str = "owner-watch.log";

impl Workspaces {
    /// Makes sure a watcher deletes this process's `delete_with_owner`
    /// workspaces once it ends, however it ends (started once per process).
    pub fn watch_this_process(&self) -> Result<()> {
        static WATCHER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
        let started = WATCHER.get_or_init(|| {
            let me = Owner::this_process().ok_or("this process's start time is unknown")?;
            let args: Vec<String> = WATCH_OWNER_SUBCOMMAND
                .iter()
                .map(|a| a.to_string())
                .chain([me.pid.to_string(), me.start_ticks.to_string()])
                .collect();
            let log = self.state.root().join(WATCH_LOG);
            self.spawn_detached(&args, &log)
                .map(drop)
                .map_err(|e| e.full_message())
        });
        started
            .clone()
            .map_err(|why| Error::InvalidInput(format!("cannot watch this process: {why}")))
    }

    /// What the watcher does: waits for `owner` to end, then deletes the
    /// workspaces that were to go with it (and any other whose owner has
    /// ended); the names of its own that went. Returns at once when
    /// `owner` has ended already.
    pub fn delete_when_ended(&self, owner: Owner) -> Result<Vec<String>> {
        if let Some(fd) = base::store::process::pidfd(owner.pid, owner.start_ticks) {
            // A failed wait sweeps now rather than never.
            base::store::process::wait_for_end(&fd);
        }
        let theirs: Vec<String> = self
            .state
            .list_workspaces()?
            .into_iter()
            .filter(|name| {
                self.at(name)
                    .get()
                    .is_ok_and(|m| m.spec.delete_with_owner && m.spec.owner == Some(owner))
            })
            .collect();
        // The listing deletes the orphans it meets.
        self.list_everywhere(&ListFilter::default())?;
        Ok(theirs
            .into_iter()
            .filter(|name| self.at(name).get().is_err())
            .collect())
    }
}
