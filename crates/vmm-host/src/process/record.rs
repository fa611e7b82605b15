//! Whether this process is the one its workspace's record names, checked
//! before its guest runs (and, without the starter's ticket, before
//! anything is touched).

use base::store::spec::Meta;
use base::store::state::State;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;

use crate::error::{Result, VmmProcessError};

/// The workspace's record, once it says this process was started for it.
/// With the starter's ticket (`ticketed`) it is read unlocked first: it is
/// replaced atomically and a start never begins from `Starting`, so a
/// record naming this process is the starter's, which is most often
/// written before the starter lets its lock go (after syncing the
/// directory). Otherwise, and while it does not name it yet, it is read
/// under the workspace's lock, which the starter holds until it is
/// written.
pub(super) fn started_for_it(state: &StateDir, ws: &WorkspaceDir, ticketed: bool) -> Result<Meta> {
    if let Some(meta) = ticketed
        .then(|| ws.read_meta().ok())
        .flatten()
        .filter(names_this_process)
    {
        return Ok(meta);
    }
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
    meta.state == State::Starting
        && meta
            .runtime
            .as_ref()
            .is_some_and(|rt| rt.pid == base::host::settings::own_pid())
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
        meta.state = State::Starting;
        meta.runtime = Some(Runtime::launched(own.wrapping_add(1), 1, 0, None));
        assert!(!names_this_process(&meta), "another process's start");
    }
}
