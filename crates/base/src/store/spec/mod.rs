//! What a workspace is made of (its spec, checked against the limits) and
//! what is recorded about it in `meta.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::ports::PortError;
use crate::store::state::State;

/// Why a spec, a duration or a TTL is refused, or a delete is not allowed.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A value is out of range or malformed.
    #[error("{0}")]
    Invalid(String),
    /// A published port, or the set of them.
    #[error(transparent)]
    Ports(#[from] PortError),
    /// A volume mount, or the set of them.
    #[error(transparent)]
    Volumes(#[from] crate::store::volume_mounts::VolumeMountError),
    /// A service, or what a companion serves.
    #[error(transparent)]
    Services(#[from] services::ServiceSpecError),
    /// The workspace has a VMM and the delete was not forced.
    #[error("workspace `{name}` is {state}: {DELETE_NEEDS_FORCE}")]
    DeleteRunning {
        /// The workspace.
        name: String,
        /// Its state.
        state: State,
    },
}

impl SpecError {
    /// The stable code front ends report.
    pub fn code(&self) -> crate::code::ErrorCode {
        use crate::code::ErrorCode;
        match self {
            SpecError::Invalid(_) => ErrorCode::InvalidInput,
            SpecError::Ports(e) => e.code(),
            SpecError::Volumes(_) => ErrorCode::InvalidInput,
            SpecError::Services(_) => ErrorCode::InvalidInput,
            SpecError::DeleteRunning { .. } => ErrorCode::Conflict,
        }
    }
}

/// Why a delete of a workspace with a VMM is refused.
pub const DELETE_NEEDS_FORCE: &str = "a running workspace is deleted only with force";

type Result<T, E = SpecError> = std::result::Result<T, E>;

/// Limits every front end enforces; `contract` reports them.
#[derive(Clone, Copy, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Limits {
    /// Most vCPUs.
    pub max_vcpus: u8,
    /// Least guest memory, MiB.
    pub min_mem_mib: u64,
    /// Most guest memory, MiB.
    pub max_mem_mib: u64,
    /// Least writable disk, MiB.
    pub min_disk_mib: u64,
    /// Most writable disk, MiB.
    pub max_disk_mib: u64,
    /// Longest TTL, seconds.
    pub max_ttl_secs: u64,
    /// Most labels or env variables.
    pub max_entries: usize,
    /// Most bytes one `copy_out` writes to the host (a directory's archive,
    /// or a file).
    pub max_copy_out_bytes: u64,
    /// Most entries one `copy_out` of a directory unpacks.
    pub max_copy_out_entries: u64,
    /// Most bytes an image's layers unpack to, all together (a gzip layer
    /// is stopped as it crosses it), and most bytes `image build` saves
    /// from its guest.
    pub max_image_bytes: u64,
    /// Most archive entries an image's layers hold, all together.
    pub max_image_entries: u64,
    /// Largest layer a registry manifest may declare, in bytes.
    pub max_layer_bytes: u64,
    /// Largest manifest, index or config an image source may have, bytes.
    pub max_image_metadata_bytes: u64,
}

/// Longest env or label value, bytes: they are stored in every record and
/// sent with every start.
pub const MAX_VALUE_BYTES: usize = 4096;

/// The limits of this build.
pub const LIMITS: Limits = Limits {
    max_vcpus: 8,
    min_mem_mib: 64,
    max_mem_mib: 16384,
    min_disk_mib: 64,
    max_disk_mib: 1 << 20,
    max_ttl_secs: 30 * 24 * 3600,
    max_entries: 64,
    max_copy_out_bytes: 16 << 30,
    max_copy_out_entries: 1_000_000,
    max_image_bytes: 32 << 30,
    max_image_entries: 4_000_000,
    max_layer_bytes: 16 << 30,
    max_image_metadata_bytes: 4 << 20,
};

mod runtime;
pub mod services;

pub use runtime::{Hibernation, PauseCause, Runtime, StartKind};

/// Defaults for a new workspace.
pub mod defaults {
    /// Image.
    pub const IMAGE: &str = "minimal";
    /// vCPUs.
    pub const VCPUS: u8 = 1;
    /// Guest memory, MiB.
    pub const MEM_MIB: u64 = 256;
    /// Writable disk, MiB (sparse: only written blocks use host disk).
    pub const DISK_MIB: u64 = 1024;
}

/// What to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct WorkspaceSpec {
    /// Image name.
    pub image: String,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
    /// Writable disk, MiB.
    pub disk_mib: u64,
    /// Added to every exec's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, for `list` filters.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Stop the workspace this many seconds after each start (null: no
    /// TTL).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// Pause its vCPUs after this many seconds with nothing to do (no
    /// call, connection, process or terminal); 0 never; null: the host's
    /// `config.json` `idle.pause_secs`, else 120. The next call resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_pause_secs: Option<u64>,
    /// Seconds of idleness before it hibernates (its machine written into
    /// its directory, its VMM gone; the next call resumes it); 0 never;
    /// null: the host's `config.json` `idle.hibernate_secs`, else never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_hibernate_secs: Option<u64>,
    /// The network: `user` (rootless NAT, the default) or `none`.
    #[serde(default = "default_network")]
    pub network: String,
    /// Published ports: host addresses whose connections reach ports on
    /// the guest's loopback.
    #[serde(default)]
    pub ports: Vec<crate::store::ports::PortMapping>,
    /// A service's ports (on a companion, with `serving`): guest ports its
    /// VMM serves, each on a relay socket `services/<vsock port>.sock` in
    /// the directory of the workspace it serves, whose guest reaches them
    /// through its vsock (at most [`services::MAX_SERVICE_PORTS`], each
    /// once, none 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_ports: Vec<u16>,
    /// The services it names: each a microVM of its own that its guest
    /// reaches by the service's name (`crate::store::spec::services`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<services::ServiceSpec>,
    /// Set on a service's own VMM (a companion): the workspace it serves,
    /// whose directory holds its relay sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<services::Serving>,
    /// What the guest may reach beyond its network, when not the
    /// network's own policy (`user`: everything but the host and private
    /// ranges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::store::egress::Egress>,
    /// Rules that open more than the egress mode: domains, CIDRs with or
    /// without a port, `host:PORT` (added to the network's own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<crate::store::egress::AllowEntry>,
    /// The guest's address on a `tap` network, assigned at create (a value
    /// given is replaced; every `user` guest has the same one, so none is
    /// recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::Ipv4Addr>,
    /// The process the workspace lives for (one-shot runs): its VMM stops
    /// when that process ends, so a killed client leaves nothing running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// Deleted, not only stopped, once `owner` has ended (an MCP session's
    /// workspace): the next listing removes it if nothing did before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_with_owner: bool,
    /// The agent that owns it (made by that agent's MCP session): other
    /// agents may not use it unless it is shared with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Agents besides its owner that may use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<String>,
    /// Working directory of commands that name none (from the image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The user (uid, gid) commands run as (from the image; else root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<(u32, u32)>,
    /// Named volumes it mounts, in slot order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::store::volume_mounts::VolumeMount>,
    /// The allowlisted repository cloned into `/workspace/repo` at its
    /// first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<crate::store::repo_checkout::RepoCheckout>,
}

