//! Copying a disk image: a reflink (FICLONE) where the filesystem shares
//! extents, else a copy of its data extents only, so holes stay holes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `_IOW(0x94, 9, int)`: share all of the source's extents.
pub(crate) const FICLONE: libc::c_ulong = 0x4004_9409;
/// Largest single copy_file_range request.
const CHUNK: u64 = 64 << 20;
/// The buffer of a copy by reads and writes (the VMM's memory is small).
const FALLBACK_BUFFER: u64 = 1 << 20;

/// How a copy was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskCopyMethod {
    /// The filesystem shares the extents (copy-on-write).
    Reflink,
    /// The data extents were copied; holes stayed holes.
    Sparse,
}

/// What [`copy_disk`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskCopy {
    /// How.
    pub kind: DiskCopyMethod,
    /// The image's length.
    pub len: u64,
    /// Bytes of data copied (zero for a reflink, which copies none).
    pub copied: u64,
}

/// Copies `from` to a new file `to` (which must not exist).
pub fn copy_disk(from: &Path, to: &Path) -> io::Result<DiskCopy> {
    copy_open_disk(&File::open(from)?, to)
}

/// [`copy_disk`] of an open file: a VMM in its private root copies disks
/// it opened before, whose paths it can no longer see.
pub fn copy_open_disk(src: &File, to: &Path) -> io::Result<DiskCopy> {
    let len = src.metadata()?.len();
    // A guest's disk: nobody else's to read.
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let result = (|| {
        // SAFETY: FICLONE reads the source fd number we pass and touches no
        // memory of ours; both fds are open for the call.
        if unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) } == 0 {
            dst.sync_all()?;
            return Ok(DiskCopy {
                kind: DiskCopyMethod::Reflink,
                len,
                copied: 0,
            });
        }
        let copied = copy_data_extents(src, &dst, len)?;
        dst.set_len(len)?;
        // Durable before it counts as a copy: a failing disk reports here.
        dst.sync_data()?;
        Ok(DiskCopy {
            kind: DiskCopyMethod::Sparse,
            len,
            copied,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(to);
    }
    result
}

fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on an fd we own; no memory involved.
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        e => Err(e),
    }
}

fn copy_data_extents(src: &File, dst: &File, len: u64) -> io::Result<u64> {
    let mut copied = 0;
    let mut at = 0;
    while at < len {
        let Some(data) = seek(src, at, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(src, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut off_in = data as libc::loff_t;
        let mut off_out = data as libc::loff_t;
        while (off_in as u64) < hole {
            let want = (hole - off_in as u64).min(CHUNK) as usize;
            // The raw system call: glibc's wrapper is a null weak symbol in
            // the static VMM binary.
            // SAFETY: both offsets point at loff_t values we own; the kernel
            // only reads and advances them.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_copy_file_range,
                    src.as_raw_fd(),
                    &mut off_in as *mut libc::loff_t,
                    dst.as_raw_fd(),
                    &mut off_out as *mut libc::loff_t,
                    want,
                    0u32,
                )
            };
            match n {
                n if n > 0 => copied += n as u64,
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "disk shrank")),
                _ => {
                    let e = io::Error::last_os_error();
                    // Across filesystems (EXDEV on kernels before 5.19
                    // for most pairs) or where the call is not there:
                    // reads and writes.
                    if !matches!(
                        e.raw_os_error(),
                        Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                    ) {
                        return Err(e);
                    }
                    copied += copy_range(src, dst, off_in as u64, hole)?;
                    off_in = hole as libc::loff_t;
                }
            }
        }
        at = hole;
    }
    Ok(copied)
}

/// Copies `src`'s bytes `from..to` to the same offsets of `dst` with reads
/// and writes.
fn copy_range(src: &File, dst: &File, from: u64, to: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; FALLBACK_BUFFER.min(to - from) as usize];
    let mut at = from;
    while at < to {
        let want = ((to - at) as usize).min(buf.len());
        let n = src.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "disk shrank"));
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(to - from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn copies_across_filesystems() {
        // /dev/shm is a tmpfs: another filesystem than the temp directory
        // on most hosts, where copy_file_range says EXDEV.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let from = std::env::temp_dir().join(format!("microagent-xdev-{}", std::process::id()));
        let to = shm.join(format!("microagent-xdev-{}", std::process::id()));
        let _ = std::fs::remove_file(&to);
        let f = File::create(&from).unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_all_at(&[7; 3 << 20], 1 << 20).unwrap();
        let copy = copy_disk(&from, &to).unwrap();
        assert_eq!(copy.len, 8 << 20);
        let got = std::fs::read(&to).unwrap();
        assert_eq!(got.len(), 8 << 20);
        assert!(got[(1 << 20)..(4 << 20)].iter().all(|b| *b == 7));
        assert!(got[..(1 << 20)]
            .iter()
            .chain(&got[(4 << 20)..])
            .all(|b| *b == 0));
        let _ = std::fs::remove_file(&from);
        let _ = std::fs::remove_file(&to);
    }

    #[test]
    fn copies_data_and_keeps_holes() {
        let dir = std::env::temp_dir().join(format!("microagent-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let from = dir.join("a.raw");
        let to = dir.join("b.raw");
        let _ = std::fs::remove_file(&to);
        let f = File::create(&from).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(&[9; 8192], 40 << 20).unwrap();
        f.write_all_at(b"end", (64 << 20) - 3).unwrap();
        drop(f);

        let copy = copy_disk(&from, &to).unwrap();
        assert_eq!(copy.len, 64 << 20);
        assert_eq!(
            std::fs::read(&from).unwrap(),
            std::fs::read(&to).unwrap(),
            "contents differ"
        );
        if copy.kind == DiskCopyMethod::Sparse {
            assert!(copy.copied < 1 << 20, "copied {}", copy.copied);
            assert!(std::fs::metadata(&to).unwrap().blocks() * 512 < 1 << 20);
        }
        // Never over an existing file.
        assert_eq!(
            copy_disk(&from, &to).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
