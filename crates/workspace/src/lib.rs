//! Workspace management shared by the CLI and the MCP server.
//!
//! [`Workspaces`] is the API: images ([`image`]), the life cycle
//! ([`manager`]: create, start, stop, halt, delete, list, inspect, TTL) and
//! what runs inside ([`ops`]: exec, files, copies, logs, events). Each
//! running workspace is one detached VMM process ([`vmm_host`]) with a
//! control socket ([`control`]). State lives in a crash-safe directory
//! ([`store`], [`workspace_dir`]); every failure carries a stable
//! [`ErrorCode`].

#![warn(missing_docs)]

pub mod builder;
pub mod code;
pub mod console_log;
pub mod contract;
pub mod control;
pub mod doctor;
pub mod error;
pub mod events;
pub mod handle;
pub mod image;
pub mod launch;
pub mod manager;
pub mod name;
pub mod one_shot;
pub mod ops;
pub mod process;
pub mod remedy;
pub mod settings;
pub mod spec;
pub mod state;
pub mod store;
pub mod vmm_host;
pub mod workspace_dir;

#[cfg(all(test, feature = "schemars"))]
mod schema_tests;

pub use builder::WorkspacesBuilder;
pub use code::ErrorCode;
pub use error::{Error, Result};
/// The guest agent's request and result types the exec and file methods take
/// and return, so a program needs no other crate to use them.
pub use guest_agent::client::{ExecEvent, ExecInput, ExecOutput};
pub use guest_agent::protocol::{DirEntry, ExecRequest, Exited, FileKind, FileStat, WriteMode};
pub use handle::Workspace;
pub use manager::{ListFilter, StartProgress, WorkspaceInfo, Workspaces};
pub use name::{validate_name, NameError};
pub use one_shot::{Afterwards, OneShot, OneShotEnd};
pub use ops::{ConsoleChunk, DirListing, ExecEnd, FileRead, WriteOptions};
pub use remedy::Remedy;
pub use spec::{Meta, WorkspaceSpec};
pub use state::{State, TransitionError};
pub use store::{StateDir, StoreError, WorkspaceLock};