/// A host process, told apart from a later one with the same pid by its
/// start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Owner {
    /// Process id.
    pub pid: u32,
    /// Its start time in clock ticks after boot (/proc/PID/stat field 22).
    pub start_ticks: u64,
}

impl Owner {
    /// The running process; `None` when /proc cannot tell its start.
    pub fn this_process() -> Option<Self> {
        let pid = std::process::id();
        crate::store::process::start_ticks(pid).map(|start_ticks| Self { pid, start_ticks })
    }
}

fn default_namespace() -> String {
    crate::store::name::DEFAULT_NAMESPACE.into()
}

fn default_network() -> String {
    crate::store::name::DEFAULT_NETWORK.into()
}

impl Default for WorkspaceSpec {
    fn default() -> Self {
        Self {
            image: defaults::IMAGE.into(),
            vcpus: defaults::VCPUS,
            mem_mib: defaults::MEM_MIB,
            disk_mib: defaults::DISK_MIB,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            ttl_secs: None,
            idle_pause_secs: None,
            idle_hibernate_secs: None,
            network: default_network(),
            ports: Vec::new(),
            service_ports: Vec::new(),
            services: Vec::new(),
            serving: None,
            egress: None,
            allow: Vec::new(),
            address: None,
            owner: None,
            delete_with_owner: false,
            agent: None,
            shared_with: Vec::new(),
            cwd: None,
            user: None,
            volumes: Vec::new(),
            repo: None,
        }
    }
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
}

