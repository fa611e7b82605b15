//! An advisory lock on a file (exclusive or shared), held until dropped.

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
        Self::take(path, libc::LOCK_EX).map(|l| l.expect("a blocking lock is always taken"))
    }

    /// Blocks until `path` (made 0600 if missing) is locked by us beside
    /// other shared holders, none exclusive.
    pub fn shared(path: &Path) -> std::io::Result<Self> {
        Self::take(path, libc::LOCK_SH).map(|l| l.expect("a blocking lock is always taken"))
    }

    /// Locks `path` (made 0600 if missing) if nobody holds it.
    pub fn try_exclusive(path: &Path) -> std::io::Result<Option<Self>> {
        Self::take(path, libc::LOCK_EX | libc::LOCK_NB)
    }

    fn take(path: &Path, op: i32) -> std::io::Result<Option<Self>> {
        let nonblocking = op & libc::LOCK_NB != 0;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_keep_out_an_exclusive_one_and_not_each_other() {
        let path = std::env::temp_dir().join(format!("ma-lock-{}", std::process::id()));
        let first = FileLock::shared(&path).unwrap();
        let second = FileLock::shared(&path).unwrap();
        assert!(FileLock::try_exclusive(&path).unwrap().is_none());
        drop(first);
        assert!(FileLock::try_exclusive(&path).unwrap().is_none());
        drop(second);
        let only = FileLock::try_exclusive(&path).unwrap();
        assert!(only.is_some());
        drop(only);
        let _ = std::fs::remove_file(&path);
    }
}
