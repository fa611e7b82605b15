//! What the pools need of the collection of workspaces. The collection
//! sits above this folder (its start claims a member, its budget gives one
//! back), and filling a pool drives its starts, so the pool's calls reach
//! it through [`PoolHost`], which the collection implements
//! (`snapshots/pool_host.rs`, above the warm start and the guest a
//! member's start drives).

use std::future::Future;
use std::path::Path;

use crate::error::Result;
use base::images::oci::config::ImageDefaults;
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::workspace_dir::WorkspaceDir;
use base::store::{StateDir, WorkspaceLock};
use base::vmm::control::ControlRequest;

/// The collection of workspaces as the pools use it.
pub trait PoolHost: Clone + Send + Sync + 'static {
    /// This collection seen from the pool's namespace, acting for no one.
    fn pool_view(&self) -> Self;

    /// The state directory.
    fn pool_state(&self) -> &StateDir;

    /// The registered name of image `image`; NOT_FOUND when it has none.
    fn registered_image(&self, image: &str) -> Result<String>;

    /// What a workspace of `image` starts with.
    fn defaults_of(&self, image: &str) -> ImageDefaults;

    /// The warm key and fingerprint a workspace of `spec` has.
    fn warm_key(&self, spec: &WorkspaceSpec) -> Result<(String, String)>;

    /// Workspace `name`'s record, wherever it lives.
    fn record(&self, name: &str) -> Result<Meta>;

    /// Workspace `name`'s record here, its crash detected.
    fn record_here(&self, name: &str) -> Result<Meta>;

    /// Workspace `name`'s directory.
    fn workspace_dir(&self, name: &str) -> Result<WorkspaceDir>;

    /// Workspace `name`'s lock and record; NOT_FOUND when it went.
    fn lock_record(&self, name: &str) -> Result<(WorkspaceLock, Meta)>;

    /// Deletes workspace `name`, its VMM halted first.
    fn force_delete(&self, name: &str) -> Result<()>;

    /// A fresh writable disk of `mib` MiB at `path`.
    fn fresh_disk(&self, path: &Path, mib: u64) -> Result<()>;

    /// Pauses or resumes workspace `name`'s machine.
    fn control(&self, name: &str, request: ControlRequest) -> Result<()>;

    /// Gives running workspace `name` a TTL from now.
    fn give_ttl(&self, name: &str, ttl_secs: u64) -> Result<()>;

    /// Starts `args` of this program detached, logging to `log`.
    fn detach(&self, args: &[String], log: &Path) -> Result<()>;

    /// Creates stopped member `name` of `spec` (in the pool's view).
    fn create_member(&self, name: &str, spec: WorkspaceSpec) -> Result<()>;

    /// Starts member `name` (warm when it can) and pays its first command;
    /// whether its agent takes an identity with its first request.
    fn start_member(&self, name: &str) -> impl Future<Output = Result<bool>> + Send;
}