impl WorkspaceSpec {
    /// Whether a workspace of this spec may hibernate: none with services
    /// and no service's own machine (they serve each other through relays
    /// a hibernation would close).
    pub fn may_hibernate(&self) -> bool {
        self.services.is_empty() && self.serving.is_none()
    }

    /// Checks every field against [`LIMITS`].
    pub fn validate(&self) -> Result<()> {
        self.validate_within(&LIMITS)
    }

    /// Checks the spec against `l` (the limits a [`crate::Workspaces`] was
    /// built with).
    pub fn validate_within(&self, l: &Limits) -> Result<()> {
        let bad = |msg: String| Err(SpecError::Invalid(msg));
        if self.vcpus == 0 || self.vcpus > l.max_vcpus {
            return bad(format!("vcpus is {}; use 1 to {}", self.vcpus, l.max_vcpus));
        }
        if !(l.min_mem_mib..=l.max_mem_mib).contains(&self.mem_mib) {
            return bad(format!(
                "memory is {} MiB; use {} to {} MiB",
                self.mem_mib, l.min_mem_mib, l.max_mem_mib
            ));
        }
        if !(l.min_disk_mib..=l.max_disk_mib).contains(&self.disk_mib) {
            return bad(format!(
                "disk is {} MiB; use {} to {} MiB",
                self.disk_mib, l.min_disk_mib, l.max_disk_mib
            ));
        }
        if let Some(ttl) = self.ttl_secs {
            l.check_ttl(ttl)?;
        }
        if let Some(secs) = self.idle_pause_secs {
            crate::host::idle::check_pause_secs(secs)
                .map_err(|e| SpecError::Invalid(e.to_string()))?;
        }
        if let Some(secs) = self.idle_hibernate_secs {
            crate::host::idle::check_hibernate_secs(secs)
                .map_err(|e| SpecError::Invalid(e.to_string()))?;
        }
        let service_envs = self.services.iter().map(|s| ("a service's env", &s.env));
        for (what, map) in [("env", &self.env), ("labels", &self.labels)]
            .into_iter()
            .chain(service_envs)
        {
            if map.len() > l.max_entries {
                return bad(format!(
                    "{} {what} entries; at most {} are allowed",
                    map.len(),
                    l.max_entries
                ));
            }
            if let Some(key) = map.keys().find(|k| !valid_key(k)) {
                return bad(format!(
                    "{what} key {key:?} is not allowed; use letters, digits and _ . - /"
                ));
            }
            if let Some((key, value)) = map.iter().find(|(_, v)| v.len() > MAX_VALUE_BYTES) {
                return bad(format!(
                    "{what} value of {key:?} is {} bytes; at most {MAX_VALUE_BYTES}",
                    value.len()
                ));
            }
        }
        if self.image.is_empty() {
            return bad("image name is empty".into());
        }
        crate::store::ports::validate(&self.ports)?;
        services::validate_service_ports(&self.service_ports)?;
        // A service is reached by its workspace alone, and its VMM's
        // connections and threads are the relays' (`pids.max`).
        if !self.service_ports.is_empty() && !self.ports.is_empty() {
            return bad("a service publishes no ports".into());
        }
        services::validate(&self.services)?;
        if self.service_ports.is_empty() != self.serving.is_none() {
            return bad("a service's ports and what it serves come together".into());
        }
        if let Some(serving) = &self.serving {
            services::validate_serving(serving)?;
        }
        if self.serving.is_some() && !self.services.is_empty() {
            return bad("a service names no services of its own".into());
        }
        crate::store::volume_mounts::validate(&self.volumes)?;
        crate::store::name::validate_network_name(&self.network)
            .map_err(|e| SpecError::Invalid(format!("network name `{}`: {e}", self.network)))
    }
}

