//! The VMM process of one workspace (the `microagent-vmm` program, started
//! by `microagent start` with the arguments `base::vmm::launch::VmmLaunch`
//! writes). It links no async runtime, command-line parser or MCP server:
//! only vmm-core, the guest agent's blocking client and the records and
//! host facts of the `base` crate, which it shares with the library.
//!
//! - [`process`]: [`VmmProcess`], the process from launch to exit: its
//!   setup steps in order, its threads and the control socket it serves;
//! - [`error`]: [`VmmProcessError`], why it could not do something;
//! - [`guard`]: what confines it (seccomp, the jail, resource limits) and
//!   the owner process a one-shot workspace lives for;
//! - [`file_access`]: Landlock, the files and sockets it may still reach;
//! - [`port_forward`]: published ports, host TCP to guest vsock;
//! - [`seccomp`]: what its control threads may do under seccomp;
//! - [`standby`]: a VMM process made before its workspace is known.

mod build;
mod egress;
pub mod error;
pub mod file_access;
pub mod guard;
mod guest_ready;
pub mod port_forward;
pub mod process;
pub mod seccomp;
pub mod standby;

pub use error::VmmProcessError;
pub use process::{RunEnd, VmmProcess, VmmStopper};

/// A named pause point of the kill -9 suite (cargo feature `test-hooks`,
/// which shipped builds never enable); nothing otherwise.
fn pause_point(name: &str) {
    #[cfg(feature = "test-hooks")]
    base::pause_point::pause_point(name);
    #[cfg(not(feature = "test-hooks"))]
    let _ = name;
}
