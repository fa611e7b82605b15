//! The host side of the hybrid protocol: a host program connected to the
//! device's Unix socket names the guest port with `CONNECT <port>\n`.

use std::io;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use event_manager::EventSet;

use super::connection::read_some;

/// Longest accepted `CONNECT` line, newline included.
pub const MAX_LINE: usize = 32;

/// What reading from a host program produced so far.
#[derive(Debug, PartialEq, Eq)]
pub enum LineStatus {
    /// No complete line yet.
    Incomplete,
    /// A valid `CONNECT <port>`.
    Connect(u32),
    /// A bad line, EOF or a socket error: drop the host program.
    Failed,
}

/// A host program that has not finished its `CONNECT` line.
#[derive(Debug)]
pub struct PendingHost {
    stream: UnixStream,
    tag: u32,
    line: [u8; MAX_LINE],
    len: usize,
    deadline: Instant,
    /// Interest currently registered with the event loop, if any.
    pub registered: Option<EventSet>,
}

impl PendingHost {
    /// A freshly accepted (non-blocking) host socket that must send its
    /// line before `deadline`.
    pub fn new(stream: UnixStream, tag: u32, deadline: Instant) -> Self {
        Self {
            stream,
            tag,
            line: [0; MAX_LINE],
            len: 0,
            deadline,
            registered: None,
        }
    }

    /// The event-loop tag.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// The socket.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Gives up the socket.
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    /// When the line must have arrived.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads what is available. Bytes are read one at a time so nothing
    /// after the newline (early payload) is consumed.
    pub fn read_line(&mut self) -> LineStatus {
        loop {
            if self.len == MAX_LINE {
                return LineStatus::Failed;
            }
            let mut byte = [0u8; 1];
            match read_some(&mut self.stream, &mut byte) {
                Ok(Some(1)) => {}
                Ok(None) => return LineStatus::Incomplete,
                Ok(Some(_)) | Err(_) => return LineStatus::Failed,
            }
            if byte[0] == b'\n' {
                return match parse_connect(&self.line[..self.len]) {
                    Some(port) => LineStatus::Connect(port),
                    None => LineStatus::Failed,
                };
            }
            self.line[self.len] = byte[0];
            self.len += 1;
        }
    }
}

/// Parses `CONNECT <port>` (without the newline; a trailing `\r` is
/// tolerated for interactive tools).
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let port = line.strip_prefix("CONNECT ")?.trim_start_matches(' ');
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// Connects to a Unix socket without blocking: a listener with a full
/// backlog fails (`EAGAIN`) instead of stalling the event loop.
pub fn connect_nonblocking(path: &std::path::Path) -> io::Result<UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data, for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path is empty, too long or contains NUL",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain system call with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    // SAFETY: `addr` is a valid, NUL-terminated sockaddr_un that outlives
    // the call, and `len` does not exceed its size.
    let ret = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(sock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn parses_connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 1234"), Some(1234));
        assert_eq!(parse_connect(b"CONNECT 52\r"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295"), Some(u32::MAX));
        for bad in [
            &b"CONNECT"[..],
            b"CONNECT ",
            b"CONNECT -1",
            b"CONNECT 4294967296",
            b"CONNECT 12x",
            b"connect 12",
            b"LISTEN 12",
            b"CONNECT +5",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_connect(bad), None, "{bad:?}");
        }
    }

    fn pending() -> (PendingHost, UnixStream) {
        let (dev, host) = UnixStream::pair().unwrap();
        dev.set_nonblocking(true).unwrap();
        let p = PendingHost::new(dev, 16, Instant::now() + Duration::from_secs(3));
        (p, host)
    }

    #[test]
    fn line_may_arrive_in_pieces_and_leaves_payload_unread() {
        let (mut p, mut host) = pending();
        host.write_all(b"CONN").unwrap();
        assert_eq!(p.read_line(), LineStatus::Incomplete);
        host.write_all(b"ECT 77\nearly").unwrap();
        assert_eq!(p.read_line(), LineStatus::Connect(77));
        let mut rest = [0u8; 5];
        let mut s = p.into_stream();
        std::io::Read::read_exact(&mut s, &mut rest).unwrap();
        assert_eq!(&rest, b"early");
    }

    #[test]
    fn overlong_line_bad_line_and_eof_fail() {
        let (mut p, mut host) = pending();
        host.write_all(&[b'A'; MAX_LINE + 1]).unwrap();
        assert_eq!(p.read_line(), LineStatus::Failed);

        let (mut p, mut host) = pending();
        host.write_all(b"HELLO\n").unwrap();
        assert_eq!(p.read_line(), LineStatus::Failed);

        let (mut p, host) = pending();
        drop(host);
        assert_eq!(p.read_line(), LineStatus::Failed);
    }

    #[test]
    fn nonblocking_connect_reports_missing_socket() {
        let path = std::env::temp_dir().join(format!("vsock-nb-{}-missing", std::process::id()));
        let err = connect_nonblocking(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let long = std::path::PathBuf::from("/".to_string() + &"x".repeat(200));
        assert_eq!(
            connect_nonblocking(&long).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
