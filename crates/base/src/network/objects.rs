//! Networks as objects: the built-in `user` and `none`, and networks a user
//! creates (`network create NAME --backend user|tap --subnet CIDR --egress
//! all|none|allowlist --allow ...`), each a JSON record under
//! `networks/` in the state directory. A workspace names its network at
//! create; a network is removed only while no workspace names it.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::store::egress::{AllowEntry, Egress};
use crate::store::name::{NO_NETWORK, USER_NETWORK};
use crate::store::subnet::Subnet;
use crate::store::StateDir;

/// Where network records live in the state directory.
pub const NETWORKS_DIR: &str = "networks";
/// Allowlist entries a network may carry.
pub const MAX_ALLOW: usize = 256;
/// The prefix lengths a subnet may have: room for a gateway, a resolver
/// and guests, and no more than a /16 of the host's address space.
pub const PREFIXES: std::ops::RangeInclusive<u8> = 16..=27;
/// The first octets of the default `tap` subnets (`10.89.N.0/24`).
pub const TAP_SUBNET_BASE: [u8; 2] = [10, 89];

/// Why a network operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// No network of that name.
    #[error("network `{0}` does not exist")]
    NotFound(String),
    /// The name is taken (built-in names included).
    #[error("network `{0}` already exists")]
    Exists(String),
    /// Workspaces still name the network.
    #[error("network `{name}` is used by {}", workspaces.join(", "))]
    InUse {
        /// The network.
        name: String,
        /// The workspaces on it.
        workspaces: Vec<String>,
    },
    /// A built-in network cannot be removed.
    #[error("network `{0}` is built in and cannot be removed")]
    BuiltIn(String),
    /// A value of the request is malformed or out of range.
    #[error("{0}")]
    Invalid(String),
    /// A `tap` network's bridge is missing: the host setup is not applied.
    #[error("network `{network}` is not set up on this host (its bridge {bridge} is missing)")]
    NotSetUp {
        /// The network.
        network: String,
        /// The missing bridge.
        bridge: String,
    },
    /// The workspace's TAP device could not be made or attached.
    #[error("attaching TAP {tap} to network `{network}` failed: {why}")]
    Tap {
        /// The device.
        tap: String,
        /// The network.
        network: String,
        /// What `ip` said.
        why: String,
    },
    /// A host command could not be run.
    #[error("running {program}")]
    Command {
        /// The program.
        program: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// `passt`, the `user` network's NAT, is not installed.
    #[error("the `user` network needs passt, which is not installed (apt-get install passt)")]
    PasstMissing,
    /// A host-side step failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The record could not be read or written.
    #[error("network record {}", path.display())]
    Record {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: crate::store::StoreError,
    },
}

impl NetworkError {
    /// An `Io` error for `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetworkError {
        let what = what.into();
        move |source| NetworkError::Io { what, source }
    }

    /// The stable code front ends report.
    pub fn code(&self) -> crate::code::ErrorCode {
        use crate::code::ErrorCode as C;
        match self {
            Self::NotFound(_) => C::NotFound,
            Self::Exists(_) | Self::InUse { .. } | Self::BuiltIn(_) => C::Conflict,
            Self::Invalid(_) => C::InvalidInput,
            Self::NotSetUp { .. } | Self::Tap { .. } | Self::PasstMissing => C::HostUnsupported,
            Self::Command { .. } | Self::Record { .. } | Self::Io { .. } => C::Internal,
        }
    }

    /// What the caller can do about it.
    pub fn remedy(&self) -> Option<crate::remedy::Remedy> {
        use crate::remedy::Remedy as R;
        match self {
            Self::NotFound(_) => Some(R::ListNetworks),
            Self::InUse { workspaces, .. } => Some(R::DeleteWorkspacesFirst {
                workspaces: workspaces.clone(),
            }),
            Self::NotSetUp { .. } => Some(R::SetUpNetworks),
            _ => None,
        }
    }
}

/// A workspace's place on its network, as `inspect` shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct GuestNetwork {
    /// The network.
    pub name: String,
    /// Its backend.
    pub backend: Backend,
    /// What the guest may reach: the workspace's mode, else the
    /// network's.
    pub egress: Egress,
    /// The rules in force: the network's and the workspace's.
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// The guest's addresses (the gateway is `host.microagent.internal`).
    #[serde(flatten)]
    pub addressing: Addressing,
    /// The guest's MAC address.
    pub mac: String,
}

