//! Listening sockets: AF_VSOCK (in the guest) or a Unix socket (tests, or
//! a host process).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why the agent could not listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// socket(AF_VSOCK) failed (no vsock transport in this kernel?).
    #[error("creating a vsock socket")]
    VsockSocket(#[source] io::Error),
    /// bind() or listen() on the vsock port failed.
    #[error("listening on vsock port {port}")]
    VsockBind {
        port: u32,
        #[source]
        source: io::Error,
    },
    /// Binding the Unix socket failed.
    #[error("listening on {path}")]
    Unix {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A new AF_VSOCK stream socket.
pub fn vsock_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The vsock address (`cid`, `port`).
pub fn vsock_addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = cid;
    addr
}

/// A listening socket.
#[derive(Debug)]
pub enum Listener {
    /// A vsock socket bound to (VMADDR_CID_ANY, port).
    Vsock(OwnedFd),
    /// A Unix socket.
    Unix(UnixListener),
}

impl Listener {
    /// Listens on `port` for connections from any CID.
    pub fn vsock(port: u32) -> Result<Self, ListenError> {
        let fd = vsock_socket().map_err(ListenError::VsockSocket)?;
        let addr = vsock_addr(libc::VMADDR_CID_ANY, port);
        let bind_err = |source| ListenError::VsockBind { port, source };
        // SAFETY: `addr` is a valid sockaddr_vm and its exact size is passed.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(bind_err(io::Error::last_os_error()));
        }
        // SAFETY: listen() takes no pointers; `fd` is a bound socket.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(bind_err(io::Error::last_os_error()));
        }
        Ok(Self::Vsock(fd))
    }

    /// Listens on the Unix socket `path`, replacing a stale socket file.
    pub fn unix(path: &Path) -> Result<Self, ListenError> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(path);
        }
        UnixListener::bind(path)
            .map(Self::Unix)
            .map_err(|source| ListenError::Unix {
                path: path.to_owned(),
                source,
            })
    }

    /// Waits for the next connection. A vsock connection is returned as a
    /// `UnixStream` (see `conn`).
    pub fn accept(&self) -> io::Result<UnixStream> {
        match self {
            Self::Unix(listener) => listener.accept().map(|(stream, _)| stream),
            Self::Vsock(fd) => loop {
                // SAFETY: sockaddr_vm is plain data; all zeroes is a valid value.
                let mut peer: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
                // SAFETY: `peer` and `len` are live and `len` is `peer`'s
                // size; `fd` is a listening socket.
                let conn = unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        (&mut peer as *mut libc::sockaddr_vm).cast::<libc::sockaddr>(),
                        &mut len,
                        libc::SOCK_CLOEXEC,
                    )
                };
                if conn < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: accept4 returned a new descriptor that nothing else owns.
                let conn = unsafe { OwnedFd::from_raw_fd(conn) };
                // Only the host drives the agent: a guest process that
                // reached the port (a kernel with vsock loopback) is dropped.
                if peer.svm_cid != libc::VMADDR_CID_HOST {
                    log!("refused a vsock connection from CID {}", peer.svm_cid);
                    continue;
                }
                return Ok(UnixStream::from(conn));
            },
        }
    }
}
