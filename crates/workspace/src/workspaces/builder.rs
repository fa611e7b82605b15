//! [`WorkspacesBuilder`]: how a program opens a state directory, with every
//! choice defaulted (state in `$MICROAGENT_HOME` or `~/.microagent`, guest
//! assets from `cargo xtask`'s cache, this executable as the VMM program).

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::workspaces::manager::Workspaces;
use base::host::settings::asset_dir;
use base::store::spec::{Limits, LIMITS};
use base::store::StateDir;

/// Builds a [`Workspaces`]; see [`Workspaces::builder`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct WorkspacesBuilder {
    state_dir: Option<PathBuf>,
    assets: Option<Option<PathBuf>>,
    vmm_program: Option<PathBuf>,
    standby_vmms: bool,
    task_program: Option<PathBuf>,
    limits: Option<Limits>,
    warm_dir: Option<PathBuf>,
}

impl WorkspacesBuilder {
    /// Keeps workspaces, images and snapshots in `dir` (created if needed).
    /// Default: `$MICROAGENT_HOME`, else `~/.microagent`.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Imports built images (kernel + root filesystem) from `dir` on first
    /// use, or from nowhere with `None`. Default: the `current/` directory
    /// of the asset cache (`$MICROAGENT_CACHE` or `~/.cache/microagent`).
    pub fn assets(mut self, dir: Option<PathBuf>) -> Self {
        self.assets = Some(dir);
        self
    }

    /// Runs each workspace's VMM process as `program` with the arguments of
    /// [`base::vmm::launch::VmmLaunch`]. Default: this executable, which must
    /// then run `vmm_host::VmmProcess` (crates/vmm-host) when given those arguments
    /// (the `microagent` binary does).
    pub fn vmm_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.vmm_program = Some(program.into());
        self
    }

    /// Says that the VMM program also runs a standby VMM process when
    /// given the arguments of `base::vmm::standby::standby_args` (it calls
    /// `vmm_host::standby::wait_for_claim`, as `microagent-vmm` does):
    /// restores are then handed to standbys made ahead when the state
    /// directory's `config.json` keeps them (`{"standby": {"count": N}}`).
    /// Default: off, whatever `config.json` says.
    pub fn standby_vmms(mut self, runs_them: bool) -> Self {
        self.standby_vmms = runs_them;
        self
    }

    /// Runs task supervisors as `program` with the arguments of
    /// [`crate::tasks::SUPERVISE_SUBCOMMAND`] and a task id. Default: this
    /// executable, which must then call [`Tasks::supervise`](crate::Tasks::supervise) when
    /// given those arguments (the `microagent` binary does).
    pub fn task_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.task_program = Some(program.into());
        self
    }

    /// Refuses to create workspaces beyond `limits` (vCPUs, memory, disk,
    /// TTL, entries), which may only tighten this build's [`LIMITS`].
    /// Default: [`LIMITS`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Keeps warm snapshots in `dir` (private to this user) instead of the
    /// state directory's `warm/`, so several state directories share them
    /// (a snapshot is used only with the very image files it was taken
    /// with). Default: `$MICROAGENT_WARM_DIR`, else `warm/`.
    pub fn warm_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.warm_dir = Some(dir.into());
        self
    }

    /// Opens the state directory.
    pub fn build(self) -> Result<Workspaces> {
        let limits = self.limits.unwrap_or(LIMITS);
        if !limits.within(&LIMITS) {
            return Err(Error::InvalidInput(format!(
                "limits {limits:?} go beyond this build's {LIMITS:?}; they may only tighten them"
            )));
        }
        let state = match self.state_dir {
            Some(dir) => StateDir::at(dir)?,
            None => StateDir::from_env()?,
        };
        let program = match self.vmm_program {
            Some(p) => p,
            None => std::env::current_exe()
                .map_err(Error::host_io("finding this program's executable"))?,
        };
        let assets = self.assets.unwrap_or_else(|| {
            let current = asset_dir();
            adopt_bundled(current.as_deref());
            current
        });
        let mut ws = Workspaces::new(state, assets, program).with_limits(limits);
        ws.warm_dir = self.warm_dir;
        ws.task_program = self.task_program;
        ws.standby_vmms = self.standby_vmms;
        Ok(ws)
    }
}

/// Copies a release bundle's kernels and `minimal` image into the asset
/// cache, linked from its `current/`, when it has none of its own (a user
/// of an unpacked bundle who never ran setup). A cache that cannot be
/// written is no reason to fail: the workspaces that need them say what
/// is missing.
fn adopt_bundled(current: Option<&std::path::Path>) {
    let (Some(current), Some(bundled)) = (current, base::host::bundle::bundled_asset_dir()) else {
        return;
    };
    match base::host::bundle::adopt(current, &bundled) {
        Ok(linked) if !linked.is_empty() => {
            tracing::info!(?linked, from = %bundled.display(), "using the bundle's guest assets")
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, cache = %current.display(), "cannot take the bundle's guest assets into the cache")
        }
    }
}

impl Workspaces {
    /// Chooses the state directory, the guest assets and the VMM program,
    /// each with a default; [`WorkspacesBuilder::build`] opens it.
    ///
    /// ```no_run
    /// let ws = workspace::Workspaces::builder()
    ///     .state_dir("/tmp/my-agent-state")
    ///     .build()?;
    /// for meta in ws.list(&workspace::ListFilter::default())? {
    ///     println!("{} is {}", meta.name, meta.state);
    /// }
    /// # Ok::<(), workspace::Error>(())
    /// ```
    pub fn builder() -> WorkspacesBuilder {
        WorkspacesBuilder::default()
    }

    /// Every default of [`Workspaces::builder`]: the state directory from
    /// the environment, the asset cache for built images, and this
    /// executable as the VMM program.
    pub fn from_env() -> Result<Self> {
        Self::builder().build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_with_explicit_choices() {
        let dir = std::env::temp_dir().join(format!("microagent-builder-{}", std::process::id()));
        let ws = Workspaces::builder()
            .state_dir(&dir)
            .assets(None)
            .vmm_program("/usr/bin/true")
            .build()
            .unwrap();
        assert_eq!(ws.state_dir().root(), dir);
        assert!(ws.assets().is_none());
        assert!(dir.join("workspaces").is_dir());
        assert_eq!(ws.limits().max_vcpus, LIMITS.max_vcpus);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn limits_only_tighten() {
        let dir = std::env::temp_dir().join(format!("microagent-limits-{}", std::process::id()));
        let tight = Limits {
            max_vcpus: 2,
            max_mem_mib: 1024,
            ..LIMITS
        };
        let ws = Workspaces::builder()
            .state_dir(&dir)
            .assets(None)
            .limits(tight)
            .build()
            .unwrap();
        let spec = base::store::spec::WorkspaceSpec {
            vcpus: 4,
            ..Default::default()
        };
        let err = ws.create("big", spec).unwrap_err();
        assert_eq!(err.code(), base::code::ErrorCode::InvalidInput);
        assert!(err.to_string().contains("use 1 to 2"), "{err}");
        assert!(ws.list(&Default::default()).unwrap().is_empty());
        let wide = Limits {
            max_vcpus: LIMITS.max_vcpus + 1,
            ..LIMITS
        };
        let err = Workspaces::builder()
            .state_dir(&dir)
            .limits(wide)
            .build()
            .unwrap_err();
        assert_eq!(err.code(), base::code::ErrorCode::InvalidInput);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