/// How a network reaches the outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Rootless NAT through a `passt` per workspace.
    User,
    /// A TAP device per workspace on a bridge of the network, behind our
    /// nftables table (host setup by preview-then-confirm).
    Tap,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::User => "user",
            Self::Tap => "tap",
        })
    }
}

/// What `network create` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NetworkRequest {
    /// `user` (rootless, the default) or `tap`.
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// The subnet; default 10.0.2.0/24 for `user` (each guest has its own
    /// passt, so user subnets may repeat) and a free 10.89.N.0/24 for `tap`.
    #[serde(default)]
    pub subnet: Option<Subnet>,
    /// What guests may reach (default `all`).
    #[serde(default = "default_egress")]
    pub egress: Egress,
    /// Rules opening more (domains, CIDRs, on `user` with ports and
    /// `host:PORT`).
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// Guests of a `tap` network may reach each other (by default each
    /// one's bridge port is isolated).
    #[serde(default)]
    pub allow_peers: bool,
}

fn default_backend() -> Backend {
    Backend::User
}

fn default_egress() -> Egress {
    Egress::All
}

impl Default for NetworkRequest {
    fn default() -> Self {
        Self {
            backend: default_backend(),
            subnet: None,
            egress: default_egress(),
            allow: Vec::new(),
            allow_peers: false,
        }
    }
}

/// A network: its record, or a built-in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Network {
    /// Its name.
    pub name: String,
    /// Built in (`user`, `none`): always there, never removed.
    pub builtin: bool,
    /// `None` for the `none` network (no device).
    pub backend: Option<Backend>,
    /// The subnet (none for `none`).
    pub subnet: Option<Subnet>,
    /// What guests may reach.
    pub egress: Egress,
    /// Its rules.
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// Its guests may reach each other (`tap`; otherwise isolated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_peers: bool,
    /// The number that names its bridge (`tap` networks).
    #[serde(default)]
    pub index: u8,
    /// When it was created, Unix ms (0 for built-ins).
    #[serde(default)]
    pub created_at_ms: u64,
}

/// The addresses a guest of a network uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Addressing {
    /// The guest's own address.
    pub guest: Ipv4Addr,
    /// The subnet's prefix length.
    pub prefix: u8,
    /// The default route, and `host.microagent.internal`.
    pub gateway: Ipv4Addr,
    /// The resolver.
    pub dns: Ipv4Addr,
}

/// Offsets into a `user` subnet, as in the built-in 10.0.2.0/24 (QEMU's
/// user network's, which guests and users know).
const USER_GATEWAY_HOST: u32 = 2;
const USER_DNS_HOST: u32 = 3;
const USER_GUEST_HOST: u32 = 15;
/// On a `tap` network the bridge is `.1` (gateway and resolver); guests
/// take `.2` upward.
const TAP_GATEWAY_HOST: u32 = 1;
/// The first guest address on a `tap` network.
pub const TAP_FIRST_GUEST_HOST: u32 = 2;

impl Network {
    /// The built-in `user` network.
    pub fn user() -> Self {
        Self {
            name: USER_NETWORK.into(),
            builtin: true,
            backend: Some(Backend::User),
            subnet: Some(Subnet {
                addr: Ipv4Addr::new(10, 0, 2, 0),
                prefix: 24,
            }),
            egress: Egress::All,
            allow: Vec::new(),
            allow_peers: false,
            index: 0,
            created_at_ms: 0,
        }
    }

    /// The built-in `none` network.
    pub fn none() -> Self {
        Self {
            name: NO_NETWORK.into(),
            builtin: true,
            backend: None,
            subnet: None,
            egress: Egress::None,
            allow: Vec::new(),
            allow_peers: false,
            index: 0,
            created_at_ms: 0,
        }
    }

    /// The bridge of a `tap` network.
    pub fn bridge(&self) -> Option<String> {
        (self.backend == Some(Backend::Tap)).then(|| format!("microagent{}", self.index))
    }

    /// The gateway (and, on `tap`, the resolver) address.
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        let subnet = self.subnet?;
        Some(match self.backend? {
            Backend::User => subnet.host(USER_GATEWAY_HOST),
            Backend::Tap => subnet.host(TAP_GATEWAY_HOST),
        })
    }

    /// The addresses of a guest; `host` picks the guest's address on a
    /// `tap` network (every `user` guest has the same one).
    pub fn addressing(&self, tap_host: u32) -> Option<Addressing> {
        let subnet = self.subnet?;
        let gateway = self.gateway()?;
        Some(match self.backend? {
            Backend::User => Addressing {
                guest: subnet.host(USER_GUEST_HOST),
                prefix: subnet.prefix,
                gateway,
                dns: subnet.host(USER_DNS_HOST),
            },
            Backend::Tap => Addressing {
                guest: subnet.host(tap_host),
                prefix: subnet.prefix,
                gateway,
                dns: gateway,
            },
        })
    }
}

