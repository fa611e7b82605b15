//! Workspaces (disposable Linux microVMs) as a library: what the CLI and the
//! MCP server use, and what a Rust program embeds (docs/library.md).
//!
//! [`Workspaces`] is the API ([`Workspaces::builder`] opens a state
//! directory; [`Workspace`] is one workspace by name): the life cycle
//! ([`Workspaces::create`], [`Workspace::start`], stop, halt, delete, list,
//! inspect, TTL), commands ([`ExecRequest`] to [`ExecResult`]), background
//! processes ([`Workspace::processes`]), files and copies
//! ([`Workspace::files`]: read_file, copy_in, ...), console logs
//! and [`Event`]s, snapshots and forks, and the one-shot use case
//! ([`Workspaces::run_once`]). Each running workspace is one detached VMM
//! process (crates/vmm-host, started as [`vmm::launch::VmmLaunch`] says)
//! with a control socket. State lives in a crash-safe directory
//! ([`StateDir`]); every failure carries a stable [`ErrorCode`] and, where
//! the caller can act, a [`Remedy`].
//!
//! The code is in folders by concern (docs/architecture.md); the public
//! modules are the namespaces of one concern each: [`host`] (paths,
//! settings, host plans, budget), [`store`] (the state directory and its
//! records), [`network`], [`images`], [`kernels`] (guest kernels), [`vmm`] (what a VMM process
//! shares with the client), [`volumes`], [`secrets`], [`repos`] (the
//! repository allowlist), [`agents`] (MCP sessions' agents), [`pool`]
//! (pools of ready workspaces), [`previews`] (preview URLs of guest
//! ports), [`services`] (a workspace's sidecars),
//! [`tasks`], [`browser`] (a headless
//! Chromium's pages), [`code_sessions`] (Jupyter kernels' runs),
//! [`servers`] (other hosts over SSH), [`guest`] (work
//! in a running guest), [`sizes`] (sizes as people write them, `1g`) and
//! [`host_tool`] (the one runner of host tools on
//! outside data); everything else a front end needs is at the root.

#![warn(missing_docs)]

pub(crate) mod admin;
pub mod agents;
pub mod browser;
pub mod code_sessions;
pub(crate) mod error;
pub mod guest;
pub mod host;
pub mod images;
pub mod kernels;
pub mod network;
pub mod pool;
pub mod previews;
pub mod repos;
pub mod secrets;
pub mod servers;
pub mod services;
pub mod sizes;
pub(crate) mod snapshots;
pub mod tasks;
pub mod volumes;
pub(crate) mod wire_bytes;
pub(crate) mod workspaces;

#[cfg(any(test, feature = "test-support"))]
pub use base::test_support;
/// The records, VMM launch and control, jail and cgroup, and volumes the
/// VMM process shares (crates/base), for front ends.
pub use base::{host_tool, pause_point, store, vmm};

/// docs/library.md, whose examples `cargo test --doc` compiles.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryDoc;

#[cfg(all(test, feature = "schemars"))]
mod schema_tests;

/// Setting this host up (`ws.host_setup()`).
/// The pool of servers as a view reaches it (`ws.server_pool()`).
pub use base::code::ErrorCode;
pub use base::error_chain::error_chain;
pub use base::remedy::Remedy;
pub use base::store::egress::EgressDenials;
pub use base::store::events::{Event, EventKind};
pub use base::store::spec::{DeleteOptions, Limits, Meta, WorkspaceSpec, LIMITS};
pub use base::store::state::State;
pub use base::store::StateDir;
pub use error::{Error, Result};
pub use guest::files::{FileRead, WriteOptions};
pub use guest::processes::ProcessInfo;
pub use guest::request::{ExecRequest, ExecResult};
/// The input an exec takes (a stream, bytes, a terminal), so a program
/// needs no other crate to give it.
pub use guest::stream::ExecInput;
pub use pool::Pools;
pub use snapshots::SnapshotInfo;
/// The guest kernel variant (standard, or compat for emulating hosts).
pub use vmm_core::KernelVariant;
pub use workspaces::builder::WorkspacesBuilder;
pub use workspaces::contract::{
    contract, Contract, CreateDefaults, StateEntry, EXEC_FAILURE_EXIT_CODE,
};
pub use workspaces::egress::WorkspaceEgress;
pub use workspaces::handle::Workspace;
pub use workspaces::lifecycle::hibernation::DEFAULT_HIBERNATE_TIMEOUT;
pub use workspaces::lifecycle::{StartProgress, DEFAULT_START_TIMEOUT, DEFAULT_STOP_TIMEOUT};
pub use workspaces::manager::{ListFilter, WorkspaceInfo, Workspaces};
pub use workspaces::one_shot::{Afterwards, OneShot, OneShotEnd, ONE_SHOT_TTL_SECS};
pub use workspaces::placement::PlacementReservation;
pub use workspaces::ports::WorkspacePorts;
pub use workspaces::services::{
    HostSetup, Images, Kernels, Metrics, ServerPool, Snapshots, Tasks, Volumes,
};
