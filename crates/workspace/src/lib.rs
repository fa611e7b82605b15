//! Workspace management shared by the CLI and the MCP server.
//!
//! This first part is the ground the rest stands on: the stable error codes
//! front ends report ([`code`]), workspace name rules ([`name`]), the
//! workspace state machine ([`state`]) and the crash-safe state directory
//! ([`store`]). Starting VMM processes, exec and files come next (issue 5).

pub mod code;
pub mod doctor;
pub mod events;
pub mod name;
pub mod state;
pub mod store;

pub use code::ErrorCode;
pub use name::{validate_name, NameError};
pub use state::{State, TransitionError};
pub use store::{StateDir, StoreError, WorkspaceLock};