/// Parses a duration as people write it: `90` or `90s`, `30m`, `1h`,
/// `1h30m`, `2d` (seconds; units `s`, `m`, `h`, `d`).
pub fn parse_duration(text: &str) -> Result<u64> {
    let bad = || {
        SpecError::Invalid(format!(
            "duration {text:?}: use seconds or a number with a unit, e.g. 90, 30m, 1h, 1h30m, 2d"
        ))
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(secs);
    }
    let (mut total, mut digits) = (0u64, String::new());
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

/// Checks a TTL in seconds against this build's [`LIMITS`].
pub fn validate_ttl(ttl: u64) -> Result<()> {
    LIMITS.check_ttl(ttl)
}

impl Limits {
    /// Checks a TTL in seconds.
    pub fn check_ttl(&self, ttl: u64) -> Result<()> {
        if ttl == 0 || ttl > self.max_ttl_secs {
            return Err(SpecError::Invalid(format!(
                "ttl is {ttl} s; use 1 to {} s",
                self.max_ttl_secs
            )));
        }
        Ok(())
    }

    /// Whether every limit is within `outer` (a program may tighten this
    /// build's limits, not widen them).
    pub fn within(&self, outer: &Limits) -> bool {
        self.max_vcpus <= outer.max_vcpus
            && self.min_mem_mib >= outer.min_mem_mib
            && self.max_mem_mib <= outer.max_mem_mib
            && self.min_disk_mib >= outer.min_disk_mib
            && self.max_disk_mib <= outer.max_disk_mib
            && self.max_ttl_secs <= outer.max_ttl_secs
            && self.max_entries <= outer.max_entries
            && self.max_copy_out_bytes <= outer.max_copy_out_bytes
            && self.max_copy_out_entries <= outer.max_copy_out_entries
            && self.max_image_bytes <= outer.max_image_bytes
            && self.max_image_entries <= outer.max_image_entries
            && self.max_layer_bytes <= outer.max_layer_bytes
            && self.max_image_metadata_bytes <= outer.max_image_metadata_bytes
    }
}

/// How the last run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct LastExit {
    /// Unix ms when it ended.
    pub at_ms: u64,
    /// What happened, in words.
    pub reason: String,
    /// The last console lines, kept for crashes (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub console_tail: Vec<String>,
}

/// `meta.json`: a workspace's spec and state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Meta {
    /// Its full name: `name`, or `name.namespace` outside the default
    /// namespace.
    pub name: String,
    /// The namespace it is in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// What it was created with.
    pub spec: WorkspaceSpec,
    /// Unix ms of creation.
    pub created_at_ms: u64,
    /// Where it is in its life.
    pub state: State,
    /// Its VMM, while a VMM process is expected (null otherwise).
    #[serde(default)]
    pub runtime: Option<Runtime>,
    /// How the last run ended (null before the first).
    #[serde(default)]
    pub last_exit: Option<LastExit>,
    /// Never started: its disk is as `create` made it, so a start may
    /// resume its image's warm snapshot instead of booting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pristine: bool,
    /// Set while it is hibernated: when, and what was left of its TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernation: Option<Hibernation>,
    /// Milliseconds it spent hibernated before its current run or
    /// hibernation (counted apart from the time it ran: it cost nothing).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hibernated_ms: u64,
    /// Set on a member of an image's pool of ready workspaces (see
    /// `crate::pool`): listed by no one, claimed by a start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(skip))]
    pub pool: Option<PoolMember>,
}

