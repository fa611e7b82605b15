//! Work in a running guest through its agent: commands (`exec`), code run
//! as a script (`code`),
//! background processes (`processes`), files (`files`; copies between
//! the host and the guest, planned before they run, `copy`; directories, removal, moves,
//! edits, lines and finding, `file_ops`; files a command leaves behind,
//! `outputs`), the streaming types (`stream`), metrics (`metrics`) and
//! the idle reclaim setting (`reclaim`), and the workspace's browser
//! (`browser_launch`: Chromium started on first use; `browser_ops`: the
//! browser calls, on `crate::browser`'s DevTools client). What lands on the
//! host goes through `host::host_write`.

#[cfg(feature = "client")]
pub(crate) mod browser_launch;
#[cfg(feature = "client")]
pub(crate) mod browser_ops;
#[cfg(feature = "client")]
pub mod code;
#[cfg(feature = "client")]
pub mod copy;
#[cfg(feature = "client")]
pub(crate) mod exec;
#[cfg(feature = "client")]
pub(crate) mod exec_control;
#[cfg(feature = "client")]
pub(crate) mod file_ops;
#[cfg(feature = "client")]
pub(crate) mod files;
#[cfg(feature = "client")]
pub(crate) mod metrics;
#[cfg(feature = "client")]
pub(crate) mod outputs;
#[cfg(feature = "client")]
pub(crate) mod processes;
pub mod reclaim;
#[cfg(feature = "client")]
pub(crate) mod repo;
#[cfg(feature = "client")]
pub(crate) mod stream;

#[cfg(feature = "client")]
pub use browser_ops::WorkspaceBrowser;
#[cfg(feature = "client")]
pub use copy::Copied;
#[cfg(feature = "client")]
pub use exec::{Exited, OutputCollector, MAX_COLLECTED_BYTES};
#[cfg(feature = "client")]
pub use exec_control::ExecEnd;
#[cfg(feature = "client")]
pub use file_ops::{Edited, Found, Lines, Removal, MAX_FIND_DEPTH, MAX_FIND_VISITS, MAX_FOUND};
#[cfg(feature = "client")]
pub use files::{
    ConsoleChunk, DirEntry, DirListing, FileKind, FileStat, WorkspaceFiles, MAX_EVENT_WAIT,
};
#[cfg(feature = "client")]
pub use metrics::{BalloonMetrics, WorkspaceMetrics, CPU_SAMPLE};
#[cfg(feature = "client")]
pub use outputs::{
    check_patterns, mime_of, OutputFile, Outputs, MAX_OUTPUT_FILES, MAX_OUTPUT_PATTERNS,
    OUTPUT_FILE_CAP, OUTPUT_TOTAL_CAP,
};
#[cfg(feature = "client")]
pub use processes::{
    ProcessOptions, ProcessOutput, ProcessState, StreamOutput, WorkspaceProcesses,
    DEFAULT_PROCESS_RING, MAX_FINISHED_PROCESSES, MAX_PROCESS_READ, MAX_PROCESS_RING,
    MAX_RUNNING_PROCESSES,
};
#[cfg(feature = "client")]
pub use stream::{ExecEvent, PtySize, TerminalInput};
