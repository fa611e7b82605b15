//! Background processes: what the `process_*` requests carry and answer.
//!
//! A background process outlives the connection that started it: its
//! output goes into a ring per stream in the agent, which any later client
//! reads from a byte cursor.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Ring size per output stream when `output_cap` is absent.
pub const DEFAULT_PROCESS_RING: u64 = 1 << 20;
/// Largest ring per output stream.
pub const MAX_PROCESS_RING: u64 = 16 << 20;
/// Most processes running at once; more are refused with `TOO_LARGE`.
pub const MAX_RUNNING_PROCESSES: usize = 64;
/// Finished processes kept until removed; the oldest goes first.
pub const MAX_FINISHED_PROCESSES: usize = 32;
/// Most output bytes per stream one `process_output` answer carries.
pub const MAX_PROCESS_READ: u64 = 4 << 20;
/// Longest `wait_ms` of `process_output` and `timeout_ms` of `process_wait`.
pub const MAX_PROCESS_WAIT: Duration = Duration::from_secs(600);
/// Most stdin bytes one `process_stdin` carries (base64 in a 64 KiB message).
pub const MAX_PROCESS_STDIN: usize = 32 << 10;

/// Whether a background process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessRunState {
    /// It runs.
    Running,
    /// It exited or was killed (output may still be read).
    Exited,
}

/// A background process as `process_start`, `process_list` and
/// `process_wait` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// Its id (for every other `process_*` request).
    pub id: String,
    /// Its pid in the guest (also its process group).
    pub pid: u32,
    /// The command: the arguments joined by spaces, or the shell line.
    pub command: String,
    /// Running or exited.
    pub state: ProcessRunState,
    /// When it started, Unix milliseconds (guest clock).
    pub started_unix_ms: u64,
    /// When it ended, Unix milliseconds (guest clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_ms: Option<u64>,
    /// Exit code, when it exited.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Signal number, when a signal killed it.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Its timeout killed it.
    #[serde(default)]
    pub timed_out: bool,
    /// Bytes it wrote to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr so far.
    pub stderr_bytes: u64,
    /// Its stdin is a pipe still open for `process_stdin`.
    pub stdin_open: bool,
    /// Bytes kept per output stream.
    pub ring_bytes: u64,
}

/// One stream's part of a `process_output` answer; its `len` bytes follow
/// the answer in kind-2 (stdout) or kind-3 (stderr) frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// Byte offset (in everything the stream ever carried) of the first byte sent.
    pub cursor: u64,
    /// Bytes sent.
    pub len: u64,
    /// The cursor to ask for next (`cursor + len`).
    pub next_cursor: u64,
    /// Bytes between the cursor asked for and `cursor` that the ring no
    /// longer held (overwritten by newer output).
    pub dropped: u64,
}

/// The `process_output` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputAnswer {
    /// The process, as of this answer.
    pub process: ProcessEntry,
    /// Stdout from the stdout cursor asked for.
    pub stdout: OutputChunk,
    /// Stderr from the stderr cursor asked for.
    pub stderr: OutputChunk,
    /// Both streams reached end of file: no more output will come.
    pub eof: bool,
}

/// Longest `command` in a [`ProcessEntry`] (longer ones are cut, so a list
/// of every process fits in one message).
pub const MAX_PROCESS_COMMAND: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Request, Response};

    #[test]
    fn process_messages_use_the_documented_json() {
        let req: Request = serde_json::from_str(
            r#"{"type":"process_output","id":"p1","stdout_cursor":5,"wait_ms":100}"#,
        )
        .unwrap();
        assert_eq!(
            req,
            Request::ProcessOutput {
                id: "p1".into(),
                stdout_cursor: 5,
                stderr_cursor: 0,
                max_bytes: None,
                wait_ms: Some(100),
            }
        );
        let info = ProcessEntry {
            id: "p1".into(),
            pid: 7,
            command: "sleep 1".into(),
            state: ProcessRunState::Running,
            started_unix_ms: 1,
            ended_unix_ms: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdin_open: false,
            ring_bytes: DEFAULT_PROCESS_RING,
        };
        let json = serde_json::to_value(Response::Process(info)).unwrap();
        assert_eq!(json["type"], "process");
        assert_eq!(json["state"], "running");
        assert_eq!(json["exit_code"], serde_json::Value::Null);
    }
}
