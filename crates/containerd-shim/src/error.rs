//! What fails in the shim, and the ttrpc status containerd gets for it
//! (containerd turns the status code into its own error kinds: not found,
//! already exists, failed precondition, ...).

use std::path::PathBuf;

use containerd_shim::protos::ttrpc::{self, Code};
use workspace::ErrorCode;

/// A failed shim call.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// No container of that id in this shim.
    #[error("container {0} does not exist in this shim")]
    NoContainer(String),
    /// No process of that exec id in the container.
    #[error("process {exec_id:?} of container {id} does not exist")]
    NoProcess {
        /// The container.
        id: String,
        /// The exec id asked for.
        exec_id: String,
    },
    /// The process has already ended (what runc's shim answers a signal
    /// for one with).
    #[error("process {0} has already finished")]
    Finished(String),
    /// A container or exec id already in use.
    #[error("{0} already exists")]
    Exists(String),
    /// The bundle's runtime spec could not be read.
    #[error("cannot read the runtime spec {}", path.display())]
    Spec {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: oci_spec::OciSpecError,
    },
    /// The runtime spec (or an exec's process spec) asks for something
    /// this shim cannot give.
    #[error("the runtime spec is not usable: {0}")]
    BadSpec(String),
    /// The container's root filesystem could not be mounted or unmounted.
    #[error("cannot {what} the container's root filesystem at {}", target.display())]
    Mount {
        /// Mount or unmount.
        what: &'static str,
        /// Where.
        target: PathBuf,
        /// Why.
        #[source]
        source: containerd_shim::Error,
    },
    /// The workspace library failed.
    #[error("cannot {what}")]
    Workspace {
        /// What was being done.
        what: String,
        /// Why (boxed: the library's error is large).
        #[source]
        source: Box<workspace::Error>,
    },
    /// The mount point in the bundle could not be made.
    #[error("cannot make the mount point {}", path.display())]
    MountPoint {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A FIFO containerd gave could not be opened.
    #[error("cannot open the FIFO {}", path.display())]
    Fifo {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The shim's record in the bundle could not be written or read.
    #[error("cannot {what} the shim's record {}", path.display())]
    Record {
        /// Read or write.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The shim's record or a checkpoint's descriptor could not be
    /// written.
    #[error("cannot write the shim's file")]
    Write(#[source] workspace::store::StoreError),
    /// The process is not in a state that allows the call.
    #[error("process {process} {why}")]
    WrongState {
        /// Which process.
        process: String,
        /// What is wrong.
        why: &'static str,
    },
    /// microagent's state directory could not be opened.
    #[error("cannot open microagent's state directory: {0}")]
    StateDir(String),
    /// A call with no microVM counterpart.
    #[error("{call} is not supported by the microagent shim: {why}")]
    Unsupported {
        /// The call.
        call: &'static str,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A protobuf message could not be encoded or decoded.
    #[error("cannot encode or decode {0}")]
    Protobuf(&'static str, #[source] containerd_shim::Error),
}

impl ShimError {
    /// The workspace library's `what` failed.
    pub fn workspace(what: impl Into<String>) -> impl FnOnce(workspace::Error) -> Self {
        let what = what.into();
        move |source| Self::Workspace {
            what,
            source: Box::new(source),
        }
    }

    fn code(&self) -> Code {
        match self {
            Self::NoContainer(_) | Self::NoProcess { .. } | Self::Finished(_) => Code::NOT_FOUND,
            Self::Exists(_) => Code::ALREADY_EXISTS,
            Self::Spec { .. } | Self::BadSpec(_) => Code::INVALID_ARGUMENT,
            Self::WrongState { .. } | Self::StateDir(_) => Code::FAILED_PRECONDITION,
            Self::Unsupported { .. } => Code::UNIMPLEMENTED,
            Self::Workspace { source, .. } => match source.code() {
                ErrorCode::NotFound => Code::NOT_FOUND,
                ErrorCode::InvalidInput => Code::INVALID_ARGUMENT,
                ErrorCode::NotRunning | ErrorCode::Conflict => Code::FAILED_PRECONDITION,
                ErrorCode::Forbidden => Code::PERMISSION_DENIED,
                ErrorCode::HostUnsupported => Code::UNAVAILABLE,
                ErrorCode::Timeout => Code::DEADLINE_EXCEEDED,
                _ => Code::INTERNAL,
            },
            Self::Mount { .. }
            | Self::MountPoint { .. }
            | Self::Fifo { .. }
            | Self::Record { .. }
            | Self::Write(_)
            | Self::Protobuf(..) => Code::INTERNAL,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        let message = workspace::error_chain(&e);
        log::warn!("{message}");
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_gets_the_kind_and_the_whole_chain() {
        let e = ShimError::workspace("start workspace ctr-1")(workspace::Error::InvalidInput(
            "memory is 1 MiB".into(),
        ));
        let ttrpc::Error::RpcStatus(status) = ttrpc::Error::from(e) else {
            panic!("not a status");
        };
        assert_eq!(status.code(), Code::INVALID_ARGUMENT);
        assert!(
            status.message.contains("start workspace ctr-1"),
            "{}",
            status.message
        );
        assert!(
            status.message.contains("memory is 1 MiB"),
            "{}",
            status.message
        );
        let missing = ShimError::NoContainer("x".into());
        let ttrpc::Error::RpcStatus(status) = ttrpc::Error::from(missing) else {
            panic!("not a status");
        };
        assert_eq!(status.code(), Code::NOT_FOUND);
    }
}
