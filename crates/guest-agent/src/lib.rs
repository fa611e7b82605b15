//! The microagent guest agent's protocol, shared by the agent
//! (`microagent-agent`, which runs inside every guest and listens on
//! virtio-vsock) and the host.
//!
//! - [`frame`]: the framing (u32 LE length, kind byte, payload) with
//!   blocking read/write functions;
//! - [`protocol`]: the JSON messages, limits and error codes of version 1;
//! - [`users`]: user names (`node`, `1000:50`) resolved against /etc/passwd;
//! - `client`: with cargo feature `blocking-client` a blocking client on std
//!   sockets (for the VMM process); with `client` also [`GuestAgentClient`], an async tokio
//!   client over any `AsyncRead + AsyncWrite` stream, with
//!   [`connect_unix`] and [`connect_hybrid_vsock`] to open one.
//!
//! The protocol is documented in `docs/guest-agent-protocol.md`.

pub mod frame;
pub mod pipe;
pub mod protocol;
pub mod users;

#[cfg(feature = "blocking-client")]
pub mod client;

/// A hostile agent for the host side's tests.
#[cfg(feature = "fake")]
pub mod fake;

#[cfg(feature = "client")]
pub use client::{
    connect_hybrid_vsock, connect_unix, AgentEndpoint, ExecOutcome, ExecOutput, ExecStdin,
    ExecUpdate, FileHeader, GuestAgentClient, ProcessRead, PtyInput,
};
#[cfg(feature = "blocking-client")]
pub use client::{AgentHello, ClientError};
pub use frame::{Frame, FrameError, FrameKind};
pub use protocol::{
    AgentErrorCode, DiskUsage, EntryKind, ExecCall, ExecExit, ListedEntry, Request, Response,
    SignalSpec, StatAnswer, StdinMode, SystemInfo, WinSize, WriteMode, PROTOCOL_VERSION,
};