/// What a pool member is ready for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolMember {
    /// The image it runs.
    pub image: String,
    /// The warm snapshot's fingerprint it was restored from: a member of
    /// another kernel or image build is drained, not claimed.
    pub fingerprint: String,
    /// Running, identity given, and paused: claimable.
    #[serde(default)]
    pub ready: bool,
    /// Its agent takes a new identity with a hello, so a claim leaves it
    /// to the first request instead of asking on a connection of its own.
    #[serde(default)]
    pub identity_with_hello: bool,
}

impl PoolMember {
    /// A member being filled: not ready yet, identity on a connection of
    /// its own.
    pub fn filling(image: &str, fingerprint: String) -> Self {
        PoolMember {
            image: image.to_owned(),
            fingerprint,
            ready: false,
            identity_with_hello: false,
        }
    }
}

/// How [`Workspace::delete`](crate::Workspace::delete) deletes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteOptions {
    /// Delete a running workspace too, halting it first (default: refuse).
    pub force: bool,
    /// Leave the outputs kept on the host for it until their TTL (a
    /// one-shot's, whose caller still has to read them); default: they go
    /// with it.
    pub keep_outputs: bool,
}

impl DeleteOptions {
    /// Sets [`DeleteOptions::force`].
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Sets [`DeleteOptions::keep_outputs`].
    pub fn keep_outputs(mut self, keep: bool) -> Self {
        self.keep_outputs = keep;
        self
    }
}

impl Meta {
    /// Leaves its hibernation at `now` (ms), as a VMM is launched from it
    /// or it is discarded: the hibernated time is counted apart, and the
    /// TTL of a run restored now goes on with what was left of it. That
    /// run's TTL deadline; None when it was not hibernated.
    pub fn leave_hibernation(&mut self, now: u64) -> Option<Option<u64>> {
        let h = self.hibernation.take()?;
        self.hibernated_ms = self
            .hibernated_ms
            .saturating_add(now.saturating_sub(h.at_ms));
        Some(h.ttl_left_ms.map(|left| now.saturating_add(left)))
    }

    /// A new workspace's record: stopped, never run, made now.
    pub fn created(name: &str, spec: WorkspaceSpec, pristine: bool) -> Self {
        Meta {
            name: name.to_owned(),
            namespace: crate::store::name::namespace_of(name).to_owned(),
            spec,
            created_at_ms: crate::host::settings::now_ms(),
            state: State::Stopped,
            runtime: None,
            last_exit: None,
            pristine,
            pool: None,
            hibernation: None,
            hibernated_ms: 0,
        }
    }

