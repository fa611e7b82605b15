//! The control socket of a workspace's VMM process (`control.sock` in its
//! directory): one JSON request line, one JSON response line, per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest request line the server reads (a snapshot request holds a path;
/// an egress policy up to `MAX_ALLOW` rules of up to 255 bytes each).
const MAX_LINE: u64 = 80 << 10;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    /// How the VMM is doing.
    Status,
    /// Stop the guest: ask the agent to shut down, force after `timeout_ms`.
    Stop {
        /// Grace period before the VM is torn down.
        timeout_ms: u64,
    },
    /// Change the TTL: seconds from now, or none.
    SetTtl {
        /// New TTL from now; `None` removes it.
        ttl_secs: Option<u64>,
    },
    /// Write a snapshot of the running machine into `dir` (existing, empty).
    Snapshot {
        /// The directory.
        dir: PathBuf,
    },
    /// Write the machine (memory and state; the disks stay where they are)
    /// into the workspace's hibernation directory, record it hibernated
    /// and end the VMM process without shutting the guest down.
    Hibernate,
    /// Start serving a published port on the listening socket sent with
    /// the request (the caller binds it: the VMM opens no internet socket).
    Publish {
        /// The port.
        mapping: crate::store::ports::PortMapping,
    },
    /// Replace the egress policy (a `user` network's), for new
    /// connections from now on.
    SetEgress {
        /// The mode.
        egress: crate::store::egress::Egress,
        /// The rules (the network's and the workspace's).
        allow: Vec<crate::store::egress::AllowEntry>,
    },
    /// What the egress filter refused.
    EgressDenials,
    /// Stop the vCPUs and devices (a pool member waiting to be claimed);
    /// the guest sees no time pass.
    Pause,
    /// Run a paused machine again.
    Resume,
    /// The balloon's figures, with the guest's statistics fresh (asked for
    /// and waited on briefly).
    Memory,
    /// Stop listening on a host address (open connections run on).
    Unpublish {
        /// Host address.
        host_ip: std::net::IpAddr,
        /// Host port.
        host_port: u16,
    },
}

/// What the VMM answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlResponse {
    /// The answer to `status`.
    Status {
        /// The VMM's pid.
        pid: u32,
        /// Milliseconds since the VMM started.
        uptime_ms: u64,
        /// Whether the agent has answered.
        ready: bool,
        /// Whether a stop is under way.
        stopping: bool,
        /// Unix ms when the TTL stops the VM.
        ttl_deadline_ms: Option<u64>,
    },
    /// The answer to `snapshot` and `hibernate`.
    Snapshot {
        /// How long the guest was paused, in microseconds.
        paused_us: u64,
        /// From request to files written, in microseconds.
        total_us: u64,
        /// Bytes of guest memory written (the rest are holes).
        memory_data_bytes: u64,
    },
    /// Done.
    Ok {
        /// Unix ms when the TTL stops the VM (for `set_ttl`).
        #[serde(default)]
        ttl_deadline_ms: Option<u64>,
    },
    /// The answer to `egress_denials`.
    EgressDenials {
        /// Refusals since the VMM started.
        denied: u64,
        /// The last ones, oldest first.
        denials: Vec<crate::store::egress::EgressDenial>,
    },
    /// The answer to `memory`.
    Memory {
        /// What the balloon knows.
        balloon: vmm_core::devices::virtio::balloon::BalloonFigures,
    },
    /// A published port's host address could not be listened on.
    PortUnavailable {
        /// The address.
        addr: std::net::SocketAddr,
        /// In use (otherwise: not an address of this machine, or refused).
        in_use: bool,
        /// What the OS said.
        message: String,
    },
    /// Refused.
    Error {
        /// Why.
        message: String,
    },
}

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Connecting failed (the VMM is gone or not listening yet).
    #[error("cannot connect to {}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Sending or receiving failed.
    #[error("control socket I/O")]
    Io(#[source] std::io::Error),
    /// The answer was not a response.
    #[error("malformed control answer")]
    Malformed(#[source] serde_json::Error),
    /// The VMM refused.
    #[error("the VMM refused: {0}")]
    Refused(String),
}

/// Sends one request and reads the answer, waiting at most `timeout`.
pub fn call(
    path: &Path,
    req: &ControlRequest,
    timeout: Duration,
) -> Result<ControlResponse, ControlError> {
    call_passing(path, req, None, timeout)
}

/// The same, handing the VMM `fd` with the request (a published port's
/// listening socket).
pub fn call_with_fd(
    path: &Path,
    req: &ControlRequest,
    fd: BorrowedFd<'_>,
    timeout: Duration,
) -> Result<ControlResponse, ControlError> {
    call_passing(path, req, Some(fd), timeout)
}

fn call_passing(
    path: &Path,
    req: &ControlRequest,
    fd: Option<BorrowedFd<'_>>,
    timeout: Duration,
) -> Result<ControlResponse, ControlError> {
    let stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_owned(),
        source,
    })?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(ControlError::Io)?;
    let mut line = serde_json::to_vec(req).map_err(ControlError::Malformed)?;
    line.push(b'\n');
    match fd {
        Some(fd) => super::fd_pass::send_with_fd(&stream, &line, fd),
        None => (&stream).write_all(&line),
    }
    .map_err(ControlError::Io)?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .take(MAX_LINE * 4)
        .read_line(&mut answer)
        .map_err(ControlError::Io)?;
    match serde_json::from_str(&answer).map_err(ControlError::Malformed)? {
        ControlResponse::Error { message } => Err(ControlError::Refused(message)),
        resp => Ok(resp),
    }
}

