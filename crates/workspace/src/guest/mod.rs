//! Work in a running guest through its agent: commands (their records
//! `request`, the run `exec`, on a server `exec_remote`, signals and
//! cancels `exec_control`), code run
//! as a script (`code`),
//! background processes (`processes`), files (`files`; copies between
//! the host and the guest, planned before they run, `copy`; directories, removal, moves,
//! edits, lines and finding, `file_ops`; files a command leaves behind,
//! `outputs`, kept in the state directory by
//! `base::store::kept_outputs`), the
//! streaming types (`stream`), metrics (`metrics`) and file watches
//! (`watch`). The workspace's
//! browser, which runs Chromium through these calls, is `crate::browser`.
//! What lands on the host goes through `host::host_write`.

pub mod code;
pub mod copy;
pub(crate) mod exec;
pub(crate) mod exec_control;
pub(crate) mod exec_remote;
pub(crate) mod file_ops;
pub(crate) mod files;
pub(crate) mod metrics;
pub(crate) mod outputs;
pub(crate) mod processes;
pub(crate) mod repo;
pub(crate) mod request;
pub(crate) mod stream;
pub(crate) mod watch;

pub use copy::Copied;
pub use exec_control::ExecEnd;
pub use file_ops::{Edited, Found, Lines, Removal, MAX_FIND_DEPTH, MAX_FIND_VISITS, MAX_FOUND};
pub use files::{
    ConsoleChunk, DirEntry, DirListing, FileKind, FileStat, WorkspaceFiles, MAX_EVENT_WAIT,
};
pub use metrics::{BalloonMetrics, WorkspaceMetrics, CPU_SAMPLE};
pub use outputs::{
    check_patterns, mime_of, OutputFile, Outputs, MAX_OUTPUT_FILES, MAX_OUTPUT_PATTERNS,
    OUTPUT_FILE_CAP, OUTPUT_TOTAL_CAP,
};
pub use processes::{
    ProcessOptions, ProcessOutput, ProcessState, StreamOutput, WorkspaceProcesses,
    DEFAULT_PROCESS_RING, MAX_FINISHED_PROCESSES, MAX_PROCESS_READ, MAX_PROCESS_RING,
    MAX_RUNNING_PROCESSES,
};
pub use request::{Exited, OutputCollector, MAX_COLLECTED_BYTES};
pub use stream::{ExecEvent, PtySize, TerminalInput};
pub use watch::{
    is_watch_id, ChangeKind, FileChange, FileChanges, WatchInfo, WorkspaceWatches, MAX_WATCHES,
    MAX_WATCH_DIRS, MAX_WATCH_EVENTS, MAX_WATCH_READ, MAX_WATCH_WAIT,
};

/// A connection to the guest agent of the workspace in `ws`, carrying the
/// identity a claimed pool member has yet to take
/// (`base::store::workspace_dir::PENDING_IDENTITY`).
pub(crate) async fn connect_agent(
    ws: &base::store::workspace_dir::WorkspaceDir,
) -> Result<
    guest_agent::client::GuestAgentClient<tokio::net::UnixStream>,
    guest_agent::client::ClientError,
> {
    let endpoint = guest_agent::client::AgentEndpoint::HybridVsock {
        uds: ws.vsock(),
        port: base::store::workspace_dir::AGENT_PORT,
    };
    let client = endpoint.connect().await?;
    Ok(match ws.pending_identity() {
        Some(identity) => client.with_identity(identity),
        None => client,
    })
}

/// [`connect_agent`] for a call that found `name` running in `ws`: when
/// the connection fails because the workspace hibernated by itself as the
/// call came (its VMM checks for arrivals while it writes the machine, but
/// one can come in the last moments), it is restored and connected again.
pub(crate) async fn connect_awake(
    all: &crate::workspaces::manager::Workspaces,
    name: &str,
    ws: &base::store::workspace_dir::WorkspaceDir,
) -> crate::error::Result<guest_agent::client::GuestAgentClient<tokio::net::UnixStream>> {
    let first = match connect_agent(ws).await {
        Ok(client) => return Ok(client),
        Err(e) => e,
    };
    // The record is written just before the VMM ends.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    if all.at(name).get_here()?.state != base::store::state::State::Hibernated {
        return Err(crate::error::Error::agent("connect")(first));
    }
    let (ws, _) = all.awake(name).await?;
    connect_agent(&ws)
        .await
        .map_err(crate::error::Error::agent("connect"))
}
