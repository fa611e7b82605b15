//! Protocol version 2 (1 plus exec on a pty): the JSON messages, their limits and the error codes
//! (see docs/guest-agent-protocol.md for the full description).
//!
//! Every JSON message is an object whose `"type"` names it. Fields the
//! reader does not know are ignored, so a later minor addition does not
//! break an older peer.

mod process;
mod request;
mod response;
mod watch;

use std::fmt;
use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use process::{
    OutputAnswer, OutputChunk, ProcessEntry, ProcessRunState, DEFAULT_PROCESS_RING,
    MAX_FINISHED_PROCESSES, MAX_PROCESS_COMMAND, MAX_PROCESS_READ, MAX_PROCESS_RING,
    MAX_PROCESS_STDIN, MAX_PROCESS_WAIT, MAX_RUNNING_PROCESSES,
};
pub use request::{
    ExecCall, Forward, NewIdentity, Request, SignalSpec, StdinMode, VolumeToMount, WinSize,
    WriteMode, CLOCK_BEHIND_NS,
};
pub use response::{
    CpuTicks, DiskUsage, EntryKind, ExecExit, InUse, ListedEntry, NetCounters, ReclaimAnswer,
    Response, StatAnswer, SystemInfo,
};
pub use watch::{
    WatchBatch, WatchEntry, WatchEvent, WatchEventKind, MAX_WATCHES, MAX_WATCH_DIRS,
    MAX_WATCH_EVENTS, MAX_WATCH_READ, MAX_WATCH_WAIT,
};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest version the agent still answers: version 2 only added the
/// `pty` field of `exec` and the `resize` message.
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// Most forwards one `forward` request sets.
pub const MAX_FORWARDS: usize = 32;
/// Most connections all forwards carry at once.
pub const MAX_FORWARD_CONNECTIONS: usize = 64;
/// The vsock port the agent listens on by default.
pub const DEFAULT_VSOCK_PORT: u32 = 1024;
/// Largest stdout/stderr frame the agent sends.
pub const OUTPUT_CHUNK: usize = 64 << 10;
/// Largest file/tar data frame the agent sends.
pub const DATA_CHUNK: usize = 256 << 10;
/// Output bytes per stream sent to the client when `output_cap` is absent.
pub const DEFAULT_OUTPUT_CAP: u64 = 1 << 20;
/// Largest `output_cap` accepted, besides [`UNCAPPED_OUTPUT`].
pub const MAX_OUTPUT_CAP: u64 = 64 << 20;
/// The `output_cap` of a client that writes each chunk out as it comes
/// and keeps none (the containerd shim's bridge to a container's FIFOs):
/// everything is sent, however long the command runs.
pub const UNCAPPED_OUTPUT: u64 = u64::MAX;
/// Bytes of each stream kept with an exec result (`stdout_head`/`stderr_head`).
pub const RESULT_HEAD: usize = 64 << 10;
/// How long an exec result is kept after the exec ends.
pub const RESULT_TTL: Duration = Duration::from_secs(600);
/// Most exec results kept; the oldest is dropped first.
pub const MAX_RESULTS: usize = 256;
/// Most entries a `list_dir` answer carries.
pub const MAX_DIR_ENTRIES: usize = 10_000;
/// Silence after which the agent drops a client it is waiting for.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest exec id, in bytes.
pub const MAX_EXEC_ID: usize = 128;

/// Why a request failed: the `code` of an `error` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AgentErrorCode {
    /// The request (or a frame) was malformed or made no sense.
    InvalidInput,
    /// A path, exec id or process did not exist.
    NotFound,
    /// The target already existed.
    Exists,
    /// The guest refused the operation.
    PermissionDenied,
    /// A frame, message or value was over its limit, or the agent is full.
    TooLarge,
    /// The client was silent for too long.
    Timeout,
    /// The client speaks another protocol version.
    UnsupportedVersion,
    /// Nothing accepts connections on the guest port asked for.
    ConnectionRefused,
    /// Anything else.
    Internal,
    /// A code this version of the crate does not know (from a newer agent).
    #[serde(other)]
    Unknown,
}

