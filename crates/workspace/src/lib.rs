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
//! settings, host plans, kernels, budget), [`store`] (the state directory
//! and its records), [`network`], [`images`], [`vmm`] (what a VMM process
//! shares with the client), [`volumes`], [`secrets`], [`repos`] (the
//! repository allowlist), [`agents`] (MCP sessions' agents), [`pool`]
//! (pools of ready workspaces), [`tasks`], [`browser`] (a headless
//! Chromium's pages), [`servers`] (other hosts over SSH), [`guest`] (work
//! in a running guest) and [`host_tool`] (the one runner of host tools on
//! outside data); everything else a front end needs is at the root.

#![warn(missing_docs)]
// Without the `client` feature (the VMM process's build) the helpers only
// the client calls are unused.
#![cfg_attr(not(feature = "client"), allow(dead_code))]

#[cfg(feature = "client")]
pub(crate) mod admin;
pub mod agents;
#[cfg(feature = "client")]
pub mod browser;
pub(crate) mod code;
pub(crate) mod error;
pub(crate) mod error_chain;
pub mod guest;
pub mod host;
pub mod host_tool;
pub mod images;
pub mod network;
#[cfg(feature = "test-hooks")]
pub mod pause_point;
#[cfg(not(feature = "test-hooks"))]
pub(crate) mod pause_point;
pub mod pool;
pub(crate) mod remedy;
pub mod repos;
pub mod secrets;
#[cfg(feature = "client")]
pub mod servers;
#[cfg(feature = "client")]
pub(crate) mod snapshots;
pub mod store;
pub mod tasks;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod vmm;
pub mod volumes;
#[cfg(feature = "client")]
pub(crate) mod wire_bytes;
#[cfg(feature = "client")]
pub(crate) mod workspaces;

/// docs/library.md, whose examples `cargo test --doc` compiles.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryDoc;

#[cfg(all(test, feature = "schemars"))]
mod schema_tests;

/// Setting this host up (`ws.host_setup()`).
#[cfg(feature = "client")]
pub use admin::host_setup::HostSetup;
/// The pool of servers as a view reaches it (`ws.server_pool()`).
#[cfg(feature = "client")]
pub use admin::server_reports::ServerPool;
pub use code::ErrorCode;
pub use error::{Error, Result};
pub use error_chain::error_chain;
#[cfg(feature = "client")]
pub use guest::exec::{ExecRequest, ExecResult};
#[cfg(feature = "client")]
pub use guest::files::{FileRead, WriteOptions};
#[cfg(feature = "client")]
pub use guest::processes::ProcessInfo;
/// The input an exec takes (a stream, bytes, a terminal), so a program
/// needs no other crate to give it.
#[cfg(feature = "client")]
pub use guest::stream::ExecInput;
pub use remedy::Remedy;
#[cfg(feature = "client")]
pub use snapshots::{SnapshotInfo, Snapshots};
#[cfg(feature = "client")]
pub use store::egress::EgressDenials;
pub use store::events::{Event, EventKind};
pub use store::spec::{DeleteOptions, Limits, Meta, WorkspaceSpec, LIMITS};
pub use store::state::State;
pub use store::StateDir;
/// The guest kernel variant (standard, or compat for emulating hosts).
pub use vmm_core::KernelVariant;
#[cfg(feature = "client")]
pub use workspaces::builder::WorkspacesBuilder;
#[cfg(feature = "client")]
pub use workspaces::contract::{
    contract, Contract, CreateDefaults, StateEntry, EXEC_FAILURE_EXIT_CODE,
};
#[cfg(feature = "client")]
pub use workspaces::handle::Workspace;
#[cfg(feature = "client")]
pub use workspaces::lifecycle::{StartProgress, DEFAULT_START_TIMEOUT, DEFAULT_STOP_TIMEOUT};
#[cfg(feature = "client")]
pub use workspaces::manager::{ListFilter, WorkspaceInfo, Workspaces};
#[cfg(feature = "client")]
pub use workspaces::one_shot::{Afterwards, OneShot, OneShotEnd, ONE_SHOT_TTL_SECS};
#[cfg(feature = "client")]
pub use workspaces::placement::PlacementReservation;
#[cfg(feature = "client")]
pub use workspaces::pool::Pools;
#[cfg(feature = "client")]
pub use workspaces::tasks::Tasks;
#[cfg(feature = "client")]
pub use workspaces::volumes::Volumes;
