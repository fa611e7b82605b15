//! Whether this process is the one its workspace's record names. Without
//! its starter's ticket nothing is touched before the record says so; with
//! it (the starter holds the workspace's lock and vouches for the launch)
//! the guest runs first and the record, which the starter writes with its
//! fsyncs, is confirmed before the workspace counts as running.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use base::store::spec::Meta;
use base::store::state::State;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;

use super::Shared;
use crate::error::{Result, VmmProcessError};

/// The workspace's record, once it says this process was started for it
/// (read under the workspace's lock).
pub(super) fn started_for_it(state: &StateDir, ws: &WorkspaceDir) -> Result<Meta> {
    let meta = {
        let _lock = state.lock_workspace(ws.name())?;
        ws.read_meta()?
    };
    if names_this_process(&meta) {
        return Ok(meta);
    }
    Err(VmmProcessError::NotStartedForIt {
        name: ws.name().to_owned(),
        state: meta.state,
    })
}

/// Whether `meta` says this process was started for its workspace.
fn names_this_process(meta: &Meta) -> bool {
    meta.state == State::Starting && runs_in_this_process(meta)
}

/// Whether `meta`'s run is this process's.
pub(super) fn runs_in_this_process(meta: &Meta) -> bool {
    meta.runtime
        .as_ref()
        .is_some_and(|rt| rt.pid == base::host::settings::own_pid())
}

/// Confirms the record of a ticketed launch, whose guest already runs:
/// read unlocked first (it is replaced atomically, and a start never
/// begins from `Starting`, so a record naming this process is the new
/// one), else under the lock, which the starter holds until it has
/// written it. Then the ticket goes and the record's TTL counts. A record
/// that names another process stops the guest and is left as it is:
/// false.
pub(super) fn confirm(shared: &Arc<Shared>) -> bool {
    let recorded = shared.ws.read_meta().ok().filter(names_this_process);
    let meta = match recorded.map_or_else(|| started_for_it(&shared.state, &shared.ws), Ok) {
        Ok(meta) => meta,
        Err(e) => {
            tracing::error!(
                error = %base::error_chain::error_chain(&e),
                "the workspace's record does not name this process: its guest stops, the record is left as it is"
            );
            shared.finished.store(true, Ordering::SeqCst);
            shared.tear_down();
            return false;
        }
    };
    shared.ws.remove_launch_ticket();
    if let Some(at) = meta.runtime.and_then(|rt| rt.ttl_deadline_ms) {
        let mut deadline = shared
            .ttl_deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // A TTL set through the control socket meanwhile is the newer one.
        deadline.get_or_insert(at);
        shared.ttl_changed.notify_all();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::store::spec::{Runtime, WorkspaceSpec};

    #[test]
    fn only_a_starting_record_of_this_process_names_it() {
        let own = base::host::settings::own_pid();
        let mut meta = Meta::created("w", WorkspaceSpec::default(), false);
        assert!(!names_this_process(&meta), "a record with no run");
        meta.state = State::Starting;
        meta.runtime = Some(Runtime::launched(own, 1, 0, None));
        assert!(names_this_process(&meta));
        meta.state = State::Running;
        assert!(!names_this_process(&meta), "a start never begins there");
        assert!(runs_in_this_process(&meta), "its run is this process's");
        meta.state = State::Starting;
        meta.runtime = Some(Runtime::launched(own.wrapping_add(1), 1, 0, None));
        assert!(!names_this_process(&meta), "another process's start");
        assert!(!runs_in_this_process(&meta));
    }
}