/// Checks a request on its own (overlaps with other networks are checked
/// by [`NetworkStore::create`]).
pub fn validate_request(req: &NetworkRequest) -> Result<(), NetworkError> {
    let bad = |m: String| Err(NetworkError::Invalid(m));
    if let Some(s) = req.subnet {
        if !PREFIXES.contains(&s.prefix) {
            return bad(format!(
                "subnet {s}: use a prefix length of {} to {}",
                PREFIXES.start(),
                PREFIXES.end()
            ));
        }
        if !s.addr.is_private() {
            return bad(format!(
                "subnet {s} is not private; use one inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
            ));
        }
    }
    if req.allow_peers && req.backend != Backend::Tap {
        return bad(
            "--allow-peers is for tap networks: guests of a user network never share a link".into(),
        );
    }
    if req.egress == Egress::None && !req.allow.is_empty() {
        return bad(
            "egress `none` opens nothing, rules included; use `allowlist` with the rules".into(),
        );
    }
    if req.backend == Backend::Tap && req.egress == Egress::All && !req.allow.is_empty() {
        return bad(
            "a tap network under egress `all` reaches everything already; rules need `allowlist`"
                .into(),
        );
    }
    if req.egress == Egress::Allowlist && req.allow.is_empty() {
        return bad("egress `allowlist` needs at least one allowed domain or CIDR".into());
    }
    if req.allow.len() > MAX_ALLOW {
        return bad(format!(
            "{} allow entries; at most {MAX_ALLOW}",
            req.allow.len()
        ));
    }
    Ok(())
}

/// The networks' lock, released when dropped.
#[derive(Debug)]
pub struct NetworksLock {
    _file: std::fs::File,
}

/// Checks a new network's name and request on their own.
pub fn check_new(name: &str, req: &NetworkRequest) -> Result<(), NetworkError> {
    crate::store::name::validate_name(name)
        .map_err(|e| NetworkError::Invalid(format!("network name `{name}`: {e}")))?;
    if [USER_NETWORK, NO_NETWORK].contains(&name) {
        return Err(NetworkError::Exists(name.to_owned()));
    }
    validate_request(req)
}

/// The networks of a state directory.
#[derive(Clone, Debug)]
pub struct NetworkStore {
    dir: PathBuf,
}

