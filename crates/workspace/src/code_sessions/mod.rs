//! Stateful code sessions: a Jupyter kernel in a workspace (python's
//! `ipykernel`), driven from the host through the agent's `tcp_connect`
//! as the browser is. What a run returns ([`CodeRun`]), the kernel client
//! (`kernel`: ready, execute, interrupt, shut down) on Jupyter's signed
//! messages (`wire`) over ZMTP 3.0 (`zmtp`), which carry no ZeroMQ
//! library: the connections are the agent's tunnels.

pub mod kernel;
pub(crate) mod wire;
pub(crate) mod zmtp;

use serde::{Deserialize, Serialize};

pub use kernel::{CodeRunLimits, KernelClient, KernelError};

/// What one run of code gave back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct CodeRun {
    /// What it printed to stdout (the first [`CodeRunLimits::stream_bytes`]).
    pub stdout: String,
    /// What it printed to stderr (as bounded).
    pub stderr: String,
    /// The last expression's value as text (`repr` in Python), if any.
    pub result: Option<String>,
    /// What it raised, if anything.
    pub error: Option<CodeException>,
    /// Rich displays, each representation apart: images (`image/png` and
    /// `image/jpeg` in base64, `image/svg+xml`), `text/html` (DataFrame
    /// tables), `application/json`, `text/markdown`, and plain text shown
    /// with nothing richer.
    pub outputs: Vec<CodeOutput>,
    /// The kernel's count of runs, as `In [n]`.
    pub execution_count: Option<u64>,
    /// Some output was left out past the limits.
    pub truncated: bool,
    /// Why the run was stopped, when it was: `cancelled` or `timed out
    /// after Ns` (the kernel was interrupted; the session goes on).
    pub stopped: Option<String>,
}

/// One representation of a rich display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct CodeOutput {
    /// Its MIME type.
    pub mime: String,
    /// The data: text, or base64 for binary images.
    pub data: String,
}

/// An exception the code raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct CodeException {
    /// Its type (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback's lines, without terminal colors.
    pub traceback: Vec<String>,
}