    /// Whether the workspace may be deleted as `options` say: one with a
    /// VMM only with `force` (which halts it first). The one place this
    /// rule lives.
    pub fn check_delete(&self, options: DeleteOptions) -> Result<()> {
        if self.state.has_machine() && !options.force {
            return Err(SpecError::DeleteRunning {
                name: self.name.clone(),
                state: self.state,
            });
        }
        Ok(())
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_people_write_them() {
        for (text, secs) in [
            ("90", 90),
            ("90s", 90),
            ("30m", 1800),
            ("1h", 3600),
            ("1h30m", 5400),
            ("2d", 172_800),
            (" 1d2h3m4s ", 93_784),
        ] {
            assert_eq!(parse_duration(text).unwrap(), secs, "{text}");
        }
        for bad in ["", "h", "1x", "1.5h", "-1", "1h30", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_services_ports_are_few_distinct_and_not_zero() {
        let with = |ports: Vec<u16>| WorkspaceSpec {
            serving: (!ports.is_empty()).then(|| services::Serving {
                workspace: "dev".into(),
                index: 0,
                service: "db".into(),
            }),
            service_ports: ports,
            ..WorkspaceSpec::default()
        };
        assert!(with(vec![5432, 6379]).validate().is_ok());
        assert!(with(vec![]).validate().is_ok());
        let unserving = WorkspaceSpec {
            serving: None,
            ..with(vec![80])
        };
        assert!(unserving.validate().is_err(), "ports serve a workspace");
        let nested = WorkspaceSpec {
            services: vec![services::parse_flag("x=y").unwrap()],
            ..with(vec![80])
        };
        assert!(nested.validate().is_err(), "a service names none");
        assert!(with(vec![0]).validate().is_err());
        assert!(with(vec![80, 80]).validate().is_err());
        let publishing = WorkspaceSpec {
            ports: vec![crate::store::ports::PortMapping::local(8080, 80)],
            ..with(vec![80])
        };
        assert!(
            publishing.validate().is_err(),
            "a service publishes nothing"
        );
        let many = (1..=services::MAX_SERVICE_PORTS as u16 + 1).collect();
        assert!(with(many).validate().is_err());
        // A record without the field reads as none, and none is not written.
        let json = serde_json::to_value(with(vec![])).unwrap();
        assert!(json.get("service_ports").is_none(), "{json}");
    }

    #[test]
    fn defaults_are_valid_and_limits_are_enforced() {
        WorkspaceSpec::default().validate().unwrap();
        type Case = Box<dyn Fn(&mut WorkspaceSpec)>;
        let cases: Vec<Case> = vec![
            Box::new(|s| s.vcpus = 0),
            Box::new(|s| s.vcpus = 9),
            Box::new(|s| s.mem_mib = 8),
            Box::new(|s| s.disk_mib = 1),
            Box::new(|s| s.ttl_secs = Some(0)),
            Box::new(|s| {
                s.env.insert("A B".into(), "x".into());
            }),
            Box::new(|s| {
                s.labels.insert(String::new(), "x".into());
            }),
            Box::new(|s| s.image.clear()),
        ];
        for (i, case) in cases.iter().enumerate() {
            let mut spec = WorkspaceSpec::default();
            case(&mut spec);
            let err = spec.validate().unwrap_err();
            assert_eq!(
                err.code(),
                crate::code::ErrorCode::InvalidInput,
                "case {i}: {err}"
            );
        }
    }

    #[test]
    fn hibernated_time_is_counted_apart_and_the_ttl_goes_on_from_what_was_left() {
        let mut meta = Meta::created("dev", WorkspaceSpec::default(), false);
        assert_eq!(meta.leave_hibernation(5_000), None);
        let mut h = Hibernation::new(1_000, "idle", None);
        h.ttl_left_ms = Some(30_000);
        meta.hibernation = Some(h);
        meta.hibernated_ms = 7;
        assert_eq!(meta.leave_hibernation(5_000), Some(Some(35_000)));
        assert_eq!(meta.hibernated_ms, 4_007);
        assert_eq!(meta.hibernation, None);
    }

    #[test]
    fn meta_round_trips() {
        let meta = Meta {
            name: "dev".into(),
            namespace: "default".into(),
            spec: WorkspaceSpec::default(),
            created_at_ms: 1,
            state: State::Running,
            runtime: Some(Runtime {
                pid: 42,
                pid_start: 7,
                started_at_ms: 2,
                ready_at_ms: Some(3),
                ttl_deadline_ms: None,
                start_kind: Some(StartKind::Warm),
                launched_mono_ns: Some(5),
                vcpu_running_us: Some(6),
                protections: Vec::new(),
                ready_us: Some(7),
                paused: Some(PauseCause::Idle),
                paused_at_ms: Some(8),
            }),
            last_exit: None,
            pristine: false,
            pool: None,
            hibernation: Some(Hibernation::new(9, "idle", None)),
            hibernated_ms: 10,
        };
        let json = serde_json::to_string(&meta).unwrap();
        assert_eq!(serde_json::from_str::<Meta>(&json).unwrap(), meta);
    }
}
