//! Stateful code sessions (`dev.code()`): a Jupyter kernel in a workspace
//! (Python's `ipykernel`), started as a background process and driven
//! from the host through the agent's `tcp_connect`, as the browser is.
//! What a run returns ([`CodeRun`]); the kernel client (`jupyter`: ready,
//! execute, interrupt, shut down) on Jupyter's signed messages (`wire`)
//! over ZMTP 3.0 (`zmtp`, no ZeroMQ library: the connections are the
//! agent's tunnels); the host's records of a workspace's sessions
//! (`records`); the kernel's process in the guest (`launch`), forked by
//! the workspace's kernel server (`server`); kernels made
//! ahead in an image's warm snapshot (`ready`); the calls (`ops`).

mod javascript;
pub mod jupyter;
pub(crate) mod kept;
pub(crate) mod launch;
pub(crate) mod ops;
mod outputs;
mod ready;
pub(crate) mod records;
pub(crate) mod server;
pub(crate) mod wire;
pub(crate) mod zmtp;

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;

pub use jupyter::{JupyterClient, JupyterError};
pub use launch::KERNEL_IP_ARG;
pub use ops::{WorkspaceCode, DEFAULT_RUN_TIMEOUT, MAX_RUN_TIMEOUT};
pub use outputs::CodeRunLimits;
pub use ready::{prepare, ready_for, PreparedKernels, READY_NAMESPACE};
pub use records::is_session_id;
pub use server::{LAUNCHER, SERVER};

/// The image the code sessions are made for, as `setup --with code`
/// builds it.
pub const IMAGE: &str = "code";
/// Its Debian packages: Jupyter's Python kernel with the usual data
/// libraries, and Node.js.
pub const IMAGE_PACKAGES: &[&str] = &[
    "python3-ipykernel",
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
    "nodejs",
];
/// Guest memory (MiB) a workspace of the [`IMAGE`] gets unless asked
/// otherwise: a kernel with pandas and matplotlib loaded.
pub const IMAGE_MEM_MIB: u64 = 1024;
/// Sessions a workspace may have at once.
pub const MAX_SESSIONS: usize = 8;

/// The build of the [`IMAGE`]: Debian bookworm with [`IMAGE_PACKAGES`].
pub fn image_request() -> crate::images::build::ImageBuildRequest {
    crate::images::build::ImageBuildRequest {
        mem_mib: Some(IMAGE_MEM_MIB),
        ..crate::images::build::ImageBuildRequest::debian_recipe(
            IMAGE,
            IMAGE_PACKAGES,
            "Debian with Jupyter's Python kernel, numpy, pandas, matplotlib and Node.js, for code sessions",
        )
    }
}

/// A session's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CodeLanguage {
    /// Python 3 through `ipykernel`.
    Python,
    /// JavaScript in Node.js, through this library's own kernel
    /// (`javascript.rs`).
    #[serde(rename = "javascript")]
    JavaScript,
}

impl CodeLanguage {
    /// Its name as callers write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::JavaScript => "javascript",
        }
    }
}

impl std::str::FromStr for CodeLanguage {
    type Err = CodeSessionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "python" | "python3" => Ok(Self::Python),
            "javascript" | "js" | "node" => Ok(Self::JavaScript),
            other => Err(CodeSessionError::UnknownLanguage(
                other.chars().take(64).collect(),
            )),
        }
    }
}

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

/// A code session of a workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct CodeSessionInfo {
    /// Its id in the workspace (`code-N`).
    pub id: String,
    /// Its language.
    pub language: CodeLanguage,
    /// When it was started, Unix ms (the host's clock).
    pub created_unix_ms: u64,
    /// Whether its kernel is running (it ends with its workspace's stop).
    pub running: bool,
}

/// Why a code-session call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodeSessionError {
    /// A language this library has no kernel for.
    #[error("no code sessions in `{0}` (languages: python, javascript)")]
    UnknownLanguage(String),
    /// The workspace's image has no kernel for the language.
    #[error("workspace `{workspace}` has no {language} kernel (looked for {looked_for})")]
    NotInstalled {
        /// The workspace.
        workspace: String,
        /// The language.
        language: &'static str,
        /// What was looked for.
        looked_for: String,
    },
    /// No session of that id.
    #[error("workspace `{workspace}` has no code session `{session}`")]
    UnknownSession {
        /// The workspace.
        workspace: String,
        /// The id asked for.
        session: String,
    },
    /// Its kernel is gone (the workspace stopped, or the kernel exited).
    #[error("code session `{session}` of workspace `{workspace}` has ended: {why}")]
    Ended {
        /// The workspace.
        workspace: String,
        /// The session.
        session: String,
        /// What ended it.
        why: String,
    },
    /// The workspace has as many sessions as it may.
    #[error("workspace `{workspace}` has {limit} code sessions, the most it may have")]
    TooMany {
        /// The workspace.
        workspace: String,
        /// The bound.
        limit: usize,
    },
    /// The kernel did not start.
    #[error("the {language} kernel of workspace `{workspace}` did not start: {detail}")]
    Start {
        /// The workspace.
        workspace: String,
        /// The language.
        language: &'static str,
        /// What it said.
        detail: String,
    },
    /// The kernel's connection file is not one we can use.
    #[error("the kernel's connection file is not usable: {0}")]
    ConnectionFile(String),
    /// A workspace on a server: not served yet.
    #[error("code sessions of workspaces on servers are not supported yet")]
    OnServer,
    /// The kernels made ahead were not kept as the image's warm snapshot.
    #[error("the kernels made ahead were not kept as image `{image}`'s warm snapshot: {why}")]
    NotKept {
        /// The image.
        image: String,
        /// Why not.
        why: &'static str,
    },
    /// Talking to the kernel failed.
    #[error(transparent)]
    Kernel(#[from] JupyterError),
    /// The session records could not be used.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl crate::error::ConcernError for CodeSessionError {
    fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownLanguage(_)
            | Self::NotInstalled { .. }
            | Self::TooMany { .. }
            | Self::OnServer => ErrorCode::InvalidInput,
            Self::UnknownSession { .. } | Self::Ended { .. } => ErrorCode::NotFound,
            Self::NotKept { .. } => ErrorCode::Conflict,
            Self::Kernel(JupyterError::Unresponsive { .. }) => ErrorCode::Timeout,
            Self::Start { .. } | Self::ConnectionFile(_) | Self::Kernel(_) | Self::Io { .. } => {
                ErrorCode::Internal
            }
        }
    }

    fn remedy(&self) -> Option<base::remedy::Remedy> {
        match self {
            Self::NotInstalled { .. } => Some(base::remedy::Remedy::UseKernelImage),
            _ => None,
        }
    }
}

impl From<CodeSessionError> for crate::error::Error {
    fn from(e: CodeSessionError) -> Self {
        crate::error::Error::CodeSession(crate::error::ConcernFailure::new(e))
    }
}