impl NetworkStore {
    /// The networks recorded in `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            dir: state.root().join(NETWORKS_DIR),
        }
    }

    fn record(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    fn record_err(path: PathBuf) -> impl FnOnce(crate::store::StoreError) -> NetworkError {
        move |source| NetworkError::Record { path, source }
    }

    /// Takes the lock that orders network creates and removals against
    /// workspace creates naming a network (held until dropped).
    pub fn lock(&self) -> Result<NetworksLock, NetworkError> {
        let path = self.dir.join(".lock");
        let err = |source| NetworkError::Record {
            path: path.clone(),
            source: crate::store::StoreError::Lock {
                path: path.clone(),
                source,
            },
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err)?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) } == 0 {
                return Ok(NetworksLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(err(e));
            }
        }
    }

    /// The network `name`.
    pub fn get(&self, name: &str) -> Result<Network, NetworkError> {
        match name {
            USER_NETWORK => return Ok(Network::user()),
            NO_NETWORK => return Ok(Network::none()),
            _ => {}
        }
        if crate::store::name::validate_name(name).is_err() {
            return Err(NetworkError::NotFound(name.to_owned()));
        }
        let path = self.record(name);
        if !path.exists() {
            return Err(NetworkError::NotFound(name.to_owned()));
        }
        crate::store::read_json(&path).map_err(Self::record_err(path))
    }

    /// Every network, built-ins first, then by name.
    pub fn list(&self) -> Result<Vec<Network>, NetworkError> {
        let mut out = vec![Network::user(), Network::none()];
        let mut names: Vec<String> = crate::store::json_record_names(&self.dir)
            .map_err(|source| NetworkError::Record {
                path: self.dir.clone(),
                source: crate::store::StoreError::Read {
                    path: self.dir.clone(),
                    source,
                },
            })?
            .into_iter()
            .filter(|n| crate::store::name::validate_name(n).is_ok())
            .collect();
        names.sort();
        for name in names {
            out.push(self.get(&name)?);
        }
        Ok(out)
    }

    /// Records a new network. The caller holds [`NetworkStore::lock`] (so two
    /// creates cannot take one subnet or index).
    pub fn create(
        &self,
        name: &str,
        req: &NetworkRequest,
        now_ms: u64,
    ) -> Result<Network, NetworkError> {
        check_new(name, req)?;
        let existing = self.list()?;
        if existing.iter().any(|n| n.name == name) {
            return Err(NetworkError::Exists(name.to_owned()));
        }
        let taps: Vec<&Network> = existing
            .iter()
            .filter(|n| n.backend == Some(Backend::Tap))
            .collect();
        let index = match req.backend {
            Backend::User => 0,
            Backend::Tap => (0..=u8::MAX)
                .find(|i| taps.iter().all(|n| n.index != *i))
                .ok_or_else(|| {
                    NetworkError::Invalid("256 tap networks exist; remove one".into())
                })?,
        };
        let subnet = match (req.subnet, req.backend) {
            (Some(s), _) => s,
            (None, Backend::User) => Network::user().subnet.unwrap_or(Subnet {
                addr: Ipv4Addr::new(10, 0, 2, 0),
                prefix: 24,
            }),
            (None, Backend::Tap) => Subnet {
                addr: Ipv4Addr::new(TAP_SUBNET_BASE[0], TAP_SUBNET_BASE[1], index, 0),
                prefix: 24,
            },
        };
        if req.backend == Backend::Tap {
            if let Some(other) = taps
                .iter()
                .find(|n| n.subnet.is_some_and(|s| s.overlaps(&subnet)))
            {
                return Err(NetworkError::Invalid(format!(
                    "subnet {subnet} overlaps network `{}` ({}); choose another subnet",
                    other.name,
                    other.subnet.map(|s| s.to_string()).unwrap_or_default()
                )));
            }
        }
        let net = Network {
            name: name.to_owned(),
            builtin: false,
            backend: Some(req.backend),
            subnet: Some(subnet),
            egress: req.egress,
            allow: req.allow.clone(),
            allow_peers: req.allow_peers,
            index,
            created_at_ms: now_ms,
        };
        let path = self.record(name);
        std::fs::create_dir_all(&self.dir).map_err(|source| NetworkError::Record {
            path: self.dir.clone(),
            source: crate::store::StoreError::CreateDir {
                path: self.dir.clone(),
                source,
            },
        })?;
        crate::store::write_json_atomic(&path, &net).map_err(Self::record_err(path))?;
        Ok(net)
    }

    /// Removes a network no workspace uses (`users`: the workspaces that
    /// name it).
    pub fn remove(&self, name: &str, users: Vec<String>) -> Result<Network, NetworkError> {
        let net = self.get(name)?;
        if net.builtin {
            return Err(NetworkError::BuiltIn(name.to_owned()));
        }
        if !users.is_empty() {
            return Err(NetworkError::InUse {
                name: name.to_owned(),
                workspaces: users,
            });
        }
        let path = self.record(name);
        std::fs::remove_file(&path).map_err(|source| NetworkError::Record {
            path: path.clone(),
            source: crate::store::StoreError::Write { path, source },
        })?;
        Ok(net)
    }
}

/// A network and the workspaces on it.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct NetworkInfo {
    /// The network.
    #[serde(flatten)]
    pub network: Network,
    /// Its bridge (`tap` networks).
    pub bridge: Option<String>,
    /// Its gateway: the default route, the resolver on `tap` networks, and
    /// `host.microagent.internal` in its guests.
    pub gateway: Option<std::net::Ipv4Addr>,
    /// The workspaces that name it.
    pub workspaces: Vec<String>,
}

#[cfg(test)]
mod tests {
    // Network records: parsing, validation, creation and removal rules.

    use super::*;

    fn temp_state() -> (StateDir, PathBuf) {
        let root = std::env::temp_dir().join(format!(
            "ma-networks-{}",
            crate::host::settings::unique_id()
        ));
        (StateDir::at(&root).unwrap(), root)
    }

    fn tap(egress: Egress, allow: &[&str]) -> NetworkRequest {
        NetworkRequest {
            backend: Backend::Tap,
            subnet: None,
            egress,
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            allow_peers: false,
        }
    }

