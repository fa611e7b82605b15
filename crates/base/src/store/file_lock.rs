//! An exclusive advisory lock on a file, held until dropped.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A held lock; released when dropped (the file closes).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Blocks until `path` (made 0600 if missing) is locked by us.
    pub fn exclusive(path: &Path) -> std::io::Result<Self> {
        Self::take(path, false).map(|l| l.expect("a blocking lock is always taken"))
    }

    /// Locks `path` (made 0600 if missing) if nobody holds it.
    pub fn try_exclusive(path: &Path) -> std::io::Result<Option<Self>> {
        Self::take(path, true)
    }

    fn take(path: &Path, nonblocking: bool) -> std::io::Result<Option<Self>> {
        let op = libc::LOCK_EX | if nonblocking { libc::LOCK_NB } else { 0 };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Some(Self { _file: file }));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) if nonblocking => return Ok(None),
                _ => return Err(e),
            }
        }
    }
}
