//! What the client's operations take and return.

use std::fmt;

use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use crate::protocol::{ExecExit, WinSize};

/// What an exec reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecUpdate {
    /// The process was spawned.
    Started {
        /// The exec id (for `signal` and `result`).
        exec_id: String,
        /// The process id.
        pid: u32,
    },
    /// A chunk of stdout (at most 64 KiB).
    Stdout(Vec<u8>),
    /// A chunk of stderr (at most 64 KiB).
    Stderr(Vec<u8>),
}

/// The exec's stdin. Anything but `None` makes the request `stdin: "stream"`.
pub enum ExecStdin {
    /// /dev/null (unless the request itself asks for a stream, which then gets EOF at once).
    None,
    /// These bytes, then EOF.
    Bytes(Vec<u8>),
    /// Each message as it comes; EOF when every sender is dropped.
    Channel(mpsc::Receiver<Vec<u8>>),
    /// Everything the reader yields, then EOF.
    Reader(Box<dyn AsyncRead + Send + Unpin>),
    /// Keystrokes and size changes for an exec on a pty, as they come.
    Terminal(mpsc::Receiver<PtyInput>),
}

/// What a terminal sends to an exec on a pty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyInput {
    /// Bytes typed.
    Data(Vec<u8>),
    /// The terminal's new size.
    Resize(WinSize),
}

impl fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Self::Channel(_) => f.write_str("Channel"),
            Self::Reader(_) => f.write_str("Reader"),
            Self::Terminal(_) => f.write_str("Terminal"),
        }
    }
}

/// An exec's collected output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exec id.
    pub exec_id: String,
    /// The process id.
    pub pid: u32,
    /// How it ended.
    pub exited: ExecExit,
    /// Stdout as sent (at most the output cap).
    pub stdout: Vec<u8>,
    /// Stderr as sent (at most the output cap).
    pub stderr: Vec<u8>,
}

/// Gathers an exec's events into an [`ExecOutput`]: feed it every
/// [`ExecUpdate`], then [`ExecCollector::finish`] with how the exec ended.
#[derive(Debug, Default)]
pub struct ExecCollector {
    started: Option<(String, u32)>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl ExecCollector {
    /// Records one event.
    pub fn on_event(&mut self, event: ExecUpdate) {
        match event {
            ExecUpdate::Started { exec_id, pid } => self.started = Some((exec_id, pid)),
            ExecUpdate::Stdout(b) => self.stdout.extend_from_slice(&b),
            ExecUpdate::Stderr(b) => self.stderr.extend_from_slice(&b),
        }
    }

    /// The collected output of the exec that ended as `exited`.
    pub fn finish(self, exited: ExecExit) -> ExecOutput {
        let (exec_id, pid) = self.started.unwrap_or_else(|| (exited.exec_id.clone(), 0));
        ExecOutput {
            exec_id,
            pid,
            exited,
            stdout: self.stdout,
            stderr: self.stderr,
        }
    }
}

/// The answer to `result`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutcome {
    /// Still running.
    Running {
        /// The process id.
        pid: u32,
    },
    /// Ended; `stdout_head`/`stderr_head` hold the first 64 KiB of each stream.
    Exited(ExecExit),
}

/// Header of a `read_file` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The whole file's size.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Bytes received.
    pub transferred: u64,
}