impl AgentErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "INVALID_INPUT",
            Self::NotFound => "NOT_FOUND",
            Self::Exists => "EXISTS",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::TooLarge => "TOO_LARGE",
            Self::Timeout => "TIMEOUT",
            Self::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Self::ConnectionRefused => "CONNECTION_REFUSED",
            Self::Internal => "INTERNAL",
            Self::Unknown => "UNKNOWN",
        }
    }

    /// The code an I/O error of this kind maps to.
    pub fn from_io(kind: io::ErrorKind) -> Self {
        use io::ErrorKind as K;
        match kind {
            K::NotFound => Self::NotFound,
            K::AlreadyExists => Self::Exists,
            K::PermissionDenied | K::ReadOnlyFilesystem => Self::PermissionDenied,
            K::InvalidInput
            | K::InvalidData
            | K::InvalidFilename
            | K::NotADirectory
            | K::IsADirectory
            | K::DirectoryNotEmpty
            | K::CrossesDevices
            | K::Unsupported => Self::InvalidInput,
            K::StorageFull
            | K::QuotaExceeded
            | K::FileTooLarge
            | K::ArgumentListTooLong
            | K::OutOfMemory => Self::TooLarge,
            K::TimedOut | K::WouldBlock => Self::Timeout,
            _ => Self::Internal,
        }
    }
}

impl fmt::Display for AgentErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Operations the agent announces in its `hello`.
pub const CAPABILITIES: &[&str] = &[
    "ping",
    "shutdown",
    "info",
    "exec",
    "exec.stdin_stream",
    "exec.root",
    "signal",
    "result",
    "read_file",
    "write_file",
    "stat",
    "list_dir",
    "mkdir",
    "remove",
    "rename",
    "tar_out",
    "tar_in",
    "restored",
    "hello_identity",
    "hello_clock",
    "mount_volumes",
    "tcp_connect",
    "process",
    "pty",
    "reclaim",
    "forward",
    "watch",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_use_the_documented_json() {
        let req = Request::Exec(ExecCall::shell("echo hi").timeout(Duration::from_secs(2)));
        let json = serde_json::to_string(&req).unwrap();
        assert_eq!(
            json,
            r#"{"type":"exec","shell":"echo hi","stdin":"none","timeout_ms":2000}"#
        );
        let back: Request =
            serde_json::from_str(r#"{"type":"signal","exec_id":"a","signal":"TERM","x":1}"#)
                .unwrap();
        assert_eq!(
            back,
            Request::Signal {
                exec_id: "a".into(),
                signal: SignalSpec::Name("TERM".into())
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"type":"nope"}"#).is_err());
    }

    #[test]
    fn responses_use_the_documented_json() {
        let exited = Response::Exited(ExecExit {
            exec_id: "e1".into(),
            code: Some(0),
            ..ExecExit::default()
        });
        let json = serde_json::to_value(&exited).unwrap();
        assert_eq!(json["type"], "exited");
        assert_eq!(json["signal"], serde_json::Value::Null);
        assert!(json.get("stdout_head").is_none());
        let err: Response =
            serde_json::from_str(r#"{"type":"error","code":"SOMETHING_NEW","message":"m"}"#)
                .unwrap();
        assert!(matches!(
            err,
            Response::Error {
                code: AgentErrorCode::Unknown,
                ..
            }
        ));
        assert_eq!(
            serde_json::to_string(&AgentErrorCode::UnsupportedVersion).unwrap(),
            "\"UNSUPPORTED_VERSION\""
        );
    }

    #[test]
    fn a_reclaim_answer_says_why_the_guest_is_busy_and_takes_new_reasons() {
        let answer = |because: &str| {
            let json = format!(
                r#"{{"type":"reclaimed","dropped":false,"idle_secs":3,"free_kib_before":1,"free_kib_after":1,"busy":true{because}}}"#
            );
            match serde_json::from_str::<Response>(&json).unwrap() {
                Response::Reclaimed(a) => a.busy_because,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(answer(r#","busy_because":"cpu""#), Some(InUse::Cpu));
        assert_eq!(answer(r#","busy_because":"gpu""#), Some(InUse::Other));
        // An older agent says only that it is busy.
        assert_eq!(answer(""), None);
    }
}
