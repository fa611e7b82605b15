//! [`Workspace`]: one workspace of a [`Workspaces`], its name checked once
//! (`Workspaces::workspace`, with where it lives, in `placement`):
//! everything about one workspace (life cycle, exec, files, processes,
//! snapshots of it, forks, ports, TTL) is a call on it, and the collection
//! keeps the collection's calls (create, list, images, networks, host).
//! It is `Copy`, and its calls take it by value, so a future it returns
//! does not borrow a temporary. Each call is implemented in its concern's
//! file (`guest/exec.rs`, `snapshots/ops.rs`, `workspaces/lifecycle.rs`,
//! ...) as an `impl Workspace<'_>` block.

use crate::error::Result;
use crate::workspaces::manager::{vmm_died, Workspaces};
use base::store::name::FullName;
use base::store::spec::Meta;

/// One workspace, by a full name (`name` or `name.namespace`) that passed
/// the name rules. It may not exist (yet): each call reports `NOT_FOUND`
/// then, as the `Workspaces` call does.
#[derive(Clone, Copy, Debug)]
pub struct Workspace<'a> {
    pub(crate) all: &'a Workspaces,
    pub(crate) name: FullName,
}

impl Workspaces {
    /// The workspace's directory and record, if it is running (what every
    /// call that reaches its guest needs first).
    pub(crate) fn running(
        &self,
        name: &str,
    ) -> Result<(base::store::workspace_dir::WorkspaceDir, Meta)> {
        let meta = self.at(name).get_here()?;
        if meta.state != base::store::state::State::Running {
            return Err(crate::error::Error::NotRunning {
                name: name.to_owned(),
                state: meta.state,
            });
        }
        Ok((self.dir(name)?, meta))
    }

    /// The workspace with full name `name`, unchecked, for the crate's own
    /// calls on a name it already holds.
    pub(crate) fn at(&self, name: &str) -> Workspace<'_> {
        Workspace {
            all: self,
            name: FullName::held(name),
        }
    }
}

impl Workspace<'_> {
    /// Its full name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }
}

impl Workspace<'_> {
    /// [`Self::get`] of a workspace known to live here (its placement
    /// already looked up, or none possible): its record read once, with no
    /// second look for a placement.
    pub(crate) fn get_here(self) -> Result<Meta> {
        let (all, name) = (self.all, self.name.as_str());
        let ws = all.dir(name)?;
        let meta = ws.read_meta()?;
        if !vmm_died(&meta) {
            return Ok(meta);
        }
        let (_lock, mut meta) = all.lock_existing(name)?;
        if vmm_died(&meta) {
            let pid = meta.runtime.as_ref().map_or(0, |r| r.pid);
            let reason = match base::vmm::confinement::seccomp_violation(&ws) {
                Some(what) => {
                    format!("its VMM process {pid} was killed by its seccomp filter: {what}")
                }
                None => format!("its VMM process {pid} died unexpectedly (killed or crashed)"),
            };
            base::host::cgroup::remove_recorded(ws.path());
            ws.record_exit(&mut meta, true, &reason)?;
        }
        Ok(meta)
    }
}
