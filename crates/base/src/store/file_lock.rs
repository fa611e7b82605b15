//! An advisory lock on a file (exclusive or shared), held until dropped.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A held lock; released when dropped (the file closes).
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Blocks until `path` (made 0600 if missing) is locked by us.
    pub fn exclusive(path: &Path) -> std::io::Result<Self> {
        Self::take(path, libc::LOCK_EX).map(|l| l.expect("a blocking lock is always taken"))
    }

    /// Locks `path` (made 0600 if missing) if nobody holds it.
    pub fn try_exclusive(path: &Path) -> std::io::Result<Option<Self>> {
        Self::take(path, libc::LOCK_EX | libc::LOCK_NB)
    }

    /// Locks the directory `path` itself (never through a link),
    /// `shared` or exclusively, if nobody holds it against that.
    pub fn try_directory(path: &Path, shared: bool) -> std::io::Result<Option<Self>> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(path)?;
        let op = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
        Self::lock(file, op | libc::LOCK_NB)
    }

    /// Whether what is at `path` now is what this lock holds (the same
    /// file, not one renamed into its place since).
    pub fn holds(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), std::fs::symlink_metadata(path)) {
            (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
            _ => false,
        }
    }

    fn take(path: &Path, op: i32) -> std::io::Result<Option<Self>> {
        // Never a link or a FIFO put in its place: a lock file is a plain
        // file, opened without blocking.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other(format!(
                "{} is not a plain file",
                path.display()
            )));
        }
        Self::lock(file, op)
    }

    fn lock(file: File, op: i32) -> std::io::Result<Option<Self>> {
        let nonblocking = op & libc::LOCK_NB != 0;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Some(Self { file }));
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
    fn a_lock_file_is_never_a_link_or_a_fifo() {
        let path = std::env::temp_dir().join(format!("ma-lock-{}", std::process::id()));
        let held = FileLock::try_exclusive(&path).unwrap();
        assert!(held.is_some());
        assert!(FileLock::try_exclusive(&path).unwrap().is_none());
        drop(held);
        let _ = std::fs::remove_file(&path);
        // A link or a FIFO in a lock file's place is refused, not followed.
        let link = path.with_extension("link");
        let fifo = path.with_extension("fifo");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&fifo);
        std::os::unix::fs::symlink("/nonexistent-target", &link).unwrap();
        assert!(FileLock::try_exclusive(&link).is_err());
        assert!(!Path::new("/nonexistent-target").exists());
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(FileLock::try_exclusive(&fifo).is_err());
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&fifo);
    }

    #[test]
    fn a_directory_is_locked_itself_and_known_after_a_rename() {
        let dir = std::env::temp_dir().join(format!("ma-lockdir-{}", std::process::id()));
        let aside = dir.with_extension("aside");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&aside);
        std::fs::create_dir(&dir).unwrap();
        let reader = FileLock::try_directory(&dir, true).unwrap().unwrap();
        assert!(reader.holds(&dir));
        assert!(FileLock::try_directory(&dir, false).unwrap().is_none());
        assert!(FileLock::try_directory(&dir, true).unwrap().is_some());
        // Renamed away and another in its place: the lock is not on that.
        std::fs::rename(&dir, &aside).unwrap();
        std::fs::create_dir(&dir).unwrap();
        assert!(!reader.holds(&dir));
        assert!(FileLock::try_directory(&dir, false).unwrap().is_some());
        drop(reader);
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&aside, &link).unwrap();
        assert!(FileLock::try_directory(&link, true).is_err());
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&aside);
    }
}
