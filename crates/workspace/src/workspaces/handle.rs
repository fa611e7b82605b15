//! [`Workspace`]: one workspace of a [`Workspaces`], its name checked once:
//! everything about one workspace (life cycle, exec, files, processes,
//! snapshots of it, forks, ports, TTL) is a call on it, and the collection
//! keeps the collection's calls (create, list, images, networks, host).
//! It is `Copy`, and its calls take it by value, so a future it returns
//! does not borrow a temporary. Each call is implemented in its concern's
//! file (`guest/exec.rs`, `snapshots/ops.rs`, `workspaces/lifecycle.rs`,
//! ...) as an `impl Workspace<'_>` block.

use crate::error::Result;
use crate::host::settings::now_ms;
use crate::store::name::FullName;
use crate::store::spec::Meta;
use crate::workspaces::manager::{vmm_died, WorkspaceInfo, Workspaces};

/// One workspace, by a full name (`name` or `name.namespace`) that passed
/// the name rules. It may not exist (yet): each call reports `NOT_FOUND`
/// then, as the `Workspaces` call does.
#[derive(Clone, Copy, Debug)]
pub struct Workspace<'a> {
    pub(crate) all: &'a Workspaces,
    pub(crate) name: FullName,
}

impl Workspaces {
    /// The workspace called `name` in this view's namespace (a full name
    /// `name.namespace` in its own), after checking the name rules and,
    /// when it exists and this view is an agent's, that the agent may use
    /// it (FORBIDDEN otherwise).
    ///
    /// ```no_run
    /// # async fn demo() -> workspace::Result<()> {
    /// let all = workspace::Workspaces::from_env()?;
    /// let dev = all.workspace("dev")?;
    /// let out = dev
    ///     .exec_collect(workspace::ExecRequest::argv(["uname", "-a"]), workspace::ExecInput::None)
    ///     .await?;
    /// print!("{}", out.stdout);
    /// # Ok(())
    /// # }
    /// ```
    pub fn workspace(&self, name: &str) -> Result<Workspace<'_>> {
        let full = self.full_name(name)?;
        let name = FullName::new(&full).map_err(crate::store::StoreError::Name)?;
        if self.caller.is_some() {
            match self.dir(&name)?.read_meta() {
                Ok(meta) => self.check_access("workspace", &name, &meta.spec)?,
                // Not here: on a server, whose owner was recorded here.
                Err(crate::store::workspace_dir::WorkspaceDirError::NotFound(_)) => {
                    self.placement_of(name.as_str())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Workspace { all: self, name })
    }

    /// The workspace's directory and record, if it is running (what every
    /// call that reaches its guest needs first).
    pub(crate) fn running(
        &self,
        name: &str,
    ) -> Result<(crate::store::workspace_dir::WorkspaceDir, Meta)> {
        let meta = self.at(name).get_here()?;
        if meta.state != crate::store::state::State::Running {
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
    /// Reads a workspace, first recording a crash if its VMM died.
    pub fn get(self) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            let info: WorkspaceInfo =
                remote.call_blocking(crate::servers::WorkspaceCall::Inspect {})?;
            return Ok(info.meta);
        }
        self.get_here()
    }

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
            let reason = match crate::vmm::confinement::seccomp_violation(&ws) {
                Some(what) => {
                    format!("its VMM process {pid} was killed by its seccomp filter: {what}")
                }
                None => format!("its VMM process {pid} died unexpectedly (killed or crashed)"),
            };
            crate::host::cgroup::remove_recorded(ws.path());
            ws.record_exit(&mut meta, true, &reason)?;
        }
        Ok(meta)
    }
}

impl Workspace<'_> {
    /// The record plus ages, disk use, its network as it is now and,
    /// while it runs on the `user` network, its egress refusals.
    pub fn inspect(self) -> Result<WorkspaceInfo> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::Inspect {})?);
        }
        let (all, name) = (self.all, self.name.as_str());
        let meta = self.get_here()?;
        // A VMM that does not answer leaves the rest to show.
        let refused = match meta.state.has_vmm() {
            true => self.egress_denials().unwrap_or_else(|e| {
                tracing::warn!(workspace = name, "no egress refusals: {e}");
                None
            }),
            false => None,
        };
        let ws = all.dir(name)?;
        let now = now_ms();
        let disk_used_bytes = std::fs::metadata(ws.disk())
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        Ok(WorkspaceInfo {
            age_ms: now.saturating_sub(meta.created_at_ms),
            uptime_ms: meta
                .runtime
                .as_ref()
                .map(|r| now.saturating_sub(r.started_at_ms)),
            dir: ws.path().to_owned(),
            disk_used_bytes,
            network: all.networks().guest(&meta),
            refused,
            meta,
        })
    }
}
