//! The collection's services: each a `Copy` handle on the collection,
//! declared here with its accessor (`ws.tasks()`, `ws.volumes()`, ...)
//! and its calls implemented in its own concern's folder, which names this
//! module and not the other way round. So `impl Workspaces` stays in
//! `workspaces/`, and the collection names no folder above it.

use crate::network::service::Networks;
use crate::pool::Pools;
use crate::repos::RepoStore;
use crate::servers::ServerRegistry;
use crate::workspaces::manager::Workspaces;

/// The named volumes of a collection, as its view (an agent's session or
/// the host's) sees them: `ws.volumes()`; its calls are `volumes/`'s.
#[derive(Clone, Copy, Debug)]
pub struct Volumes<'a> {
    pub(crate) all: &'a Workspaces,
}

/// The pool of servers this host reaches (`ws.server_pool()`): each one's
/// report, where a new workspace goes, and workspaces made, run and
/// measured there (`admin/`'s `server_reports` and `remote_ops`); the
/// servers themselves are `ws.servers()`.
#[derive(Clone, Copy, Debug)]
pub struct ServerPool<'a> {
    pub(crate) all: &'a Workspaces,
}

/// Setting this host up (`ws.host_setup()`, `admin/host_setup`): the whole
/// setup plan and the kernel install, each shown before it is applied;
/// what a workspace needs from the host and cannot bring itself.
#[derive(Clone, Copy, Debug)]
pub struct HostSetup<'a> {
    pub(crate) all: &'a Workspaces,
}

/// The images of a collection (`ws.images()`, `images/`): who uses one,
/// deleting, search, builds.
#[derive(Clone, Copy, Debug)]
pub struct Images<'a> {
    pub(crate) all: &'a Workspaces,
}

/// The tasks of a collection, as its view (an agent's session or the
/// host's) sees them: `ws.tasks()`, `tasks/`.
#[derive(Clone, Copy, Debug)]
pub struct Tasks<'a> {
    pub(crate) all: &'a Workspaces,
}

/// The snapshots a collection of workspaces sees (`ws.snapshots()`,
/// `snapshots/`): by name, in its namespace (or by full name). Its calls
/// take it by value, so a restore's future borrows the collection, not
/// this value.
#[derive(Clone, Copy, Debug)]
pub struct Snapshots<'a> {
    pub(crate) all: &'a Workspaces,
}

/// The guest kernels of this host as a view reaches them (`ws.kernels()`,
/// `kernels/`): the variant this host needs, and installs.
#[derive(Clone, Copy, Debug)]
pub struct Kernels<'a> {
    pub(crate) all: &'a Workspaces,
}

/// Figures of the workspaces a view sees (`ws.metrics()`, `guest/metrics`):
/// the host's and, from a running guest's agent, the guest's.
#[derive(Clone, Copy, Debug)]
pub struct Metrics<'a> {
    pub(crate) all: &'a Workspaces,
}

impl Workspaces {
    /// The volumes of this state directory, as this view sees them.
    pub fn volumes(&self) -> Volumes<'_> {
        Volumes { all: self }
    }

    /// The pool of servers as this view reaches it.
    pub fn server_pool(&self) -> ServerPool<'_> {
        ServerPool { all: self }
    }

    /// Setting this host up.
    pub fn host_setup(&self) -> HostSetup<'_> {
        HostSetup { all: self }
    }

    /// The images here, as a service.
    pub fn images(&self) -> Images<'_> {
        Images { all: self }
    }

    /// The tasks of this state directory, as this view sees them.
    pub fn tasks(&self) -> Tasks<'_> {
        Tasks { all: self }
    }

    /// The snapshots this view sees.
    pub fn snapshots(&self) -> Snapshots<'_> {
        Snapshots { all: self }
    }

    /// The guest kernels: the variant this host needs, and installs.
    pub fn kernels(&self) -> Kernels<'_> {
        Kernels { all: self }
    }

    /// The figures of the workspaces this view sees.
    pub fn metrics(&self) -> Metrics<'_> {
        Metrics { all: self }
    }

    /// The servers this state directory knows, and where its remote
    /// workspaces live (docs/servers.md).
    pub fn servers(&self) -> ServerRegistry {
        ServerRegistry::new(&self.state)
    }

    /// The pools of ready workspaces of this state directory.
    pub fn pools(&self) -> Pools<'_, Self> {
        Pools::new(self)
    }

    /// The repository allowlist of this state directory.
    pub fn repos(&self) -> RepoStore {
        RepoStore::new(&self.state)
    }

    /// The networks of this state directory: their records, the
    /// workspaces on each, and the host setup they need.
    pub fn networks(&self) -> Networks<'_, Self> {
        Networks::new(self)
    }
}