    #[test]
    fn requests_are_checked_before_anything_is_written() {
        // A user network takes every mode (its VMMs filter), rules with
        // ports too; none takes no rules.
        let user = |egress, allow: &[&str]| NetworkRequest {
            egress,
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            ..NetworkRequest::default()
        };
        validate_request(&user(Egress::None, &[])).unwrap();
        validate_request(&user(Egress::All, &["host:8000", "10.0.0.0/8:5432"])).unwrap();
        let err = validate_request(&user(Egress::None, &["pypi.org"])).unwrap_err();
        assert!(err.to_string().contains("opens nothing"), "{err}");
        assert!(validate_request(&tap(Egress::Allowlist, &[])).is_err());
        assert!(validate_request(&tap(Egress::All, &["pypi.org"])).is_err());
        // A tap network's allowlist takes rules with ports too.
        validate_request(&tap(
            Egress::Allowlist,
            &["pypi.org", "10.0.0.0/8", "host:8000", "192.0.2.0/24:443"],
        ))
        .unwrap();
        let public = NetworkRequest {
            subnet: Some("8.8.8.0/24".parse().unwrap()),
            ..NetworkRequest::default()
        };
        assert!(validate_request(&public)
            .unwrap_err()
            .to_string()
            .contains("not private"));
        let tiny = NetworkRequest {
            subnet: Some("10.1.1.0/30".parse().unwrap()),
            ..NetworkRequest::default()
        };
        assert!(validate_request(&tiny).is_err());
    }

    #[test]
    fn builtins_are_listed_and_cannot_be_made_or_removed() {
        let (state, root) = temp_state();
        let nets = NetworkStore::new(&state);
        let names: Vec<String> = nets.list().unwrap().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["user", "none"]);
        assert!(matches!(
            nets.create("user", &NetworkRequest::default(), 1),
            Err(NetworkError::Exists(_))
        ));
        assert!(matches!(
            nets.remove("none", vec![]),
            Err(NetworkError::BuiltIn(_))
        ));
        assert!(matches!(nets.get("corp"), Err(NetworkError::NotFound(_))));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn tap_networks_get_their_own_index_and_subnet() {
        let (state, root) = temp_state();
        let nets = NetworkStore::new(&state);
        let a = nets.create("a", &tap(Egress::All, &[]), 1).unwrap();
        let b = nets.create("b", &tap(Egress::None, &[]), 2).unwrap();
        assert_eq!((a.index, b.index), (0, 1));
        assert_eq!(a.subnet.unwrap().to_string(), "10.89.0.0/24");
        assert_eq!(b.subnet.unwrap().to_string(), "10.89.1.0/24");
        assert_eq!(a.bridge().as_deref(), Some("microagent0"));
        let addr = b.addressing(5).unwrap();
        assert_eq!(addr.guest, Ipv4Addr::new(10, 89, 1, 5));
        assert_eq!(addr.gateway, Ipv4Addr::new(10, 89, 1, 1));
        assert_eq!(addr.dns, addr.gateway);
        let clash = NetworkRequest {
            subnet: Some("10.89.0.0/16".parse().unwrap()),
            ..tap(Egress::All, &[])
        };
        let err = nets.create("c", &clash, 3).unwrap_err().to_string();
        assert!(err.contains("overlaps network `a`"), "{err}");
        assert!(!root.join(NETWORKS_DIR).join("c.json").exists());
        // User networks may repeat a subnet: each guest has its own passt.
        nets.create("u1", &NetworkRequest::default(), 4).unwrap();
        nets.create("u2", &NetworkRequest::default(), 5).unwrap();
        assert_eq!(nets.get("b").unwrap(), b);
        let names: Vec<String> = nets.list().unwrap().into_iter().map(|n| n.name).collect();
        assert_eq!(names, ["user", "none", "a", "b", "u1", "u2"]);
        // An index freed by a removal is taken again.
        nets.remove("a", vec![]).unwrap();
        assert_eq!(
            nets.create("d", &tap(Egress::All, &[]), 6).unwrap().index,
            0
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_network_in_use_is_not_removed() {
        let (state, root) = temp_state();
        let nets = NetworkStore::new(&state);
        nets.create("corp", &tap(Egress::All, &[]), 1).unwrap();
        let err = nets.remove("corp", vec!["dev".into()]).unwrap_err();
        assert!(matches!(err, NetworkError::InUse { .. }));
        assert!(err.to_string().contains("dev"), "{err}");
        assert!(nets.get("corp").is_ok());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn the_user_network_keeps_qemus_addresses() {
        let addr = Network::user().addressing(0).unwrap();
        assert_eq!(addr.guest, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(addr.gateway, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(addr.dns, Ipv4Addr::new(10, 0, 2, 3));
        assert_eq!(Network::none().addressing(0), None);
    }
}
