//! A workspace's repository as its guest serves it: the handle runs the
//! steps of `repos::guest` (the first start's clone, `pull`, `diff`)
//! through [`RepoGuest`], whose commands, copies and reads go through the
//! workspace's agent.

use std::path::Path;

use crate::error::{Error, Result};
use crate::guest::request::ExecRequest;
use crate::guest::stream::ExecInput;
use crate::repos::guest::{self as steps, GuestCommand, GuestOutput, RepoGuest};
use crate::repos::{RepoError, RepoPull, WORKSPACE_REF_PREFIX};
use crate::workspaces::handle::Workspace;
use base::store::repo_checkout::RepoCheckout;
use base::volumes::CACHE_MOUNT;

impl RepoGuest for Workspace<'_> {
    type Error = Error;

    fn workspace(&self) -> &str {
        self.name()
    }

    async fn run(&self, cmd: GuestCommand) -> Result<GuestOutput> {
        let mut req = ExecRequest::argv(cmd.argv).user(cmd.user);
        if let Some(cwd) = cmd.cwd {
            req = req.cwd(cwd);
        }
        let done = self.exec_collect(req, ExecInput::None).await?;
        Ok(GuestOutput {
            success: done.success(),
            exit_code: done.exit_code,
            stdout: done.stdout,
            stderr: done.stderr,
        })
    }

    async fn copy_in(&self, host: &Path, guest: &str) -> Result<()> {
        self.files().copy_in(host, guest).await.map(drop)
    }

    async fn copy_out(&self, guest: &str, host: &Path) -> Result<()> {
        self.files().copy_out(guest, host).await.map(drop)
    }

    async fn read_small(&self, guest: &str, max: u64) -> Option<Vec<u8>> {
        let read = self.files().read_file(guest, None, Some(max)).await;
        read.ok().map(|r| r.data)
    }
}

impl Workspace<'_> {
    /// The workspace's repository.
    fn checkout(self) -> Result<RepoCheckout> {
        self.get_here()?
            .spec
            .repo
            .ok_or_else(|| RepoError::NoRepo(self.name().to_owned()).into())
    }

    /// Clones the repository `create` recorded into the guest, once, at
    /// its first start (see [`steps::clone_pending`]).
    pub(crate) async fn clone_pending_repo(self) -> Result<()> {
        let ws = self.all.dir(self.name())?;
        if !ws.repo_pending().exists() {
            return Ok(());
        }
        let meta = self.get_here()?;
        let Some(checkout) = meta.spec.repo.as_ref() else {
            return Ok(());
        };
        // A task's slot cache (its root already the user's) also serves
        // as ~/.cache, set up in the same guest process.
        let has_cache = meta.spec.volumes.iter().any(|v| v.path == CACHE_MOUNT);
        steps::clone_pending(&self, &self.all.repos(), &ws, checkout, has_cache).await
    }

    /// Brings the workspace's new commits (since the clone's base) back to
    /// the host repository as `refs/workspaces/<workspace>`: the guest
    /// bundles them, the bundle is copied out through the agent, verified
    /// and fetched. No new commits leaves the host as it was.
    pub async fn pull_repo(self) -> Result<RepoPull> {
        let host_ref = format!("{WORKSPACE_REF_PREFIX}{}", self.name());
        self.pull_repo_to(&host_ref).await
    }

    /// [`Workspace::pull_repo`] into `host_ref`.
    pub(crate) async fn pull_repo_to(self, host_ref: &str) -> Result<RepoPull> {
        let checkout = self.checkout()?;
        let ws = self.all.dir(self.name())?;
        let state = self.all.state_dir().root();
        steps::pull(&self, &self.all.repos(), state, &ws, &checkout, host_ref).await
    }

    /// The workspace's changes since the clone's base, committed or not,
    /// as a unified diff (`stat`: a summary per file instead).
    pub async fn repo_diff(self, stat: bool) -> Result<String> {
        let checkout = self.checkout()?;
        steps::diff(&self, &checkout, stat).await
    }
}
