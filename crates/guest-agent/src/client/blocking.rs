//! A blocking client on std sockets for the calls a VMM process makes
//! (`ping` until the agent answers, `restored` after a snapshot restore,
//! `shutdown` on stop), so the VMM process needs no async runtime. Each
//! operation ends by one deadline, however slowly the guest answers.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::messages::{
    decode, expect_ok, handshake_reply, hello_now, hello_of, host_now_ns, start_bytes,
};
use super::AgentHello;
use super::ClientError;
use crate::frame;
use crate::protocol::{ReclaimAnswer, Request, Response, VolumeToMount, MIN_PROTOCOL_VERSION};

/// One connection to the agent through the VMM's hybrid vsock socket,
/// good for one operation.
#[derive(Debug)]
pub struct BlockingClient {
    stream: UnixStream,
    /// When the operation, handshake included, must be done.
    deadline: Instant,
}

/// Reads from `stream` until `deadline`: a read timeout alone bounds each
/// read, and a guest sending a byte just before each one ran out would
/// hold its caller without end.
struct ByDeadline<'a> {
    stream: &'a mut UnixStream,
    deadline: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl BlockingClient {
    /// Connects to guest vsock `port` behind the hybrid vsock socket
    /// `uds_path` (`CONNECT <port>` handshake); the handshake and the one
    /// operation after it end within `timeout` (each write too).
    pub fn connect_hybrid_vsock(
        uds_path: &Path,
        port: u32,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let mut stream = UnixStream::connect(uds_path).map_err(|source| ClientError::Connect {
            path: uds_path.to_owned(),
            source,
        })?;
        let deadline = Instant::now() + timeout;
        let io_err = |source| ClientError::HandshakeIo { port, source };
        stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
        stream
            .write_all(format!("CONNECT {port}\n").as_bytes())
            .map_err(io_err)?;
        // Byte by byte: nothing past the newline belongs to the handshake.
        let mut line = Vec::new();
        let mut reader = ByDeadline {
            stream: &mut stream,
            deadline,
        };
        loop {
            let mut b = [0u8];
            if reader.read(&mut b).map_err(io_err)? == 0 || b[0] == b'\n' {
                break;
            }
            line.push(b[0]);
            if line.len() > 64 {
                break;
            }
        }
        handshake_reply(&line, port)?;
        Ok(Self { stream, deadline })
    }

    /// `ping`: the agent's uptime.
    pub fn ping(self) -> Result<Duration, ClientError> {
        match self.call(&Request::Ping)? {
            Response::Pong { uptime_ms } => Ok(Duration::from_millis(uptime_ms)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// `shutdown`: syncs the guest's filesystems and restarts it. A
    /// connection that closes before the answer also means the guest is
    /// going down.
    pub fn shutdown(self) -> Result<(), ClientError> {
        match self.call(&Request::Shutdown) {
            Ok(resp) => expect_ok(resp).map(drop),
            Err(ClientError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Only the handshake: what the agent is and supports.
    pub fn hello(mut self) -> Result<AgentHello, ClientError> {
        let hello = hello_now(MIN_PROTOCOL_VERSION, None);
        let bytes = frame::encode_json(&hello).map_err(ClientError::Frame)?;
        self.send(&bytes)?;
        hello_of(self.response()?)
    }

    /// `restored`: the guest takes `hostname`, mixes `entropy` into its
    /// random pool and reseeds it, and sets its clock to the host's, read
    /// as the request is made. The agent's hello (what it supports).
    pub fn restored(
        self,
        hostname: &str,
        entropy: &[u8],
        network: Option<(String, [u8; 6])>,
    ) -> Result<AgentHello, ClientError> {
        let entropy = entropy.iter().map(|b| format!("{b:02x}")).collect();
        let (network, mac) = match network {
            Some((setting, mac)) => (Some(setting), Some(format_mac(mac))),
            None => (None, None),
        };
        let req = Request::Restored {
            hostname: hostname.to_owned(),
            entropy,
            unix_time_ns: host_now_ns(),
            network,
            mac,
        };
        let (hello, answer) = self.call_keeping_hello(&req)?;
        expect_ok(answer)?;
        Ok(hello)
    }

    /// `mount_volumes`: the guest mounts each volume's disk (found by its
    /// serial) on its path.
    pub fn mount_volumes(self, volumes: Vec<VolumeToMount>) -> Result<(), ClientError> {
        expect_ok(self.call(&Request::MountVolumes { volumes })?).map(drop)
    }

    /// `reclaim`: an idle guest drops its caches (see the request).
    pub fn reclaim(self, idle_secs: u64) -> Result<ReclaimAnswer, ClientError> {
        match self.call(&Request::Reclaim { idle_secs })? {
            Response::Reclaimed(answer) => Ok(answer),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// `tcp_connect`: the agent connects to 127.0.0.1:`port` in the guest;
    /// the returned stream then carries that TCP connection's bytes, with
    /// no timeouts.
    pub fn tcp_connect(mut self, port: u16) -> Result<UnixStream, ClientError> {
        let bytes = start_bytes(&Request::TcpConnect { port }, None)?;
        self.send(&bytes)?;
        hello_of(self.response()?)?;
        expect_ok(self.response()?)?;
        self.stream
            .set_read_timeout(None)
            .map_err(ClientError::Local)?;
        self.stream
            .set_write_timeout(None)
            .map_err(ClientError::Local)?;
        Ok(self.stream)
    }

    fn call(self, req: &Request) -> Result<Response, ClientError> {
        self.call_keeping_hello(req).map(|(_, answer)| answer)
    }

    fn call_keeping_hello(mut self, req: &Request) -> Result<(AgentHello, Response), ClientError> {
        let bytes = start_bytes(req, None)?;
        self.send(&bytes)?;
        let hello = hello_of(self.response()?)?;
        Ok((hello, self.response()?))
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream
            .write_all(bytes)
            .map_err(|e| ClientError::Frame(frame::FrameError::Write(e)))
    }

    fn response(&mut self) -> Result<Response, ClientError> {
        let mut reader = ByDeadline {
            stream: &mut self.stream,
            deadline: self.deadline,
        };
        let frame = frame::read_frame(&mut reader)
            .map_err(ClientError::Frame)?
            .ok_or(ClientError::Closed)?;
        decode(&frame)
    }
}

/// `02:4d:00:11:22:33`.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
