//! Every tool's input (`Parameters<T>`) and output types, with the JSON
//! schemas clients see, and the short text rendering of each output. Inputs
//! reject unknown fields, so a misspelt argument is a JSON-RPC error rather
//! than silently ignored.
//!
//! This module holds what several tool families share: the workspace record
//! as tools report it.

pub mod exec;
pub mod files;
pub mod info;
pub mod lifecycle;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::{Meta, State};

use crate::output::Render;

/// A workspace state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// Defined on disk, not running.
    Stopped,
    /// Booting.
    Starting,
    /// Running: its agent answers; exec and files work.
    Running,
    /// Shutting down.
    Stopping,
    /// Its VM died without being asked to.
    Crashed,
}

impl From<State> for StateName {
    fn from(s: State) -> Self {
        match s {
            State::Stopped => StateName::Stopped,
            State::Starting => StateName::Starting,
            State::Running => StateName::Running,
            State::Stopping => StateName::Stopping,
            State::Crashed => StateName::Crashed,
        }
    }
}

impl From<StateName> for State {
    fn from(s: StateName) -> Self {
        match s {
            StateName::Stopped => State::Stopped,
            StateName::Starting => State::Starting,
            StateName::Running => State::Running,
            StateName::Stopping => State::Stopping,
            StateName::Crashed => State::Crashed,
        }
    }
}

/// The running VM of a workspace.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct RuntimeView {
    /// The VMM process id on the host.
    pub pid: u32,
    /// Unix milliseconds of the start request.
    pub started_at_ms: u64,
    /// Unix milliseconds when the guest agent first answered.
    pub ready_at_ms: Option<u64>,
    /// Unix milliseconds when the TTL stops it.
    pub ttl_deadline_ms: Option<u64>,
}

/// How the last run ended.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct LastExitView {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// What happened, in words.
    pub reason: String,
    /// The last console lines (kept for crashes).
    pub console_tail: Vec<String>,
}

/// A workspace: its spec and state.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct WorkspaceView {
    /// Its name.
    pub name: String,
    /// Where it is in its life.
    pub state: StateName,
    /// Its image.
    pub image: String,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
    /// Writable disk, MiB.
    pub disk_mib: u64,
    /// Added to every command's environment.
    pub env: BTreeMap<String, String>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// Seconds after each start when it is stopped.
    pub ttl_secs: Option<u64>,
    /// Unix milliseconds of creation.
    pub created_at_ms: u64,
    /// Its VM, while one is expected to run.
    pub runtime: Option<RuntimeView>,
    /// How its last run ended.
    pub last_exit: Option<LastExitView>,
}

impl From<Meta> for WorkspaceView {
    fn from(m: Meta) -> Self {
        Self {
            name: m.name,
            state: m.state.into(),
            image: m.spec.image,
            vcpus: m.spec.vcpus,
            mem_mib: m.spec.mem_mib,
            disk_mib: m.spec.disk_mib,
            env: m.spec.env,
            labels: m.spec.labels,
            ttl_secs: m.spec.ttl_secs,
            created_at_ms: m.created_at_ms,
            runtime: m.runtime.map(|r| RuntimeView {
                pid: r.pid,
                started_at_ms: r.started_at_ms,
                ready_at_ms: r.ready_at_ms,
                ttl_deadline_ms: r.ttl_deadline_ms,
            }),
            last_exit: m.last_exit.map(|e| LastExitView {
                at_ms: e.at_ms,
                reason: e.reason,
                console_tail: e.console_tail,
            }),
        }
    }
}

impl Render for WorkspaceView {
    fn render(&self) -> String {
        let mut line = format!(
            "{}: {} ({} image, {} vCPU, {} MiB memory, {} MiB disk{})",
            self.name,
            serde_json::to_value(self.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            self.image,
            self.vcpus,
            self.mem_mib,
            self.disk_mib,
            self.ttl_secs
                .map(|t| format!(", ttl {t} s"))
                .unwrap_or_default()
        );
        if let Some(exit) = &self.last_exit {
            line.push_str(&format!("; last run: {}", exit.reason));
        }
        line
    }
}

/// Inputs of tools that take no arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_both_ways_with_the_library_names() {
        for state in State::ALL {
            let name = StateName::from(state);
            assert_eq!(State::from(name), state);
            assert_eq!(
                serde_json::to_value(name).unwrap(),
                serde_json::to_value(state).unwrap()
            );
        }
    }
}
