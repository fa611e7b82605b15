//! `tcp_connect`: the connection becomes a byte pipe to a TCP port on the
//! guest's loopback. The VMM process tunnels each connection to a published
//! port this way (docs/networking.md), so ports work without a network.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use guest_agent::frame::FrameError;
use guest_agent::protocol::{AgentErrorCode, Response};

use super::conn::Conn;

/// Longest the agent waits for the guest's server to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a `tcp_connect` failed.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// Port 0 names no server.
    #[error("port 0 cannot be connected to")]
    PortZero,
    /// Nothing listens there.
    #[error("nothing accepts connections on 127.0.0.1:{port} in the guest")]
    Refused {
        /// The guest port.
        port: u16,
        /// What connect said.
        #[source]
        source: io::Error,
    },
    /// Connecting failed otherwise.
    #[error("could not connect to 127.0.0.1:{port} in the guest")]
    Connect {
        /// The guest port.
        port: u16,
        /// What connect said.
        #[source]
        source: io::Error,
    },
    /// The `ok` could not be sent.
    #[error("sending the answer")]
    Send(#[source] FrameError),
    /// The pipe could not be set up.
    #[error("setting up the byte pipe")]
    Pipe(#[source] io::Error),
}

impl TunnelError {
    /// The wire code.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::PortZero => AgentErrorCode::InvalidInput,
            Self::Refused { .. } => AgentErrorCode::ConnectionRefused,
            Self::Connect { source, .. } => AgentErrorCode::from_io(source.kind()),
            Self::Send(e) => e.code(),
            Self::Pipe(_) => AgentErrorCode::Internal,
        }
    }
}

/// Connects to 127.0.0.1:`port`, answers `ok`, then copies bytes both ways
/// until both directions have ended.
pub fn tcp_connect(conn: &mut Conn, port: u16) -> Result<(), TunnelError> {
    if port == 0 {
        return Err(TunnelError::PortZero);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let tcp = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|source| {
        if source.kind() == io::ErrorKind::ConnectionRefused {
            TunnelError::Refused { port, source }
        } else {
            TunnelError::Connect { port, source }
        }
    })?;
    conn.send(&Response::ok()).map_err(TunnelError::Send)?;
    let (vsock, early) = conn.raw_stream().map_err(TunnelError::Pipe)?;
    // Bytes the client sent right behind its request come first.
    (&tcp).write_all(&early).map_err(TunnelError::Pipe)?;
    guest_agent::pipe::pipe(vsock, tcp).map_err(TunnelError::Pipe)
}
