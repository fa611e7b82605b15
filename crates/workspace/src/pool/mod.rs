//! Pools of ready workspaces, per image (`config.json` `pool: {IMAGE: N}`,
//! or [`Pools::set_size`](crate::Pools::set_size)). A member is a workspace of the
//! image's default size, restored from its warm snapshot with its identity
//! given, its agent answering, then paused: hidden from every listing, in
//! the reserved namespace [`POOL_NAMESPACE`]. A start of a fresh workspace
//! of that image and size claims one instead of launching a VMM
//! (`claim`): the member's directory becomes the workspace's, the
//! machine resumes, and the guest takes the workspace's name, fresh
//! randomness and the clock before the start returns. A detached filler
//! (`serve fill-pool IMAGE`, `fill`) tops the pool up after a claim, a
//! `pool set` or a listing that found it short (`service`, `members`).
//!
//! Members count in the host budget and are the first thing given back
//! when a start needs their memory; a member whose image or kernel changed
//! is drained, with a `pool_drained` event in the pool's own log.
//!
//! Every part of a pool is in this folder: these records, the service
//! `ws.pools()` (`service`), its members (`members`), a start's claim
//! (`claim`) and the filling (`fill`). They reach the collection, which
//! sits above (its start claims, its budget gives members back), through
//! the `PoolHost` trait it implements (`host`, the crate's own: the
//! calls behind it check no access, so no front end reaches them).

mod claim;
mod fill;
pub(crate) mod host;
mod members;
mod service;

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;
use base::host::settings::ConfigError;
use base::store::spec::WorkspaceSpec;

use host::PoolHost;

/// The namespace pool members live in; no one else may use it.
pub const POOL_NAMESPACE: &str = "microagent-pool";
/// The key of the pool sizes in `config.json`.
pub const POOL_KEY: &str = "pool";
/// The subcommand words the filler runs as, before the image.
pub const FILL_SUBCOMMAND: [&str; 2] = ["serve", "fill-pool"];
/// The most members one image's pool may have.
pub const MAX_POOL_SIZE: usize = 32;
/// The pool's directory in the state directory: its event log, the
/// fillers' locks and log.
pub const POOL_DIR: &str = "pool";

/// Why a pool could not be set or filled.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The size asked is past [`MAX_POOL_SIZE`].
    #[error("a pool of {asked} is more than the {MAX_POOL_SIZE} members one image may have")]
    TooLarge {
        /// What was asked.
        asked: usize,
    },
    /// The sizes in config.json could not be read.
    #[error("the pool sizes cannot be read")]
    Config(#[source] ConfigError),
    /// VMMs here get no private root, which a claim relies on (a claimed
    /// member's VMM keeps its directory by the name it was started with).
    #[error("pools need VMMs with a private root, which this host cannot give: {why}")]
    NoPrivateRoot {
        /// Why not.
        why: String,
    },
    /// The image's default workspace is on a network a pool cannot serve.
    #[error(
        "pools serve workspaces on a `user` network; the default network `{network}` is not one"
    )]
    Network {
        /// The network.
        network: String,
    },
}

impl crate::error::ConcernError for PoolError {
    fn code(&self) -> ErrorCode {
        match self {
            PoolError::TooLarge { .. } | PoolError::Network { .. } => ErrorCode::InvalidInput,
            PoolError::Config(_) => ErrorCode::Internal,
            PoolError::NoPrivateRoot { .. } => ErrorCode::HostUnsupported,
        }
    }
}

impl From<PoolError> for crate::error::Error {
    fn from(e: PoolError) -> Self {
        crate::error::Error::Pool(crate::error::ConcernFailure::new(e))
    }
}

/// One image's pool, as `pool ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct PoolStatus {
    /// The image.
    pub image: String,
    /// How many members it keeps.
    pub size: usize,
    /// Members ready to be claimed.
    pub ready: usize,
    /// Members on their way.
    pub starting: usize,
}

/// What a member of `image`'s pool is made with: the image's default
/// workspace, at the sizes the image asks (`defaults`).
pub fn member_spec(
    image: &str,
    defaults: &base::images::oci::config::ImageDefaults,
) -> WorkspaceSpec {
    WorkspaceSpec {
        image: image.to_owned(),
        vcpus: defaults.vcpus_or(None),
        mem_mib: defaults.mem_mib_or(None),
        ..WorkspaceSpec::default()
    }
}

/// Whether a fresh workspace of `spec` can be a member made with `member`:
/// the same machine and network, and nothing a member's VMM was not
/// started with (volumes, ports, an address, an owner it must watch, an
/// egress policy of its own).
pub fn claimable(spec: &WorkspaceSpec, member: &WorkspaceSpec) -> bool {
    spec.image == member.image
        && spec.vcpus == member.vcpus
        && spec.mem_mib == member.mem_mib
        && spec.disk_mib == member.disk_mib
        && spec.network == member.network
        && spec.volumes.is_empty()
        && spec.ports.is_empty()
        && spec.address.is_none()
        && spec.owner.is_none()
        && spec.egress.is_none()
        && spec.allow.is_empty()
        && spec.services.is_empty()
        && spec.serving.is_none()
        // The VMM takes its idle pause when it starts.
        && spec.idle_pause_secs == member.idle_pause_secs
        && spec.idle_hibernate_secs == member.idle_hibernate_secs
}

/// The pools of ready workspaces of a collection: `ws.pools()`.
pub struct Pools<'a, H: PoolHost> {
    pub(crate) all: &'a H,
}

impl<H: PoolHost> Clone for Pools<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H: PoolHost> Copy for Pools<'_, H> {}

impl<H: PoolHost> std::fmt::Debug for Pools<'_, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools")
            .field("state", &self.all.pool_state().root())
            .finish()
    }
}

impl<'a, H: PoolHost> Pools<'a, H> {
    /// The pools of `all`.
    pub(crate) fn new(all: &'a H) -> Self {
        Self { all }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_workspace_of_the_members_size_is_claimable() {
        let member = member_spec("minimal", &Default::default());
        assert!(claimable(
            &member_spec("minimal", &Default::default()),
            &member
        ));
        assert!(!claimable(
            &member_spec("debian", &Default::default()),
            &member
        ));
        let bigger = WorkspaceSpec {
            mem_mib: member.mem_mib * 2,
            ..member_spec("minimal", &Default::default())
        };
        assert!(!claimable(&bigger, &member));
        let published = WorkspaceSpec {
            ports: vec!["8080:80".parse().unwrap()],
            ..member_spec("minimal", &Default::default())
        };
        assert!(!claimable(&published, &member));
        let owned = WorkspaceSpec {
            owner: base::store::spec::Owner::this_process(),
            ..member_spec("minimal", &Default::default())
        };
        assert!(!claimable(&owned, &member));
        // Its VMM takes the idle pause at its start.
        let never_pauses = WorkspaceSpec {
            idle_pause_secs: Some(0),
            ..member_spec("minimal", &Default::default())
        };
        assert!(!claimable(&never_pauses, &member));
        let hibernates = WorkspaceSpec {
            idle_hibernate_secs: Some(600),
            ..member_spec("minimal", &Default::default())
        };
        assert!(!claimable(&hibernates, &member));
        // What only the host side reads (labels, env, a TTL) does not matter.
        let labelled = WorkspaceSpec {
            labels: [("team".to_owned(), "a".to_owned())].into(),
            ttl_secs: Some(60),
            ..member_spec("minimal", &Default::default())
        };
        assert!(claimable(&labelled, &member));
    }
}