/// Answers connections on `listener` with `handler`, one at a time, until
/// the process ends; the handler gets the descriptor sent with the
/// request, if any. A malformed request gets an `error` answer.
pub fn serve(
    listener: UnixListener,
    handler: impl Fn(ControlRequest, Option<OwnedFd>) -> ControlResponse,
) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let Ok((line, fd)) = read_request(&stream) else {
            continue;
        };
        let resp = match serde_json::from_str::<ControlRequest>(&line) {
            Ok(req) => handler(req, fd),
            Err(e) => ControlResponse::Error {
                message: format!("bad request: {e}"),
            },
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_default();
        out.push(b'\n');
        let _ = (&stream).write_all(&out);
    }
}

/// One request line (at most [`MAX_LINE`] bytes) and the descriptor sent
/// with its first bytes.
fn read_request(stream: &UnixStream) -> std::io::Result<(String, Option<OwnedFd>)> {
    let mut first = vec![0u8; 4096];
    let (n, fd) = super::fd_pass::recv_with_fd(stream, &mut first)?;
    first.truncate(n);
    if n > 0 && !first.contains(&b'\n') {
        let mut rest = Vec::new();
        BufReader::new(stream)
            .take(MAX_LINE.saturating_sub(n as u64))
            .read_until(b'\n', &mut rest)?;
        first.extend(rest);
    }
    Ok((String::from_utf8_lossy(&first).into_owned(), fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_response_over_a_socket() {
        let path = std::env::temp_dir().join(format!("microagent-ctl-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            serve(listener, |req, fd| match req {
                ControlRequest::Status => ControlResponse::Status {
                    pid: 7,
                    uptime_ms: 1,
                    ready: true,
                    stopping: false,
                    ttl_deadline_ms: None,
                },
                ControlRequest::SetTtl { ttl_secs } => ControlResponse::Ok {
                    ttl_deadline_ms: ttl_secs,
                },
                // A line longer than the first read, and a descriptor.
                ControlRequest::SetEgress { allow, .. } => ControlResponse::Ok {
                    ttl_deadline_ms: Some(allow.len() as u64),
                },
                ControlRequest::Publish { .. } => ControlResponse::Ok {
                    ttl_deadline_ms: fd.map(|fd| {
                        std::net::TcpListener::from(fd).local_addr().unwrap().port() as u64
                    }),
                },
                ControlRequest::Memory => ControlResponse::Memory {
                    balloon: vmm_core::devices::virtio::balloon::BalloonFigures {
                        reported_bytes: 4096,
                        ..Default::default()
                    },
                },
                ControlRequest::Stop { .. }
                | ControlRequest::Snapshot { .. }
                | ControlRequest::EgressDenials
                | ControlRequest::Pause
                | ControlRequest::Resume
                | ControlRequest::Hibernate
                | ControlRequest::Unpublish { .. } => ControlResponse::Error {
                    message: "no".into(),
                },
            })
        });
        let t = Duration::from_secs(5);
        assert!(matches!(
            call(&path, &ControlRequest::Status, t).unwrap(),
            ControlResponse::Status { pid: 7, .. }
        ));
        assert_eq!(
            call(&path, &ControlRequest::SetTtl { ttl_secs: Some(3) }, t).unwrap(),
            ControlResponse::Ok {
                ttl_deadline_ms: Some(3)
            }
        );
        match call(&path, &ControlRequest::Memory, t).unwrap() {
            ControlResponse::Memory { balloon } => assert_eq!(balloon.reported_bytes, 4096),
            other => panic!("{other:?}"),
        }
        let allow: Vec<crate::store::egress::AllowEntry> = (0..300)
            .map(|i| format!("name-{i}.example.org").parse().unwrap())
            .collect();
        let set = ControlRequest::SetEgress {
            egress: crate::store::egress::Egress::Allowlist,
            allow,
        };
        assert_eq!(
            call(&path, &set, t).unwrap(),
            ControlResponse::Ok {
                ttl_deadline_ms: Some(300)
            }
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let publish = ControlRequest::Publish {
            mapping: crate::store::ports::PortMapping::local(port, 80),
        };
        assert_eq!(
            call_with_fd(&path, &publish, std::os::fd::AsFd::as_fd(&listener), t).unwrap(),
            ControlResponse::Ok {
                ttl_deadline_ms: Some(port as u64)
            }
        );
        let refused = call(&path, &ControlRequest::Stop { timeout_ms: 1 }, t).unwrap_err();
        assert!(matches!(refused, ControlError::Refused(m) if m == "no"));
        // Garbage gets an error answer, and the server keeps serving.
        let s = UnixStream::connect(&path).unwrap();
        (&s).write_all(b"{nonsense\n").unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        assert!(answer.contains("bad request"));
        assert!(call(&path, &ControlRequest::Status, t).is_ok());
        let _ = std::fs::remove_file(&path);
    }
}
