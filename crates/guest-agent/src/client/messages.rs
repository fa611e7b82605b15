//! The messages both clients exchange, without I/O: what every operation
//! sends first, how an answer is decoded, and the VMM's handshake reply.

use crate::frame;
use crate::protocol::{NewIdentity, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::ClientError;

/// The agent's answer to `hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHello {
    /// Protocol version.
    pub version: u32,
    /// Agent name and version.
    pub agent: String,
    /// Supported operations.
    pub capabilities: Vec<String>,
}

/// The host's wall clock now, Unix nanoseconds.
pub(crate) fn host_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `hello` in `version`, with `identity` and the host's clock read now.
pub(crate) fn hello_now(version: u32, identity: Option<&NewIdentity>) -> Request {
    let now = host_now_ns();
    Request::Hello {
        version,
        identity: identity.map(|identity| NewIdentity {
            unix_time_ns: now,
            ..identity.clone()
        }),
        host_time_ns: Some(now),
    }
}

/// `hello` and `req`, framed: what every operation sends first, in one write.
pub(crate) fn start_bytes(
    req: &Request,
    identity: Option<&NewIdentity>,
) -> Result<Vec<u8>, ClientError> {
    // Version 1 unless the request needs 2, so agents in older guests
    // still answer everything they can.
    let version = match req {
        Request::Exec(exec) if exec.pty.is_some() => PROTOCOL_VERSION,
        _ => MIN_PROTOCOL_VERSION,
    };
    let hello = hello_now(version, identity);
    let mut bytes = frame::encode_json(&hello).map_err(ClientError::Frame)?;
    bytes.extend(frame::encode_json(req).map_err(ClientError::Frame)?);
    Ok(bytes)
}

pub(crate) fn decode(frame: &frame::Frame) -> Result<Response, ClientError> {
    match frame::decode_json(frame).map_err(ClientError::Frame)? {
        Response::Error { code, message } => Err(ClientError::Agent { code, message }),
        resp => Ok(resp),
    }
}

/// The agent's `hello` answer, which every operation's answer starts with.
pub(crate) fn hello_of(resp: Response) -> Result<AgentHello, ClientError> {
    match resp {
        Response::Hello {
            version,
            agent,
            capabilities,
        } => Ok(AgentHello {
            version,
            agent,
            capabilities,
        }),
        other => Err(ClientError::unexpected(&other)),
    }
}

pub(crate) fn expect_ok(resp: Response) -> Result<Response, ClientError> {
    match resp {
        Response::Ok { .. } => Ok(resp),
        other => Err(ClientError::unexpected(&other)),
    }
}

/// Checks the VMM's answer (the line before its newline) to
/// `CONNECT <port>`: `OK <host-port>`.
pub(crate) fn handshake_reply(line: &[u8], port: u32) -> Result<(), ClientError> {
    let reply = String::from_utf8_lossy(line).into_owned();
    match reply.strip_prefix("OK ") {
        Some(n) if n.trim().parse::<u32>().is_ok() => Ok(()),
        _ => Err(ClientError::Handshake { port, reply }),
    }
}
