//! Why a client operation failed (both clients).

use std::io;
use std::path::PathBuf;

use crate::frame::FrameError;
use crate::protocol::{AgentErrorCode, Response};

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The Unix socket could not be connected.
    #[error("connecting to {}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The VMM's hybrid vsock socket did not answer `OK <port>`.
    #[error(
        "vsock port {port}: the VMM answered {reply:?} instead of OK (is the agent listening?)"
    )]
    Handshake {
        /// The guest port asked for.
        port: u32,
        /// What came back (empty if the socket closed).
        reply: String,
    },
    /// The handshake itself failed at the I/O level.
    #[error("vsock handshake for port {port}")]
    HandshakeIo {
        /// The guest port asked for.
        port: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading or writing a frame failed, or the agent sent a bad one.
    #[error("talking to the agent")]
    Frame(#[source] FrameError),
    /// Reading local input (stdin or upload source) or writing local output failed.
    #[error("local stream")]
    Local(#[source] io::Error),
    /// The agent closed the connection before the operation finished.
    #[error("the agent closed the connection before answering")]
    Closed,
    /// The agent answered with an `error` message.
    #[error("agent error {code}: {message}")]
    Agent {
        /// The agent's error code.
        code: AgentErrorCode,
        /// The agent's message.
        message: String,
    },
    /// The agent sent more data than the operation allows (more than the
    /// length asked for, or than the file it described).
    #[error("the agent sent more than the {limit} bytes the operation allows")]
    Oversized {
        /// The most the operation takes.
        limit: u64,
    },
    /// The agent sent nothing (or took nothing we sent) for longer than
    /// the call's deadline: it stopped answering.
    #[error("the agent stopped answering (nothing for {secs} s)")]
    Stalled {
        /// The deadline, in seconds.
        secs: u64,
    },
    /// The agent sent a message that does not fit the operation.
    #[error("unexpected {got} from the agent")]
    Unexpected {
        /// What came (message type or frame kind).
        got: String,
    },
}

impl ClientError {
    /// The agent's error code, when the agent answered with an error.
    pub fn code(&self) -> Option<AgentErrorCode> {
        match self {
            Self::Agent { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The VMM closed the handshake without an answer: the guest did not
    /// take the connection in time (a guest busy in emulated kernel mode
    /// can miss the VMM's deadline) or refused it. A later one may pass.
    pub fn unanswered(&self) -> bool {
        matches!(self, Self::Handshake { reply, .. } if reply.is_empty())
    }

    pub(crate) fn unexpected(resp: &Response) -> Self {
        Self::Unexpected {
            got: format!("`{}` message", resp.name()),
        }
    }

    #[cfg(feature = "client")]
    pub(crate) fn unexpected_frame(kind: crate::frame::FrameKind) -> Self {
        Self::Unexpected {
            got: format!("{kind:?} frame"),
        }
    }
}
