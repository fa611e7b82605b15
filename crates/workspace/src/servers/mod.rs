//! A pool of hosts over SSH: the servers this host knows
//! ([`ServerRegistry`]), how each is reached (`ssh`: the system's OpenSSH
//! client, one shared connection per server), their health and resources
//! ([`ServerStatus`], measured by each server itself: see
//! `Workspaces::server_report`), and running `microagent` on one
//! ([`run_remote`]). A workspace placed on a remote
//! server is recorded here ([`PlacedWorkspace`]); a workspace handle's
//! calls on it go there as [`WorkspaceCall`]s ([`RemoteWorkspace`];
//! docs/servers.md).

mod calls;
mod forwards;
mod frames;
mod registry;
mod remote;
mod spec;
pub mod ssh;
mod status;

pub use calls::{
    check_answer_bytes, millis, RemoteCall, RemoteWorkspace, WorkspaceCall, MAX_CALL_BYTES,
};
pub use frames::{
    CallFrame, CallStreams, CopyFrames, FollowingInput, InputFrame, InputFrames, OnFrame,
    FRAME_START, MAX_FRAME_BYTES, MAX_FRAME_DATA,
};
pub use registry::{PlacedWorkspace, ServerRegistry};
pub use remote::{
    run_remote, run_remote_json, run_remote_streaming, RemoteOutput, RunStreams, DEFAULT_DEADLINE,
    PROBE_DEADLINE,
};
pub use spec::{check_server_name, GivenSizes, ServerSpec, SshTarget, LOCAL_SERVER};
pub use status::{
    available_score, offline, remote_status, this_host, Availability, Health, Resources,
    ServerReport, ServerStatus, WorkspaceFigures, WorkspaceUsage, VERSION,
};
pub(crate) use status::{cpu_times, memory};

use base::code::ErrorCode;
use base::store::StoreError;

/// Why a server operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad name, target or option.
    #[error("{0}")]
    Invalid(String),
    /// No server of that name.
    #[error("no server named {0:?}")]
    NotFound(String),
    /// The name is taken.
    #[error("a server named {0:?} exists")]
    Exists(String),
    /// A workspace of the name was placed meanwhile: the one just made on
    /// `server` is not recorded here.
    #[error("workspace {workspace} was placed by another create meanwhile; the one made on server {server} is not recorded here")]
    PlacedAlready {
        /// The workspace.
        workspace: String,
        /// Where the unrecorded one was made.
        server: String,
    },
    /// Workspaces still live on it.
    #[error("server {server} still has workspaces: {}", workspaces.join(", "))]
    InUse {
        /// The server.
        server: String,
        /// Its workspaces.
        workspaces: Vec<String>,
    },
    /// ssh could not reach it (or was cut off).
    #[error("server {server} is unreachable: {detail}")]
    Unreachable {
        /// The server.
        server: String,
        /// What ssh said.
        detail: String,
    },
    /// It printed more than an answer may hold.
    #[error("server {server} printed more than {limit} bytes")]
    AnswerTooLarge {
        /// The server.
        server: String,
        /// The bound.
        limit: u64,
    },
    /// It did not answer in time.
    #[error("server {server} did not answer within {secs} s")]
    Deadline {
        /// The server.
        server: String,
        /// The deadline.
        secs: u64,
    },
    /// Its microagent refused: the remote's own code and message.
    #[error("on server {server}: {message}")]
    Remote {
        /// The server.
        server: String,
        /// The remote's code.
        code: ErrorCode,
        /// The remote's message.
        message: String,
    },
    /// Its answer was not what microagent prints.
    #[error("server {server} answered what is not microagent's JSON: {detail}")]
    Garbled {
        /// The server.
        server: String,
        /// What was wrong.
        detail: String,
    },
    /// A workspace call or its answer could not be written as JSON.
    #[error("writing a workspace call or its answer")]
    Encode(#[source] serde_json::Error),
    /// A call came for a workspace this server placed on yet another one:
    /// calls go one hop only.
    #[error(
        "workspace {workspace} lives on server {server} of this one; calls are not forwarded twice"
    )]
    PlacedAgain {
        /// The workspace.
        workspace: String,
        /// Where this server placed it.
        server: String,
    },
    /// A fork asked through a workspace's call named a snapshot of another
    /// workspace (whose owner only the calling host knows).
    #[error("snapshot {snapshot} was not taken of workspace {workspace}; a fork on a server takes only its own workspace's snapshots")]
    SnapshotOfAnother {
        /// The snapshot.
        snapshot: String,
        /// The workspace the call was for.
        workspace: String,
    },
    /// The host that sent a command went away before it ended; the command
    /// was killed (`killed`: the guest confirmed it).
    #[error("the host that sent command {exec_id} went away before it ended (killed: {killed})")]
    CallerGone {
        /// The command's exec id.
        exec_id: String,
        /// Whether the guest confirmed the kill.
        killed: bool,
    },
    /// ssh could not be run here.
    #[error("running ssh")]
    Spawn(#[source] std::io::Error),
    /// No online server with room has the image.
    #[error("no online server with room has image {0}")]
    NoRoom(String),
    /// Reading or writing the state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, writing, listing or removing a server's record failed.
    #[error(transparent)]
    Record(#[from] base::store::records::RecordError),
    /// A state file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl ServerError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServerError::Invalid(_) => ErrorCode::InvalidInput,
            ServerError::NotFound(_) => ErrorCode::NotFound,
            ServerError::Exists(_) | ServerError::InUse { .. } => ErrorCode::Conflict,
            ServerError::Unreachable { .. } | ServerError::Spawn(_) => ErrorCode::HostUnsupported,
            ServerError::CallerGone { .. } => ErrorCode::Timeout,
            ServerError::Deadline { .. } => ErrorCode::Timeout,
            ServerError::Remote { code, .. } => *code,
            ServerError::Garbled { .. }
            | ServerError::Io { .. }
            | ServerError::AnswerTooLarge { .. } => ErrorCode::Internal,
            ServerError::NoRoom(_)
            | ServerError::PlacedAgain { .. }
            | ServerError::PlacedAlready { .. } => ErrorCode::Conflict,
            ServerError::Encode(_) => ErrorCode::Internal,
            ServerError::SnapshotOfAnother { .. } => ErrorCode::Forbidden,
            ServerError::Store(e) => e.code(),
            ServerError::Record(e) => e.code(),
        }
    }
}
