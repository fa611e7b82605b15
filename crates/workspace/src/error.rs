//! The error every workspace operation returns: what failed, a message that
//! says what to do next, and the stable [`ErrorCode`] front ends report.

use guest_agent::client::ClientError;
use guest_agent::protocol::AgentErrorCode as AgentCode;

use base::code::ErrorCode;

use base::images::registry::ImageError;
use base::network::NetworkError;
use base::remedy::Remedy;
use base::store::console_log::ConsoleLogError;
use base::store::events::EventsError;
use base::store::ports::PortError;
use base::store::spec::{SpecError, DELETE_NEEDS_FORCE};
use base::store::state::{State, TransitionError};
use base::store::workspace_dir::WorkspaceDirError;
use base::store::StoreError;
use base::vmm::control::ControlError;

/// Why a workspace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No workspace of that name.
    #[error("workspace `{0}` does not exist")]
    WorkspaceNotFound(String),
    /// The name is taken.
    #[error("workspace `{0}` already exists")]
    WorkspaceExists(String),
    /// No snapshot of that name.
    #[error("snapshot `{0}` does not exist")]
    SnapshotNotFound(String),
    /// The workspace names no service of that name.
    #[error("workspace `{workspace}` has no service `{service}`")]
    ServiceNotFound {
        /// The workspace.
        workspace: String,
        /// The service asked for.
        service: String,
    },
    /// Another agent owns it and did not share it with the caller.
    #[error("{kind} `{name}` belongs to agent `{owner}`")]
    OwnedByAnotherAgent {
        /// `workspace` or `snapshot`.
        kind: &'static str,
        /// Its full name.
        name: String,
        /// The owning agent (`no agent` for a session without one is never
        /// the owner: things it makes have none).
        owner: String,
    },
    /// The snapshot name is taken.
    #[error("snapshot `{0}` already exists")]
    SnapshotExists(String),
    /// The snapshot's files are damaged or from another build.
    #[error("snapshot `{name}` cannot be used: {reason}")]
    SnapshotUnusable {
        /// The snapshot.
        name: String,
        /// Why.
        reason: String,
    },
    /// A request value is out of range or malformed.
    #[error("{0}")]
    InvalidInput(String),
    /// The operation needs a running workspace.
    #[error("workspace `{name}` is {state}")]
    NotRunning {
        /// The workspace.
        name: String,
        /// Its state.
        state: State,
    },
    /// The workspace is in a state that does not allow the operation.
    #[error("workspace `{name}` is {state}: {why}")]
    WrongState {
        /// The workspace.
        name: String,
        /// Its state.
        state: State,
        /// Why the operation cannot be done in that state.
        why: &'static str,
        /// What to do instead, if anything.
        remedy: Option<Remedy>,
    },
    /// An illegal state change (a bug, or a race another process won).
    #[error("state change refused")]
    Transition(#[from] TransitionError),
    /// The host cannot run workspaces.
    #[error("{0}")]
    HostUnsupported(String),
    /// Something did not finish in time.
    #[error("{0}")]
    Timeout(String),
    /// The guest agent did not answer within the start timeout; the VM was
    /// halted.
    #[error("workspace `{name}` did not answer within {secs} s and was halted")]
    StartTimedOut {
        /// The workspace.
        name: String,
        /// The timeout.
        secs: u64,
    },
    /// The workspace's VM did not come up.
    #[error("workspace `{name}` failed to start: {reason}")]
    StartFailed {
        /// The workspace.
        name: String,
        /// What is known.
        reason: String,
    },
    /// The state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The event log.
    #[error("event log")]
    Events(#[from] EventsError),
    /// The image registry.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A registry did not give an image.
    #[error(transparent)]
    Registry(ConcernFailure),
    /// The console log.
    #[error("console log")]
    ConsoleLog(#[from] ConsoleLogError),
    /// The VMM's control socket.
    #[error("talking to the workspace's VMM")]
    Control(#[from] ControlError),
    /// The guest agent refused or failed an operation.
    #[error("guest agent: {op} failed")]
    Agent {
        /// The operation.
        op: &'static str,
        /// What the client saw.
        #[source]
        source: ClientError,
    },
    /// A synchronous step run on a worker thread did not finish (it
    /// panicked or its runtime shut down).
    #[error("a blocking step did not finish: {0}")]
    BlockingStep(String),
    /// A network operation failed.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A host change was not previewed, confirmed or applied.
    #[error(transparent)]
    Plan(#[from] base::host::plan::PlanError),
    /// A confirm token was refused.
    #[error(transparent)]
    Confirm(#[from] crate::host::confirm::ConfirmError),
    /// A kernel install failed.
    #[error(transparent)]
    KernelInstall(ConcernFailure),
    /// An image build failed.
    #[error(transparent)]
    ImageBuild(ConcernFailure),
    /// The account VMMs run as could not be found or given their files.
    #[error(transparent)]
    VmmUser(#[from] base::vmm::user::VmmUserError),
    /// An image search could not be made.
    #[error(transparent)]
    Search(ConcernFailure),
    /// A volume operation failed.
    #[error(transparent)]
    Volume(#[from] base::volumes::VolumeError),
    /// A server operation failed.
    #[error(transparent)]
    Server(#[from] crate::servers::ServerError),
    /// A browser call failed.
    #[error(transparent)]
    Browser(ConcernFailure),
    /// A code-session call failed.
    #[error(transparent)]
    CodeSession(ConcernFailure),
    /// A repository operation failed.
    #[error(transparent)]
    Repo(#[from] crate::repos::RepoError),
    /// An agent operation failed.
    #[error(transparent)]
    Agents(#[from] crate::agents::AgentError),
    /// A task operation failed.
    #[error(transparent)]
    Task(ConcernFailure),
    /// A secret operation failed.
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    /// A preview could not be made, found or revoked.
    #[error(transparent)]
    Preview(#[from] base::store::previews::PreviewError),
    /// A pool of ready workspaces could not be set or filled.
    #[error(transparent)]
    Pool(ConcernFailure),
    /// One of a workspace's services could not be made, started or
    /// removed.
    #[error("service `{service}`")]
    Service {
        /// The service's name.
        service: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A volume is mounted read-write by another running workspace, or
    /// read-only by one when it is asked for read-write.
    #[error("volume `{volume}` is mounted {mode} by running workspace `{holder}`")]
    VolumeHeld {
        /// The volume.
        volume: String,
        /// The workspace that holds it.
        holder: String,
        /// How it holds it (`read-write`, `read-only`).
        mode: &'static str,
    },
    /// The host budget refused, or could not be read.
    #[error(transparent)]
    Budget(#[from] crate::host::budget::BudgetError),
    /// not an address of this machine.
    #[error("host address {addr} cannot be listened on")]
    PortUnavailable {
        /// The address.
        addr: std::net::SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The workspace does not publish that host address.
    #[error("workspace `{workspace}` publishes no port on {addr}")]
    PortNotPublished {
        /// The workspace.
        workspace: String,
        /// The host address.
        addr: std::net::SocketAddr,
    },
    /// What a guest sent was refused or over budget, or could not be
    /// written on the host.
    #[error("copying to the host")]
    HostWrite(#[from] crate::host::host_write::HostWriteError),
    /// Outputs past the inline caps were over a quota, or could not be
    /// kept on the host.
    #[error(transparent)]
    KeptOutputs(#[from] base::store::kept_outputs::KeptOutputsError),
    /// The workspace's image lacks the interpreter code was to run with.
    #[error("workspace `{workspace}` (image `{image}`) has no {interpreter}")]
    InterpreterMissing {
        /// The workspace.
        workspace: String,
        /// Its image.
        image: String,
        /// The interpreter.
        interpreter: &'static str,
        /// An image that has it.
        image_with_it: &'static str,
    },
    /// A one-shot code run needs the image with every interpreter, and
    /// this host does not have it.
    #[error(
        "run_code's one-shot workspaces use the `{image}` image, which is not built on this host"
    )]
    CodeImageMissing {
        /// The image.
        image: &'static str,
        /// The interpreter the code was to run with.
        interpreter: &'static str,
    },
    /// A copy out would replace or merge into an existing host path it
    /// was not asked to overwrite.
    #[error("host path {} exists", path.display())]
    HostPathExists {
        /// The host path.
        path: std::path::PathBuf,
    },
    /// A copy out would write git metadata on the host (a guest-written
    /// `.git/config` or hook runs code at the next `git` command).
    #[error("host path {} is git metadata; a copy out writes none unless asked", path.display())]
    GitMetadataRefused {
        /// The host path.
        path: std::path::PathBuf,
    },
    /// An edit's text does not occur as often as the caller expected:
    /// nothing was changed.
    #[error("{path} has {found} occurrence(s) of the text to replace, not {expected}; nothing was changed")]
    EditMismatch {
        /// The guest file.
        path: String,
        /// Occurrences expected.
        expected: usize,
        /// Occurrences found.
        found: usize,
    },
    /// A host-side file operation failed.
    #[error("{what}")]
    HostIo {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::WorkspaceNotFound(_) => ErrorCode::NotFound,
            Error::WorkspaceExists(_) => ErrorCode::Conflict,
            Error::SnapshotNotFound(_) => ErrorCode::NotFound,
            Error::ServiceNotFound { .. } => ErrorCode::NotFound,
            Error::OwnedByAnotherAgent { .. } => ErrorCode::Forbidden,
            Error::SnapshotExists(_) => ErrorCode::Conflict,
            Error::SnapshotUnusable { .. } => ErrorCode::InvalidInput,
            Error::InvalidInput(_) => ErrorCode::InvalidInput,
            Error::NotRunning { .. } => ErrorCode::NotRunning,
            Error::WrongState { .. } | Error::Transition(_) => ErrorCode::Conflict,
            Error::HostUnsupported(_) => ErrorCode::HostUnsupported,
            Error::Timeout(_) | Error::StartTimedOut { .. } => ErrorCode::Timeout,
            Error::StartFailed { .. } => ErrorCode::Internal,
            Error::Store(e) => e.code(),
            Error::Image(e) => e.code(),
            Error::Registry(e) => e.code(),
            Error::Network(e) => e.code(),
            Error::Plan(e) => e.code(),
            Error::Confirm(e) => e.code(),
            Error::KernelInstall(e) => e.code(),
            Error::ImageBuild(e) => e.code(),
            Error::Budget(e) => e.code(),
            Error::VmmUser(e) => e.code(),
            Error::Volume(e) => e.code(),
            Error::Server(e) => e.code(),
            Error::Browser(e) | Error::CodeSession(e) => e.code(),
            Error::Repo(e) => e.code(),
            Error::Agents(e) => e.code(),
            Error::Task(e) => e.code(),
            Error::Secret(e) => e.code(),
            Error::Preview(e) => e.code(),
            Error::Pool(e) => e.code(),
            Error::Service { source, .. } => source.code(),
            Error::Search(e) => e.code(),
            Error::VolumeHeld { .. } => ErrorCode::Conflict,
            Error::Agent { source, .. } => agent_code(source),
            Error::PortUnavailable { source, .. } => {
                if source.kind() == std::io::ErrorKind::AddrInUse {
                    ErrorCode::Conflict
                } else {
                    ErrorCode::InvalidInput
                }
            }
            Error::PortNotPublished { .. } => ErrorCode::NotFound,
            Error::HostPathExists { .. } => ErrorCode::Conflict,
            Error::EditMismatch { .. } => ErrorCode::Conflict,
            Error::GitMetadataRefused { .. } => ErrorCode::Forbidden,
            Error::InterpreterMissing { .. } => ErrorCode::InvalidInput,
            Error::CodeImageMissing { .. } => ErrorCode::NotFound,
            Error::KeptOutputs(e) => e.code(),
            Error::HostWrite(e) => match e {
                crate::host::host_write::HostWriteError::Refused { .. } => ErrorCode::Forbidden,
                crate::host::host_write::HostWriteError::OverBudget { .. } => {
                    ErrorCode::InvalidInput
                }
                crate::host::host_write::HostWriteError::Io { .. } => ErrorCode::Internal,
            },
            Error::Events(_)
            | Error::ConsoleLog(_)
            | Error::Control(_)
            | Error::HostIo { .. }
            | Error::BlockingStep(_) => ErrorCode::Internal,
        }
    }

    /// What resolves the failure, if the caller can do something: each
    /// front end words it in its own terms.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            Error::WorkspaceNotFound(_) => Some(Remedy::ListWorkspaces),
            Error::WorkspaceExists(name) => Some(Remedy::ChooseAnotherName {
                workspace: name.clone(),
            }),
            Error::SnapshotNotFound(_) => Some(Remedy::ListSnapshots),
            Error::OwnedByAnotherAgent { kind, name, owner } => Some(Remedy::AskOwnerToShare {
                kind,
                name: name.clone(),
                owner: owner.clone(),
            }),
            Error::SnapshotExists(name) => Some(Remedy::ChooseAnotherSnapshotName {
                snapshot: name.clone(),
            }),
            Error::NotRunning { name, .. } => Some(Remedy::StartWorkspace {
                workspace: name.clone(),
            }),
            Error::WrongState { remedy, .. } => remedy.clone(),
            Error::StartFailed { name, .. } | Error::StartTimedOut { name, .. } => {
                Some(Remedy::ReadConsole {
                    workspace: name.clone(),
                })
            }
            Error::Image(e) => e.remedy(),
            Error::Browser(e) | Error::CodeSession(e) | Error::Task(e) | Error::Pool(e) => {
                e.remedy()
            }
            Error::Service { source, .. } => source.remedy(),
            Error::Volume(e) => e.remedy(),
            Error::Repo(e) => e.remedy(),
            Error::Secret(e) => e.remedy(),
            Error::VolumeHeld { volume, holder, .. } => Some(Remedy::StopVolumeHolder {
                volume: volume.clone(),
                workspace: holder.clone(),
            }),
            Error::Network(e) => e.remedy(),
            Error::Plan(e) => e.remedy(),
            Error::Confirm(e) => e.remedy(),
            Error::PortUnavailable { addr, .. } => Some(Remedy::ChooseAnotherPort { addr: *addr }),
            Error::PortNotPublished { workspace, .. } => Some(Remedy::ListPorts {
                workspace: workspace.clone(),
            }),
            Error::HostPathExists { path } => Some(Remedy::Overwrite { path: path.clone() }),
            Error::GitMetadataRefused { .. } => Some(Remedy::IncludeGitMetadata),
            Error::InterpreterMissing { image_with_it, .. } => Some(Remedy::UseCodeImage {
                image: (*image_with_it).into(),
            }),
            Error::CodeImageMissing { image, interpreter } => Some(Remedy::BuildCodeImage {
                image: (*image).into(),
                interpreter,
            }),
            _ => None,
        }
    }

    /// The message with every cause, on one line.
    pub fn full_message(&self) -> String {
        base::error_chain::error_chain(self)
    }

    pub(crate) fn agent(op: &'static str) -> impl FnOnce(ClientError) -> Error {
        move |source| Error::Agent { op, source }
    }

    /// The error for a host file operation `what` that failed (for the
    /// VMM process, which reports into the same error type).
    pub fn host_io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::HostIo { what, source }
    }
}

// Module errors the callers have always seen as one of the variants above
// keep that variant: same message, code and remedy.

impl From<SpecError> for Error {
    fn from(e: SpecError) -> Self {
        match e {
            SpecError::Invalid(message) => Error::InvalidInput(message),
            SpecError::Ports(e) => e.into(),
            SpecError::Volumes(e) => Error::InvalidInput(e.to_string()),
            SpecError::Services(e) => Error::InvalidInput(e.to_string()),
            SpecError::DeleteRunning { name, state } => Error::WrongState {
                remedy: Some(Remedy::StopOrForce {
                    workspace: name.clone(),
                }),
                name,
                state,
                why: DELETE_NEEDS_FORCE,
            },
        }
    }
}

impl From<PortError> for Error {
    fn from(e: PortError) -> Self {
        match e {
            PortError::Invalid(message) => Error::InvalidInput(message),
            PortError::Unavailable { addr, source } => Error::PortUnavailable { addr, source },
        }
    }
}

impl From<WorkspaceDirError> for Error {
    fn from(e: WorkspaceDirError) -> Self {
        match e {
            WorkspaceDirError::NotFound(name) => Error::WorkspaceNotFound(name),
            e @ WorkspaceDirError::SocketPathTooLong { .. } => Error::InvalidInput(e.to_string()),
            WorkspaceDirError::Write { path, source } => Error::HostIo {
                what: format!("writing {}", path.display()),
                source,
            },
            WorkspaceDirError::Store(e) => Error::Store(e),
            WorkspaceDirError::Transition(e) => Error::Transition(e),
            WorkspaceDirError::Events(e) => Error::Events(e),
        }
    }
}

fn agent_code(e: &ClientError) -> ErrorCode {
    if matches!(e, ClientError::Stalled { .. }) {
        return ErrorCode::Timeout;
    }
    match e.code() {
        Some(AgentCode::NotFound) => ErrorCode::NotFound,
        Some(AgentCode::InvalidInput | AgentCode::TooLarge | AgentCode::Exists) => {
            ErrorCode::InvalidInput
        }
        Some(AgentCode::PermissionDenied) => ErrorCode::Forbidden,
        Some(AgentCode::Timeout) => ErrorCode::Timeout,
        // An agent from an older image, asked for something newer (a pty).
        Some(AgentCode::UnsupportedVersion) => ErrorCode::HostUnsupported,
        _ => ErrorCode::Internal,
    }
}

/// What a concern's own error enum (a task's, a pool's, the browser's,
/// an image build's, search's or registry's) gives [`Error`]: the code front ends report and what
/// resolves it. The concern's folder sits above this module (its service
/// calls the collection, which returns [`Error`]), so [`Error`] holds it
/// boxed, through this trait, instead of naming its type.
pub trait ConcernError: std::error::Error + Send + Sync + 'static {
    /// The stable code front ends report.
    fn code(&self) -> ErrorCode;
    /// What resolves it, if the caller can do something.
    fn remedy(&self) -> Option<Remedy> {
        None
    }
}

/// A concern's error inside [`Error`]: shown as itself, its source its
/// own source (the box adds nothing to the chain).
#[derive(Debug)]
pub struct ConcernFailure(Box<dyn ConcernError>);

impl ConcernFailure {
    /// Boxes a concern's error.
    pub fn new(e: impl ConcernError) -> ConcernFailure {
        ConcernFailure(Box::new(e))
    }

    /// The concern's error, if it is a `T`.
    pub fn downcast_ref<T: ConcernError>(&self) -> Option<&T> {
        let e: &(dyn std::error::Error + 'static) = &*self.0;
        e.downcast_ref::<T>()
    }

    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        self.0.code()
    }

    /// What resolves it, if the caller can do something.
    pub fn remedy(&self) -> Option<Remedy> {
        self.0.remedy()
    }
}

impl std::fmt::Display for ConcernFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ConcernFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Shorthand for results of workspace operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_concern_error_keeps_its_code_remedy_text_and_source_through_the_box() {
        let e = Error::from(crate::tasks::TaskError::NotFound("t1".into()));
        assert!(matches!(e, Error::Task(_)));
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert_eq!(
            e.to_string(),
            crate::tasks::TaskError::NotFound("t1".into()).to_string()
        );
        let Error::Task(f) = &e else { unreachable!() };
        assert!(matches!(
            f.downcast_ref::<crate::tasks::TaskError>(),
            Some(crate::tasks::TaskError::NotFound(id)) if id == "t1"
        ));
        assert!(f.downcast_ref::<crate::browser::BrowserError>().is_none());

        let page = crate::browser::BrowserError::UnknownPage {
            workspace: "dev".into(),
            page: "p".into(),
        };
        let e = Error::from(page);
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert_eq!(
            e.remedy(),
            Some(Remedy::OpenBrowserPage {
                workspace: "dev".into(),
                page: "p".into()
            })
        );

        // The box is transparent: the chain shows the cause once.
        let io = crate::tasks::TaskError::Io {
            what: "reading task.json".into(),
            source: std::io::Error::other("disk gone"),
        };
        let e = Error::from(io);
        assert_eq!(e.code(), ErrorCode::Internal);
        let chain = base::error_chain::error_chain(&e);
        assert_eq!(chain.matches("disk gone").count(), 1, "{chain}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn codes_follow_the_failure() {
        assert_eq!(
            Error::WorkspaceNotFound("x".into()).code(),
            ErrorCode::NotFound
        );
        assert_eq!(
            Error::WorkspaceExists("x".into()).code(),
            ErrorCode::Conflict
        );
        let not_running = Error::NotRunning {
            name: "dev".into(),
            state: State::Stopped,
        };
        assert_eq!(not_running.code(), ErrorCode::NotRunning);
        assert_eq!(
            not_running.remedy(),
            Some(Remedy::StartWorkspace {
                workspace: "dev".into()
            })
        );
        let agent = Error::Agent {
            op: "read_file",
            source: ClientError::Agent {
                code: AgentCode::NotFound,
                message: "no such file".into(),
            },
        };
        assert_eq!(agent.code(), ErrorCode::NotFound);
        assert!(agent.full_message().contains("no such file"));
        let denied = Error::Agent {
            op: "write_file",
            source: ClientError::Agent {
                code: AgentCode::PermissionDenied,
                message: "read-only".into(),
            },
        };
        assert_eq!(denied.code(), ErrorCode::Forbidden);
        assert_eq!(
            Error::Store(StoreError::Name(base::store::name::NameError::Empty)).code(),
            ErrorCode::InvalidInput
        );
    }
}
