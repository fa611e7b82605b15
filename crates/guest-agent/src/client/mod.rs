//! Clients a host uses to talk to the agent. Cargo feature
//! `blocking-client`: [`blocking::BlockingClient`] on std sockets, for the
//! VMM process, which has no async runtime. Cargo feature `client` adds the
//! async tokio client a host library uses.
//!
//! The protocol carries one operation per connection, so a
//! [`GuestAgentClient`] wraps one freshly opened stream and each operation
//! consumes it. [`AgentEndpoint`] opens a new one per operation; run
//! operations concurrently by opening several. Every operation sends
//! `hello` and its request in one write (no round trip for the handshake).

pub mod blocking;
mod error;
mod messages;
#[cfg(feature = "client")]
mod process;
#[cfg(feature = "client")]
mod session;
#[cfg(feature = "client")]
mod types;
#[cfg(feature = "client")]
mod watch;
#[cfg(feature = "client")]
mod wire;

pub use error::ClientError;
pub use messages::AgentHello;
#[cfg(feature = "client")]
pub use process::ProcessRead;
#[cfg(feature = "client")]
pub use session::{GuestAgentClient, IDLE_DEADLINE};
#[cfg(feature = "client")]
pub use types::{
    ExecCollector, ExecOutcome, ExecOutput, ExecStdin, ExecUpdate, FileHeader, PtyInput,
};
#[cfg(feature = "client")]
pub use wire::{connect_hybrid_vsock, connect_unix, AgentEndpoint};
