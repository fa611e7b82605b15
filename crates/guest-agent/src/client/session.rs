//! The async client: one connection, one operation ([`GuestAgentClient`]).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::messages::{decode, expect_ok, hello_of, start_bytes, AgentHello};
use super::types::{ExecCollector, ExecOutcome, ExecOutput, ExecStdin, ExecUpdate, FileHeader};
use super::wire::{self, send_data, send_stdin};
use super::ClientError;
use crate::frame::{self, FrameKind};
use crate::protocol::{
    ExecCall, ExecExit, ListedEntry, NewIdentity, Request, Response, SignalSpec, StatAnswer,
    StdinMode, SystemInfo, WriteMode, MIN_PROTOCOL_VERSION,
};

/// How long an operation waits for the agent's next message (or for it
/// to take what we send) before failing as [`ClientError::Stalled`]. Most
/// answers come in milliseconds, but unpacking a large upload where the
/// guest kernel is emulated (~0.7 ms per guest system call) can take
/// minutes before the answer, so this ends only calls to an agent that
/// stopped answering. A wait the request asks for (a process wait, an
/// output long-poll) is added to it; an exec's output is bounded by the
/// exec's own timeout instead.
pub const IDLE_DEADLINE: Duration = Duration::from_secs(300);

/// One connection to the agent, good for one operation.
#[derive(Debug)]
pub struct GuestAgentClient<S> {
    pub(super) stream: S,
    pub(super) idle: Duration,
    /// Sent with the hello: a claimed pool member's identity.
    pub(super) identity: Option<NewIdentity>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> GuestAgentClient<S> {
    /// Wraps a stream that reaches the agent (see [`connect_unix`] and
    /// [`connect_hybrid_vsock`]).
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            idle: IDLE_DEADLINE,
            identity: None,
        }
    }

    /// The same client, sending `identity` with its hello: the agent takes
    /// it before the request (once; repeats are ignored), with the clock
    /// read as it is sent.
    pub fn with_identity(mut self, identity: NewIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// The same client with another idle deadline (see [`IDLE_DEADLINE`]).
    pub fn idle_deadline(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> S {
        self.stream
    }

    /// Only the handshake: what the agent is and supports (asked in the
    /// oldest version, which every agent answers; `capabilities` tell the rest).
    pub async fn hello(mut self) -> Result<AgentHello, ClientError> {
        let hello = super::messages::hello_now(MIN_PROTOCOL_VERSION, self.identity.as_ref());
        let bytes = frame::encode_json(&hello).map_err(ClientError::Frame)?;
        self.write_within(&bytes).await?;
        self.read_hello().await
    }

    /// Any request whose answer is one message: sends it and returns that
    /// message (an `error` answer becomes [`ClientError::Agent`]).
    pub async fn call(mut self, req: &Request) -> Result<Response, ClientError> {
        self.call_ref(req).await
    }

    /// `tcp_connect`: the agent connects to 127.0.0.1:`port` in the guest;
    /// the returned stream then carries that TCP connection's bytes.
    pub async fn tcp_connect(mut self, port: u16) -> Result<S, ClientError> {
        expect_ok(self.call_ref(&Request::TcpConnect { port }).await?)?;
        Ok(self.stream)
    }

    async fn call_ref(&mut self, req: &Request) -> Result<Response, ClientError> {
        self.send_start(req).await?;
        self.read_hello().await?;
        self.response().await
    }

    /// `ping`: the agent's uptime.
    pub async fn ping(self) -> Result<Duration, ClientError> {
        match self.call(&Request::Ping).await? {
            Response::Pong { uptime_ms } => Ok(Duration::from_millis(uptime_ms)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// `shutdown`: syncs the guest's filesystems and restarts it, which ends
    /// the VM. The agent answers first; a connection that closes before the
    /// answer arrives also means the guest is going down.
    pub async fn shutdown(self) -> Result<(), ClientError> {
        match self.call(&Request::Shutdown).await {
            Ok(resp) => expect_ok(resp).map(drop),
            Err(ClientError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `info`: kernel, memory, load and disks.
    pub async fn info(self) -> Result<SystemInfo, ClientError> {
        match self.call(&Request::Info).await? {
            Response::Info(info) => Ok(info),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Runs a process, calling `on_event` with `Started` and every output
    /// chunk as they arrive, and returns how it ended.
    pub async fn exec<F>(
        mut self,
        mut req: ExecCall,
        input: ExecStdin,
        mut on_event: F,
    ) -> Result<ExecExit, ClientError>
    where
        F: FnMut(ExecUpdate) + Send,
    {
        if !matches!(input, ExecStdin::None) {
            req.stdin = StdinMode::Stream;
        }
        let streaming = req.stdin == StdinMode::Stream;
        self.send_start(&Request::Exec(req)).await?;
        let idle = self.idle;
        let (mut rd, mut wr) = tokio::io::split(self.stream);
        let reading = async {
            read_hello_from(&mut rd, idle).await?;
            loop {
                let frame = wire::read_frame(&mut rd)
                    .await
                    .map_err(ClientError::Frame)?
                    .ok_or(ClientError::Closed)?;
                match frame.kind {
                    FrameKind::Stdout => on_event(ExecUpdate::Stdout(frame.payload)),
                    FrameKind::Stderr => on_event(ExecUpdate::Stderr(frame.payload)),
                    FrameKind::Json => match decode(&frame)? {
                        Response::Started { exec_id, pid } => {
                            on_event(ExecUpdate::Started { exec_id, pid })
                        }
                        Response::Exited(exited) => return Ok(exited),
                        other => return Err(ClientError::unexpected(&other)),
                    },
                    kind => return Err(ClientError::unexpected_frame(kind)),
                }
            }
        };
        let writing = async {
            if streaming {
                send_stdin(&mut wr, input).await?;
            }
            // Keep the write half open: closing it may end the connection.
            std::future::pending::<()>().await;
            Ok::<(), ClientError>(())
        };
        tokio::pin!(reading);
        tokio::select! {
            result = &mut reading => result,
            written = writing => match written {
                // The agent may have finished and closed first: its answer
                // says what happened.
                Err(ClientError::Frame(_)) | Ok(()) => reading.await,
                Err(e) => Err(e),
            },
        }
    }

    /// Runs a process and collects its output.
    pub async fn exec_collect(
        self,
        req: ExecCall,
        input: ExecStdin,
    ) -> Result<ExecOutput, ClientError> {
        let mut collector = ExecCollector::default();
        let exited = self
            .exec(req, input, |event| collector.on_event(event))
            .await?;
        Ok(collector.finish(exited))
    }

    /// Signals a running exec's process group.
    pub async fn signal(
        self,
        exec_id: &str,
        signal: impl Into<SignalSpec>,
    ) -> Result<(), ClientError> {
        let req = Request::Signal {
            exec_id: exec_id.to_owned(),
            signal: signal.into(),
        };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// An exec's state: running, or its result with the head of its output.
    pub async fn result(self, exec_id: &str) -> Result<ExecOutcome, ClientError> {
        let req = Request::Result {
            exec_id: exec_id.to_owned(),
        };
        match self.call(&req).await? {
            Response::Running { pid, .. } => Ok(ExecOutcome::Running { pid }),
            Response::Exited(exited) => Ok(ExecOutcome::Exited(exited)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Reads a whole file.
    pub async fn read_file(self, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.read_file_to(path, None, None, &mut out).await?;
        Ok(out)
    }

    /// Reads `length` bytes (default: to the end) from `offset` (default 0)
    /// of a file into `out`.
    pub async fn read_file_to<W: AsyncWrite + Unpin + ?Sized>(
        mut self,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
        out: &mut W,
    ) -> Result<FileHeader, ClientError> {
        let req = Request::ReadFile {
            path: path.to_owned(),
            offset,
            length,
        };
        self.send_start(&req).await?;
        self.read_hello().await?;
        let (size, mode) = match self.response().await? {
            Response::File { size, mode } => (size, mode),
            other => return Err(ClientError::unexpected(&other)),
        };
        // Never more than asked for (a file may grow while it is read, and
        // /proc files report no size, so the described size is no bound).
        let transferred = self.receive_data(out, length.unwrap_or(u64::MAX)).await?;
        Ok(FileHeader {
            size,
            mode,
            transferred,
        })
    }

    /// Writes `data` to a file; returns the bytes written.
    pub async fn write_file(
        self,
        path: &str,
        mode: WriteMode,
        perm: Option<u32>,
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let mut reader = data;
        self.write_file_from(path, mode, perm, &mut reader).await
    }

    /// Writes everything `reader` yields to a file; returns the bytes written.
    pub async fn write_file_from<R: AsyncRead + Unpin + ?Sized>(
        self,
        path: &str,
        mode: WriteMode,
        perm: Option<u32>,
        reader: &mut R,
    ) -> Result<u64, ClientError> {
        let req = Request::WriteFile {
            path: path.to_owned(),
            mode,
            perm,
        };
        match self.upload(&req, reader).await? {
            Response::Ok { bytes, .. } => Ok(bytes.unwrap_or(0)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Metadata of a path (symlinks not followed).
    pub async fn stat(self, path: &str) -> Result<StatAnswer, ClientError> {
        let req = Request::Stat {
            path: path.to_owned(),
        };
        match self.call(&req).await? {
            Response::Stat(stat) => Ok(stat),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// A directory's entries (sorted by name) and whether the list was cut at 10,000.
    pub async fn list_dir(self, path: &str) -> Result<(Vec<ListedEntry>, bool), ClientError> {
        let req = Request::ListDir {
            path: path.to_owned(),
        };
        match self.call(&req).await? {
            Response::Entries { entries, truncated } => Ok((entries, truncated)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// `forward`: replaces the guest's forwards with `forwards` (each a
    /// name and loopback port whose connections reach a host vsock port).
    pub async fn forward(self, forwards: Vec<crate::protocol::Forward>) -> Result<(), ClientError> {
        expect_ok(self.call(&Request::Forward { forwards }).await?).map(drop)
    }

    /// Creates a directory and its parents.
    pub async fn mkdir(self, path: &str) -> Result<(), ClientError> {
        let req = Request::Mkdir {
            path: path.to_owned(),
        };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// Removes a file, symlink or (empty, unless `recursive`) directory.
    pub async fn remove(self, path: &str, recursive: bool) -> Result<(), ClientError> {
        let req = Request::Remove {
            path: path.to_owned(),
            recursive,
        };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// Renames a path.
    pub async fn rename(self, from: &str, to: &str) -> Result<(), ClientError> {
        let req = Request::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// A directory as a tar archive, in memory.
    pub async fn tar_out(self, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.tar_out_to(path, &mut out).await?;
        Ok(out)
    }

    /// Streams a directory as a tar archive into `out`; returns its size.
    pub async fn tar_out_to<W: AsyncWrite + Unpin + ?Sized>(
        self,
        path: &str,
        out: &mut W,
    ) -> Result<u64, ClientError> {
        self.tar_out_with(path, false, out).await
    }

    /// [`Self::tar_out_to`], staying on the directory's filesystem when
    /// `one_file_system` (mount points are archived empty).
    pub async fn tar_out_with<W: AsyncWrite + Unpin + ?Sized>(
        mut self,
        path: &str,
        one_file_system: bool,
        out: &mut W,
    ) -> Result<u64, ClientError> {
        let req = Request::TarOut {
            path: path.to_owned(),
            one_file_system,
        };
        self.send_start(&req).await?;
        self.read_hello().await?;
        // Bounded by the caller's writer (copy_out streams to a budget).
        self.receive_data(out, u64::MAX).await
    }

    /// Extracts a tar archive under `path`; returns the number of entries.
    pub async fn tar_in(self, path: &str, tar: &[u8]) -> Result<u64, ClientError> {
        let mut reader = tar;
        self.tar_in_from(path, &mut reader).await
    }

    /// Extracts the tar archive `reader` yields under `path`; returns the
    /// number of entries.
    pub async fn tar_in_from<R: AsyncRead + Unpin + ?Sized>(
        self,
        path: &str,
        reader: &mut R,
    ) -> Result<u64, ClientError> {
        self.tar_in_with(path, false, reader).await
    }

    /// [`Self::tar_in_from`], keeping each entry's owner and group when
    /// `owners` is set.
    pub async fn tar_in_with<R: AsyncRead + Unpin + ?Sized>(
        self,
        path: &str,
        owners: bool,
        reader: &mut R,
    ) -> Result<u64, ClientError> {
        let req = Request::TarIn {
            path: path.to_owned(),
            owners,
        };
        match self.upload(&req, reader).await? {
            Response::Ok { entries, .. } => Ok(entries.unwrap_or(0)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Sends `hello` and `req` in one write.
    pub(super) async fn send_start(&mut self, req: &Request) -> Result<(), ClientError> {
        let bytes = start_bytes(req, self.identity.as_ref())?;
        self.write_within(&bytes).await
    }

    /// Writes `bytes`, waiting at most the idle deadline for the agent to
    /// take them.
    async fn write_within(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        match tokio::time::timeout(self.idle, wire::write_all(&mut self.stream, bytes)).await {
            Ok(written) => written.map_err(ClientError::Frame),
            Err(_) => Err(ClientError::Stalled {
                secs: self.idle.as_secs(),
            }),
        }
    }

    pub(super) async fn read_hello(&mut self) -> Result<AgentHello, ClientError> {
        read_hello_from(&mut self.stream, self.idle).await
    }

    pub(super) async fn response(&mut self) -> Result<Response, ClientError> {
        read_response(&mut self.stream, self.idle).await
    }

    /// Sends the request and the data stream, then reads the answer. A
    /// failed write is reported as the agent's error when it sent one.
    async fn upload<R: AsyncRead + Unpin + ?Sized>(
        mut self,
        req: &Request,
        reader: &mut R,
    ) -> Result<Response, ClientError> {
        self.send_start(req).await?;
        let sent = send_data(&mut self.stream, reader).await;
        // Our own input failed (a cut copy): the agent, which saw no end,
        // drops what it received once the connection closes; its answer
        // would only come at its idle deadline.
        if let Err(e @ ClientError::Local(_)) = sent {
            return Err(e);
        }
        let answer = async {
            self.read_hello().await?;
            self.response().await
        }
        .await;
        match (sent, answer) {
            (_, Err(e @ ClientError::Agent { .. })) => Err(e),
            (Err(e), _) => Err(e),
            (Ok(()), answer) => answer,
        }
    }

    /// Copies kind-5 frames into `out` until the empty one.
    async fn receive_data<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        out: &mut W,
        limit: u64,
    ) -> Result<u64, ClientError> {
        let mut total = 0u64;
        loop {
            let frame = wire::next_frame(&mut self.stream, self.idle).await?;
            match frame.kind {
                FrameKind::Data if frame.payload.is_empty() => break,
                FrameKind::Data if total.saturating_add(frame.payload.len() as u64) > limit => {
                    return Err(ClientError::Oversized { limit });
                }
                FrameKind::Data => {
                    out.write_all(&frame.payload)
                        .await
                        .map_err(ClientError::Local)?;
                    total += frame.payload.len() as u64;
                }
                FrameKind::Json => {
                    let resp = decode(&frame)?;
                    return Err(ClientError::unexpected(&resp));
                }
                kind => return Err(ClientError::unexpected_frame(kind)),
            }
        }
        out.flush().await.map_err(ClientError::Local)?;
        Ok(total)
    }
}

async fn read_response<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    idle: Duration,
) -> Result<Response, ClientError> {
    decode(&wire::next_frame(r, idle).await?)
}

async fn read_hello_from<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    idle: Duration,
) -> Result<AgentHello, ClientError> {
    hello_of(read_response(r, idle).await?)
}
