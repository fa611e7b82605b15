//! Host programs arriving at the device's socket, seen from outside the
//! device loop: a paused machine's owner learns from them that someone
//! wants the guest (and resumes it), and tells an arrival that raced its
//! pause from none by the count of accepts.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The device's listening socket (a second descriptor of it) and its count
/// of accepted host programs.
#[derive(Debug)]
pub struct HostArrivals {
    listener: UnixListener,
    accepted: Arc<AtomicU64>,
    open: Arc<AtomicUsize>,
}

impl HostArrivals {
    pub(super) fn new(
        listener: UnixListener,
        accepted: Arc<AtomicU64>,
        open: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            listener,
            accepted,
            open,
        }
    }

    /// Connections open between host programs (or guest programs and host
    /// sockets) and the guest, and host programs still handshaking, as of
    /// the device loop's last event.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// How many host programs the device has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` for a host program to wait on the socket
    /// unaccepted (true), which only happens quickly while the device loop
    /// does not run. Nothing is accepted here: the device does that.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut fd = libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, owned by this frame, for the call.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        match n {
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ if fd.revents & libc::POLLIN != 0 => Ok(true),
            // Hung up or invalid: it will never say more (and polling it
            // again at once would spin).
            _ => Err(io::Error::other(format!(
                "the vsock socket reports {:#x}",
                fd.revents
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_host_program_is_seen_and_left_for_the_device() {
        let dir = std::env::temp_dir().join(format!("ma-arrivals-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let arrivals = HostArrivals::new(
            listener.try_clone().unwrap(),
            Arc::default(),
            Arc::default(),
        );
        assert!(!arrivals.wait(Duration::from_millis(10)).unwrap());
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert!(arrivals.wait(Duration::from_secs(5)).unwrap());
        // Still there for the device to accept.
        assert!(arrivals.wait(Duration::ZERO).unwrap());
        listener.accept().unwrap();
        assert!(!arrivals.wait(Duration::ZERO).unwrap());
        assert_eq!(arrivals.accepted(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
