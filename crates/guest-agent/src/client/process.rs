//! The background-process operations of [`GuestAgentClient`]: each is one
//! connection, so a process started by one client is read, fed, signalled
//! and waited for by any other (or by a later program altogether).

use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncWrite};

use super::messages::expect_ok;
use super::{wire, ClientError, GuestAgentClient};
use crate::frame::FrameKind;
use crate::protocol::{
    ExecCall, OutputAnswer, ProcessEntry, Request, Response, SignalSpec, MAX_PROCESS_READ,
};

/// A `process_output` answer with its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRead {
    /// The answer: the process, both streams' cursors, end of file.
    pub output: OutputAnswer,
    /// Stdout bytes from `output.stdout.cursor`.
    pub stdout: Vec<u8>,
    /// Stderr bytes from `output.stderr.cursor`.
    pub stderr: Vec<u8>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> GuestAgentClient<S> {
    /// Starts a background process and returns at once. `req.stdin`
    /// `Stream` keeps its stdin open for [`Self::process_stdin`];
    /// `req.output_cap` is the ring size per stream.
    pub async fn process_start(self, req: ExecCall) -> Result<ProcessEntry, ClientError> {
        match self.call(&Request::ProcessStart(req)).await? {
            Response::Process(info) => Ok(info),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Every background process the agent keeps, oldest first.
    pub async fn process_list(self) -> Result<Vec<ProcessEntry>, ClientError> {
        match self.call(&Request::ProcessList).await? {
            Response::Processes { processes } => Ok(processes),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Output from the cursors `[stdout, stderr]`, waiting up to `wait`
    /// for some when none is there yet.
    pub async fn process_output(
        mut self,
        id: &str,
        cursors: [u64; 2],
        max_bytes: Option<u64>,
        wait: Duration,
    ) -> Result<ProcessRead, ClientError> {
        let req = Request::ProcessOutput {
            id: id.to_owned(),
            stdout_cursor: cursors[0],
            stderr_cursor: cursors[1],
            max_bytes,
            wait_ms: Some(millis(wait)),
        };
        // The long-poll may hold the answer back for `wait`.
        self.idle = self.idle.saturating_add(wait);
        self.send_start(&req).await?;
        self.read_hello().await?;
        let output = match self.response().await? {
            Response::ProcessOutput(output) => output,
            other => return Err(ClientError::unexpected(&other)),
        };
        let mut read = ProcessRead {
            output,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        // The lengths are the agent's word: more than was asked for (at
        // most MAX_PROCESS_READ per stream) is never taken into memory.
        let cap = max_bytes.unwrap_or(MAX_PROCESS_READ).min(MAX_PROCESS_READ);
        let (want_out, want_err) = (read.output.stdout.len, read.output.stderr.len);
        if want_out > cap || want_err > cap {
            return Err(ClientError::Oversized { limit: cap });
        }
        while (read.stdout.len() as u64) < want_out || (read.stderr.len() as u64) < want_err {
            let frame = wire::next_frame(&mut self.stream, self.idle).await?;
            let (buf, want) = match frame.kind {
                FrameKind::Stdout => (&mut read.stdout, want_out),
                FrameKind::Stderr => (&mut read.stderr, want_err),
                kind => return Err(ClientError::unexpected_frame(kind)),
            };
            if buf.len() as u64 + frame.payload.len() as u64 > want {
                return Err(ClientError::unexpected_frame(frame.kind));
            }
            buf.extend_from_slice(&frame.payload);
        }
        Ok(read)
    }

    /// Writes `data` (at most 32 KiB) to a process's stdin, then closes it
    /// if `close`; returns the bytes written.
    pub async fn process_stdin(
        self,
        id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<u64, ClientError> {
        let req = Request::ProcessStdin {
            id: id.to_owned(),
            data: base64::engine::general_purpose::STANDARD.encode(data),
            close,
        };
        match self.call(&req).await? {
            Response::Ok { bytes, .. } => Ok(bytes.unwrap_or(0)),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Signals a running process's process group.
    pub async fn process_signal(
        self,
        id: &str,
        signal: impl Into<SignalSpec>,
    ) -> Result<(), ClientError> {
        let req = Request::ProcessSignal {
            id: id.to_owned(),
            signal: signal.into(),
        };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// The process once it exits, or as it is after `timeout`.
    pub async fn process_wait(
        mut self,
        id: &str,
        timeout: Duration,
    ) -> Result<ProcessEntry, ClientError> {
        let req = Request::ProcessWait {
            id: id.to_owned(),
            timeout_ms: millis(timeout),
        };
        // The agent answers when the process exits or after `timeout`.
        self.idle = self.idle.saturating_add(timeout);
        match self.call(&req).await? {
            Response::Process(info) => Ok(info),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Forgets a finished process and its output.
    pub async fn process_remove(self, id: &str) -> Result<(), ClientError> {
        let req = Request::ProcessRemove { id: id.to_owned() };
        expect_ok(self.call(&req).await?).map(drop)
    }
}
