//! The collection as the pools use it ([`PoolHost`]): here, above the
//! warm start a member's start drives and the guest whose first command it
//! pays.

use std::path::Path;

use crate::error::{Error, Result};
use crate::pool::host::PoolHost;
use crate::pool::POOL_NAMESPACE;
use crate::workspaces::lifecycle::DEFAULT_START_TIMEOUT;
use crate::workspaces::manager::{make_disk, Workspaces};
use base::images::oci::config::ImageDefaults;
use base::store::spec::{DeleteOptions, Meta, WorkspaceSpec};
use base::store::workspace_dir::WorkspaceDir;
use base::store::{StateDir, WorkspaceLock};
use base::vmm::control::ControlRequest;

impl PoolHost for Workspaces {
    fn pool_view(&self) -> Self {
        self.reserved_view(POOL_NAMESPACE)
    }

    fn pool_state(&self) -> &StateDir {
        &self.state
    }

    fn registered_image(&self, image: &str) -> Result<String> {
        Ok(self.images.get(image)?.name)
    }

    fn defaults_of(&self, image: &str) -> ImageDefaults {
        self.image_defaults(image)
    }

    fn warm_key(&self, spec: &WorkspaceSpec) -> Result<(String, String)> {
        self.warm_identity(spec)
    }

    fn record(&self, name: &str) -> Result<Meta> {
        self.at(name).get()
    }

    fn record_here(&self, name: &str) -> Result<Meta> {
        self.at(name).get_here()
    }

    fn workspace_dir(&self, name: &str) -> Result<WorkspaceDir> {
        self.dir(name)
    }

    fn lock_record(&self, name: &str) -> Result<(WorkspaceLock, Meta)> {
        self.lock_existing(name)
    }

    fn force_delete(&self, name: &str) -> Result<()> {
        self.at(name)
            .delete(DeleteOptions::default().force(true))
            .map(drop)
    }

    fn fresh_disk(&self, path: &Path, mib: u64) -> Result<()> {
        make_disk(path, mib)
    }

    fn control(&self, name: &str, request: ControlRequest) -> Result<()> {
        self.pause_or_resume(name, request)
    }

    fn give_ttl(&self, name: &str, ttl_secs: u64) -> Result<()> {
        self.at(name).set_ttl(Some(ttl_secs)).map(drop)
    }

    fn detach(&self, args: &[String], log: &Path) -> Result<()> {
        self.spawn_detached(args, log).map(drop)
    }

    fn create_member(&self, name: &str, spec: WorkspaceSpec) -> Result<()> {
        self.create(name, spec).map(drop)
    }

    async fn start_member(&self, name: &str) -> Result<bool> {
        self.snapshots()
            .start_maybe_warm(name, DEFAULT_START_TIMEOUT, |_| {}, false)
            .await?;
        let ws = self.dir(name)?;
        let hello = crate::guest::connect_agent(&ws)
            .await
            .map_err(Error::agent("connect"))?
            .hello()
            .await
            .map_err(Error::agent("hello"))?;
        // The first command in a restored guest pays for what it loads
        // (the shell, the agent's exec path): paid here, not by the
        // claim's first command.
        self.at(name).exec_true().await?;
        Ok(hello.capabilities.iter().any(|c| c == "hello_identity"))
    }
}
