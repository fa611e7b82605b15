//! What a workspace's record says of its running VMM: how it came up, its
//! deadline, its confinement, and whether its vCPUs are paused.

use serde::{Deserialize, Serialize};

/// The running VMM of a workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Runtime {
    /// The VMM process id on the host.
    pub pid: u32,
    /// The VMM process's start time in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`), so a recycled pid is never mistaken for it.
    pub pid_start: u64,
    /// Unix ms of the start request.
    pub started_at_ms: u64,
    /// Unix ms when the guest agent first answered (null while booting).
    #[serde(default)]
    pub ready_at_ms: Option<u64>,
    /// Unix ms when the TTL stops it (null without a TTL).
    #[serde(default)]
    pub ttl_deadline_ms: Option<u64>,
    /// How the machine came up (null in records of older versions).
    #[serde(default)]
    pub start_kind: Option<StartKind>,
    /// CLOCK_MONOTONIC ns when the VMM process was launched.
    #[serde(default)]
    pub launched_mono_ns: Option<u64>,
    /// Microseconds from the VMM process's launch to its first vCPU in
    /// the guest.
    #[serde(default)]
    pub vcpu_running_us: Option<u64>,
    /// Microseconds from the VMM process's launch to the agent answering.
    #[serde(default)]
    pub ready_us: Option<u64>,
    /// The confinement the VMM process runs under (docs/security.md):
    /// `seccomp` (a filter per thread role), `no_new_privs`.
    #[serde(default)]
    pub protections: Vec<String>,
    /// Its vCPUs are stopped, and why (null: they run). The state stays
    /// `running`: an idle-paused workspace resumes by itself on the next
    /// call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PauseCause>,
    /// Unix ms when it was paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at_ms: Option<u64>,
}

/// Why a running workspace's vCPUs are stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PauseCause {
    /// It sat idle past its `idle_pause`; the next call resumes it.
    Idle,
    /// `pause` (or a pool holding it ready): it waits for `resume`.
    Requested,
}

impl PauseCause {
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            PauseCause::Idle => "idle",
            PauseCause::Requested => "requested",
        }
    }
}

impl Runtime {
    /// The VMM process `pid` (started at `pid_start` ticks) launched at
    /// `now` (ms), not ready yet.
    pub fn launched(pid: u32, pid_start: u64, now: u64, ttl_deadline_ms: Option<u64>) -> Self {
        Runtime {
            pid,
            pid_start,
            started_at_ms: now,
            ready_at_ms: None,
            ttl_deadline_ms,
            start_kind: None,
            launched_mono_ns: None,
            vcpu_running_us: None,
            ready_us: None,
            protections: Vec::new(),
            paused: None,
            paused_at_ms: None,
        }
    }
}

/// How a workspace's machine came up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StartKind {
    /// A kernel boot.
    Cold,
    /// Restored from the warm snapshot of its image: no boot.
    Warm,
    /// Restored from a snapshot (a fork or a restore).
    Snapshot,
    /// Claimed from its image's pool of ready workspaces: restored from
    /// the warm snapshot before it was asked for, then given its name.
    Pooled,
    /// Restored from its own hibernation: as it was when it hibernated.
    Hibernation,
}

impl StartKind {
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            StartKind::Cold => "cold",
            StartKind::Warm => "warm",
            StartKind::Snapshot => "snapshot",
            StartKind::Pooled => "pooled",
            StartKind::Hibernation => "hibernation",
        }
    }
}

/// A hibernated workspace's machine, written into its directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Hibernation {
    /// Unix ms when it hibernated.
    pub at_ms: u64,
    /// What hibernated it: `request` or `idle`.
    pub by: String,
    /// What was left of its TTL, ms (null without one): hibernated time
    /// does not count against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_left_ms: Option<u64>,
    /// The VMM that wrote it (pid, start ticks), which a wake waits to be
    /// gone: it records the hibernation before it exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmm: Option<(u32, u64)>,
}

impl Hibernation {
    /// Hibernated at `at_ms` by `by`, from a run described by `runtime`.
    pub fn new(at_ms: u64, by: &str, runtime: Option<&Runtime>) -> Self {
        Hibernation {
            at_ms,
            by: by.to_owned(),
            ttl_left_ms: runtime
                .and_then(|r| r.ttl_deadline_ms)
                .map(|d| d.saturating_sub(at_ms)),
            vmm: runtime.map(|r| (r.pid, r.pid_start)),
        }
    }
}
