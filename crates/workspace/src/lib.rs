//! Workspaces (disposable Linux microVMs) as a library: what the CLI and the
//! MCP server use, and what a Rust program embeds (docs/library.md).
//!
//! [`Workspaces`] is the API ([`Workspaces::builder`] opens a state
//! directory; [`Workspace`] is one workspace by name): images ([`image`]),
//! the life cycle ([`Workspaces::create`], [`Workspaces::start`], stop,
//! halt, delete, list, inspect, TTL), commands ([`ExecRequest`] to
//! [`ExecResult`]), background processes ([`Workspaces::process_start`]), files and copies ([`Workspaces::read_file`],
//! [`Workspaces::copy_in`], ...), console logs and [`Event`]s, and the
//! one-shot use case ([`Workspaces::run_once`]). Each running workspace is
//! one detached VMM process ([`vmm_host`], started as
//! [`launch::VmmLaunch`] says) with a control socket. State lives in a
//! crash-safe directory ([`StateDir`]); every failure carries a stable
//! [`ErrorCode`] and, where the caller can act, a [`Remedy`]. The public
//! modules are namespaces of their own: [`image`], [`oci`],
//! [`image_build`], [`kernel_install`] and [`setup`] (images and kernels;
//! the host changes among them are preview-then-confirm, [`plan`]),
//! [`budget`] and [`cgroup`] (host limits), [`doctor`] (host checks),
//! [`settings`] (asset paths, clock, ids), [`launch`] and [`vmm_host`] (the
//! VMM process), and a few more listed in docs/library.md; everything else
//! is at the root.

#![warn(missing_docs)]

pub mod assets;
pub mod budget;
pub(crate) mod builder;
pub mod cgroup;
pub(crate) mod code;
pub(crate) mod console_log;
pub(crate) mod contract;
pub(crate) mod control;
pub mod doctor;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod exec;
pub(crate) mod guest_processes;
pub(crate) mod handle;
pub mod host_write;
pub mod image;
pub mod image_build;
pub mod kernel_build;
pub mod kernel_install;
pub mod kernels;
pub mod launch;
pub(crate) mod manager;
pub(crate) mod metrics;
pub(crate) mod name;
pub mod network;
pub(crate) mod network_ops;
pub mod oci;
pub(crate) mod one_shot;
pub(crate) mod ops;
pub mod pause_point;
pub mod plan;
pub(crate) mod port_forward;
pub mod ports;
pub(crate) mod process;
pub(crate) mod remedy;
pub mod settings;
pub mod setup;
pub(crate) mod snapshots;
pub(crate) mod spec;
pub(crate) mod state;
pub(crate) mod store;
pub mod vmm_guard;
pub mod vmm_host;
pub(crate) mod vmm_jail;
pub(crate) mod warm;
pub(crate) mod workspace_dir;

#[cfg(all(test, feature = "schemars"))]
mod schema_tests;

pub use builder::WorkspacesBuilder;
pub use code::ErrorCode;
pub use console_log::ConsoleLogError;
pub use contract::{contract, Contract, CreateDefaults, StateEntry, EXEC_FAILURE_EXIT_CODE};
pub use control::ControlError;
pub use error::{error_chain, Error, Result};
pub use events::{Event, EventKind, EventsError};
pub use exec::{ExecEnd, ExecRequest, ExecResult, Exited, OutputCollector, MAX_COLLECTED_BYTES};
/// The guest agent's streaming and file types the exec and file methods
/// take and return, so a program needs no other crate to use them.
pub use guest_agent::client::{ExecEvent, ExecInput, TerminalInput};
pub use guest_agent::protocol::{DirEntry, FileKind, FileStat, PtySize, WriteMode};
pub use guest_processes::{
    ProcessInfo, ProcessOptions, ProcessOutput, ProcessState, StreamOutput, DEFAULT_PROCESS_RING,
    MAX_FINISHED_PROCESSES, MAX_PROCESS_READ, MAX_PROCESS_RING, MAX_RUNNING_PROCESSES,
};
pub use handle::Workspace;
pub use manager::{ListFilter, StartProgress, WorkspaceInfo, Workspaces};
pub use manager::{DEFAULT_START_TIMEOUT, DEFAULT_STOP_TIMEOUT};
pub use metrics::{WorkspaceMetrics, CPU_SAMPLE};
pub use name::{validate_name, NameError};
pub use network_ops::{GuestNetwork, HostChange, NetworkInfo};
pub use one_shot::{Afterwards, OneShot, OneShotEnd, ONE_SHOT_TTL_SECS};
pub use ops::{ConsoleChunk, DirListing, FileRead, WriteOptions, MAX_EVENT_WAIT};
pub use remedy::Remedy;
pub use snapshots::SnapshotInfo;
pub use spec::{
    defaults, parse_duration, validate_ttl, DeleteOptions, LastExit, Limits, Meta, Owner, Runtime,
    StartKind, WorkspaceSpec, LIMITS,
};
pub use state::{State, TransitionError};
pub use store::{StateDir, StoreError, WorkspaceLock};
/// The guest kernel variant (standard, or compat for emulating hosts).
pub use vmm_core::KernelVariant;
