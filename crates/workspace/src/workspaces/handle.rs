//! [`Workspace`]: one workspace of a [`Workspaces`], its name checked once,
//! so a program says `ws.workspace("dev")?.exec_collect(...)` instead of
//! passing the name to every call.

use std::path::Path;
use std::time::Duration;

use crate::error::Result;
use crate::guest::files::FileRead;
use crate::store::events::Event;
use crate::store::name::validate_name;
use crate::store::spec::{DeleteOptions, Meta};
use crate::workspaces::lifecycle::StartProgress;
use crate::workspaces::manager::{WorkspaceInfo, Workspaces};
use crate::{ExecInput, ExecRequest, ExecResult};

/// One workspace, by a name that passed the name rules. It may not exist
/// (yet): each call reports `NOT_FOUND` then, as the `Workspaces` call does.
#[derive(Clone, Copy, Debug)]
pub struct Workspace<'a> {
    all: &'a Workspaces,
    name: &'a str,
}

impl Workspaces {
    /// The workspace called `name`, after checking the name rules (not
    /// whether it exists).
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
    pub fn workspace<'a>(&'a self, name: &'a str) -> Result<Workspace<'a>> {
        validate_name(name).map_err(crate::store::StoreError::Name)?;
        Ok(Workspace { all: self, name })
    }
}

impl<'a> Workspace<'a> {
    /// Its name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Its record (a VMM that died is recorded as crashed first).
    pub fn get(&self) -> Result<Meta> {
        self.all.get(self.name)
    }

    /// Its record plus what is known live.
    pub fn inspect(&self) -> Result<WorkspaceInfo> {
        self.all.inspect(self.name)
    }

    /// Boots it; see [`Workspaces::start`].
    pub async fn start(
        &self,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.all.start(self.name, timeout, progress).await
    }

    /// Shuts it down; see [`Workspaces::stop`].
    pub async fn stop(&self, timeout: Duration) -> Result<Meta> {
        self.all.stop(self.name, timeout).await
    }

    /// Tears its VM down at once; see [`Workspaces::halt`].
    pub fn halt(&self) -> Result<Meta> {
        self.all.halt(self.name)
    }

    /// Deletes it; a running one only with `options.force`. See
    /// [`Workspaces::delete`].
    pub fn delete(self, options: DeleteOptions) -> Result<Meta> {
        self.all.delete(self.name, options)
    }

    /// Runs a command and collects its output; see
    /// [`Workspaces::exec_collect`].
    pub async fn exec_collect(&self, req: ExecRequest, input: ExecInput) -> Result<ExecResult> {
        self.all.exec_collect(self.name, req, input).await
    }

    /// Reads a guest file (`length` bytes from `offset`, default all).
    pub async fn read_file(
        &self,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<FileRead> {
        self.all.read_file(self.name, path, offset, length).await
    }

    /// Copies a host file or directory into the guest; bytes copied.
    pub async fn copy_in(&self, host_path: &Path, guest_path: &str) -> Result<u64> {
        self.all.copy_in(self.name, host_path, guest_path).await
    }

    /// Copies a guest file or directory out to the host; bytes copied.
    pub async fn copy_out(&self, guest_path: &str, host_path: &Path) -> Result<u64> {
        self.all.copy_out(self.name, guest_path, host_path).await
    }

    /// The last `lines` console lines (default all kept).
    pub fn logs(&self, lines: Option<usize>) -> Result<Vec<String>> {
        self.all.logs(self.name, lines)
    }

    /// Its events after sequence number `after`, waiting up to `wait` for one.
    pub async fn events(&self, after: u64, wait: Duration) -> Result<Vec<Event>> {
        self.all.events(self.name, after, wait).await
    }
}
