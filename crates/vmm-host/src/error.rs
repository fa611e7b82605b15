//! Why the VMM process could not do something. Its errors reach the
//! client as text (the workspace's `vmm.log`, a control answer's message,
//! the record of a failed start), so each says what failed; the client
//! gives the stable code and what to do next.

use std::net::SocketAddr;

use base::images::registry::ImageError;
use base::network::NetworkError;
use base::store::console_log::ConsoleLogError;
use base::store::events::EventsError;
use base::store::ports::PortError;
use base::store::state::{State, TransitionError};
use base::store::workspace_dir::WorkspaceDirError;
use base::store::StoreError;
use base::volumes::VolumeError;

/// Why the VMM process could not do something.
#[derive(Debug, thiserror::Error)]
pub enum VmmProcessError {
    /// The state directory could not be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The workspace's directory or record could not be used.
    #[error(transparent)]
    WorkspaceDir(#[from] WorkspaceDirError),
    /// The event log could not be written.
    #[error("event log")]
    Events(#[from] EventsError),
    /// An illegal state change (a race another process won).
    #[error("state change refused")]
    Transition(#[from] TransitionError),
    /// The workspace's image could not be used.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The console log could not be opened.
    #[error("console log")]
    ConsoleLog(#[from] ConsoleLogError),
    /// A volume could not be attached.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// The workspace's network could not be attached.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A published port could not be bound.
    #[error(transparent)]
    Port(#[from] PortError),
    /// A standby process could not prepare its VM.
    #[error("preparing the standby's VM")]
    StandbyVm(#[source] vmm_core::machine::MachineError),
    /// A standby process could not make its empty network namespace.
    #[error("making the standby's network namespace ahead: {0}")]
    StandbyNetwork(String),
    /// A standby process could not take its mount namespace or make its
    /// private root ahead.
    #[error("making the standby's private root ahead")]
    StandbyRoot(#[source] base::host::jail::JailError),
    /// The passt started at a standby's claim did not leave the mount
    /// namespace the standby took ahead.
    #[error("the network helper started at the claim shares the VMM's mount namespace")]
    PasstNotApart(#[source] base::host::jail::JailError),
    /// A standby process could not wait for or take its claim.
    #[error(transparent)]
    Standby(#[from] base::vmm::standby::StandbyError),
    /// The spec's service ports break its rules.
    #[error("service ports")]
    ServicePorts(#[source] base::store::spec::SpecError),
    /// The workspace is not starting with this process as its VMM.
    #[error("workspace `{name}` is {state}: this VMM process was not started for it")]
    NotStartedForIt {
        /// The workspace.
        name: String,
        /// Its state.
        state: State,
    },
    /// The machine could not be built.
    #[error("workspace `{name}` failed to start: {reason}")]
    StartFailed {
        /// The workspace.
        name: String,
        /// Why, with its causes.
        reason: String,
    },
    /// A host address is published here already, for another guest port.
    #[error("host address {addr} is already published (to guest port {guest_port})")]
    AlreadyPublished {
        /// The host address.
        addr: SocketAddr,
        /// The guest port it is published to.
        guest_port: u16,
    },
    /// A host file or thread operation failed.
    #[error("{what}")]
    HostIo {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl VmmProcessError {
    /// The error for a host operation `what` that failed.
    pub fn host_io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| VmmProcessError::HostIo { what, source }
    }

    /// The message with its causes.
    pub fn full_message(&self) -> String {
        base::error_chain::error_chain(self)
    }
}

/// Results of the VMM process's steps.
pub(crate) type Result<T, E = VmmProcessError> = std::result::Result<T, E>;
