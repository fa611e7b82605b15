//! The client's side of the wire: its error type, async framing, the data
//! and stdin streams, and opening a stream to the agent (Unix socket, or
//! the VMM's hybrid vsock socket with its `CONNECT <port>` handshake).

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use super::messages::handshake_reply;
use super::{ClientError, ExecStdin, GuestAgentClient, PtyInput};
use crate::frame::{self, Frame, FrameError, FrameKind};
use crate::protocol::{Request, DATA_CHUNK};

/// Reads the next frame, waiting at most `idle` for it; the end of the
/// stream is [`ClientError::Closed`].
pub(crate) async fn next_frame<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    idle: std::time::Duration,
) -> Result<crate::frame::Frame, ClientError> {
    match tokio::time::timeout(idle, read_frame(r)).await {
        Ok(read) => read.map_err(ClientError::Frame)?.ok_or(ClientError::Closed),
        Err(_) => Err(ClientError::Stalled {
            secs: idle.as_secs(),
        }),
    }
}

/// Reads one frame; `None` on a clean end of stream.
pub(crate) async fn read_frame<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) => return Err(FrameError::Read(e)),
        }
    }
    let payload_len = frame::payload_len(u32::from_le_bytes(len))?;
    let mut kind = [0u8];
    read_exact(r, &mut kind).await?;
    let kind = FrameKind::from_byte(kind[0]).ok_or(FrameError::UnknownKind(kind[0]))?;
    let mut payload = vec![0u8; payload_len];
    read_exact(r, &mut payload).await?;
    Ok(Some(Frame { kind, payload }))
}

async fn read_exact<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    buf: &mut [u8],
) -> Result<(), FrameError> {
    r.read_exact(buf)
        .await
        .map(drop)
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => FrameError::Truncated,
            _ => FrameError::Read(e),
        })
}

/// Writes `bytes` (already encoded frames) and flushes.
pub(crate) async fn write_all<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    bytes: &[u8],
) -> Result<(), FrameError> {
    w.write_all(bytes).await.map_err(FrameError::Write)?;
    w.flush().await.map_err(FrameError::Write)
}

/// Sends `data` as frames of `kind`, at most [`frame::MAX_PAYLOAD`] each
/// (an empty `data` sends nothing: an empty frame would end the stream).
pub(crate) async fn write_chunked<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    kind: FrameKind,
    data: &[u8],
) -> Result<(), FrameError> {
    for chunk in data.chunks(DATA_CHUNK) {
        write_all(w, &frame::encode(kind, chunk)?).await?;
    }
    Ok(())
}

/// Connects to a Unix socket where an agent listens (`microagent-agent --unix PATH`).
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<UnixStream, ClientError> {
    let path = path.as_ref();
    UnixStream::connect(path)
        .await
        .map_err(|source| ClientError::Connect {
            path: path.to_owned(),
            source,
        })
}

/// Connects to guest vsock `port` through the VMM's hybrid vsock Unix
/// socket: writes `CONNECT <port>\n` and expects `OK <host-port>\n`, after
/// which the stream is the guest connection.
pub async fn connect_hybrid_vsock(
    uds_path: impl AsRef<Path>,
    port: u32,
) -> Result<UnixStream, ClientError> {
    let mut stream = connect_unix(uds_path).await?;
    let io_err = |source| ClientError::HandshakeIo { port, source };
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await
        .map_err(io_err)?;
    // Byte by byte: nothing past the newline belongs to the handshake.
    let mut line = Vec::new();
    loop {
        let mut b = [0u8];
        if stream.read(&mut b).await.map_err(io_err)? == 0 || b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
        if line.len() > 64 {
            break;
        }
    }
    handshake_reply(&line, port).map(|()| stream)
}

/// Kind-5 frames of everything `reader` yields, then the empty one.
pub(crate) async fn send_data<W, R>(w: &mut W, reader: &mut R) -> Result<(), ClientError>
where
    W: AsyncWrite + Unpin + ?Sized,
    R: AsyncRead + Unpin + ?Sized,
{
    let mut buf = vec![0u8; DATA_CHUNK];
    loop {
        let n = reader.read(&mut buf).await.map_err(ClientError::Local)?;
        if n == 0 {
            break;
        }
        write_chunked(w, FrameKind::Data, &buf[..n])
            .await
            .map_err(ClientError::Frame)?;
    }
    let end = frame::encode(FrameKind::Data, &[]).map_err(ClientError::Frame)?;
    write_all(w, &end).await.map_err(ClientError::Frame)
}

/// Kind-4 frames of the exec's input, then the empty one (EOF).
pub(crate) async fn send_stdin<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    input: ExecStdin,
) -> Result<(), ClientError> {
    match input {
        ExecStdin::None => {}
        ExecStdin::Bytes(bytes) => write_chunked(w, FrameKind::Stdin, &bytes)
            .await
            .map_err(ClientError::Frame)?,
        ExecStdin::Channel(mut rx) => {
            while let Some(bytes) = rx.recv().await {
                write_chunked(w, FrameKind::Stdin, &bytes)
                    .await
                    .map_err(ClientError::Frame)?;
            }
        }
        ExecStdin::Terminal(mut rx) => {
            while let Some(input) = rx.recv().await {
                match input {
                    PtyInput::Data(bytes) => write_chunked(w, FrameKind::Stdin, &bytes).await,
                    PtyInput::Resize(size) => {
                        let msg = frame::encode_json(&Request::Resize(size))
                            .map_err(ClientError::Frame)?;
                        write_all(w, &msg).await
                    }
                }
                .map_err(ClientError::Frame)?;
            }
        }
        ExecStdin::Reader(mut reader) => {
            let mut buf = vec![0u8; DATA_CHUNK];
            loop {
                let n = reader.read(&mut buf).await.map_err(ClientError::Local)?;
                if n == 0 {
                    break;
                }
                write_chunked(w, FrameKind::Stdin, &buf[..n])
                    .await
                    .map_err(ClientError::Frame)?;
            }
        }
    }
    let eof = frame::encode(FrameKind::Stdin, &[]).map_err(ClientError::Frame)?;
    write_all(w, &eof).await.map_err(ClientError::Frame)
}

/// Where an agent listens; [`AgentEndpoint::connect`] opens a new
/// connection (one per operation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEndpoint {
    /// A Unix socket (`microagent-agent --unix PATH`).
    Unix(PathBuf),
    /// A guest vsock port behind the VMM's hybrid vsock socket.
    HybridVsock {
        /// The VMM's `--vsock` socket.
        uds: PathBuf,
        /// The agent's vsock port (usually 1024).
        port: u32,
    },
}

impl AgentEndpoint {
    /// Opens a connection and wraps it in a client.
    pub async fn connect(&self) -> Result<GuestAgentClient<UnixStream>, ClientError> {
        let stream = match self {
            Self::Unix(path) => connect_unix(path).await?,
            Self::HybridVsock { uds, port } => connect_hybrid_vsock(uds, *port).await?,
        };
        Ok(GuestAgentClient::new(stream))
    }
}
