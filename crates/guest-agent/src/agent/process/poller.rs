//! Waiting for an exec's output and its exit in one thread: poll(2) over
//! the output descriptors and an eventfd the reaper signals at the exit.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// One output of a process: a pipe or a pty master.
#[derive(Debug)]
pub struct Source {
    file: File,
    /// Which output: 0 stdout (or the terminal), 1 stderr.
    pub index: usize,
}

impl Source {
    pub fn new(file: File, index: usize) -> Self {
        Self { file, index }
    }

    /// Reads what poll said is there: `Some(0)` at the end (a pty master
    /// reports its end as EIO, an `Err`), `None` when interrupted.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.file.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// An eventfd: signalled from another thread, it wakes the poll.
#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
}

impl Wake {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Makes the eventfd readable.
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer of 8 bytes. It cannot
        // fail short of the counter overflowing, which one exit cannot do.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Makes it unreadable again.
    pub fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer; on a
        // non-blocking eventfd an unsignalled one just returns EAGAIN.
        unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    }
}

/// What a wait found.
#[derive(Debug, Default)]
pub struct Ready {
    /// Indexes into the sources that can be read (data, end or error).
    pub sources: Vec<usize>,
    /// The wake eventfd was signalled.
    pub woken: bool,
    /// Nothing happened within the timeout.
    pub timed_out: bool,
}

/// Waits until a source can be read, `wake` is signalled, or `timeout`
/// (`None`: no limit) has passed. An interrupted wait returns nothing.
pub fn wait(
    sources: &[Source],
    wake: Option<&Wake>,
    timeout: Option<Duration>,
) -> io::Result<Ready> {
    let mut fds: Vec<libc::pollfd> = sources
        .iter()
        .map(|s| s.file.as_raw_fd())
        .chain(wake.map(|w| w.fd.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout_ms = timeout.map_or(-1, |t| {
        // Rounded up, so a wait for a deadline does not wake just before it.
        let ms = t.as_nanos().div_ceil(1_000_000);
        libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
    });
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structures.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(Ready::default()),
            _ => Err(e),
        };
    }
    let mut ready = Ready {
        timed_out: n == 0,
        ..Ready::default()
    };
    for (i, fd) in fds.iter().enumerate() {
        if fd.revents == 0 {
            continue;
        }
        if i < sources.len() {
            ready.sources.push(i);
        } else {
            ready.woken = true;
        }
    }
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn source(index: usize) -> (Source, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Source::new(File::from(OwnedFd::from(a)), index), b)
    }

    #[test]
    fn data_end_and_wake_are_each_reported() {
        let (out, mut writer) = source(0);
        let (err, _err_writer) = source(1);
        let mut sources = vec![out, err];
        let wake = Wake::new().unwrap();
        let short = Some(Duration::from_millis(10));
        let mut buf = [0u8; 8];

        let quiet = wait(&sources, Some(&wake), short).unwrap();
        assert!(quiet.timed_out && !quiet.woken && quiet.sources.is_empty());

        writer.write_all(b"hi").unwrap();
        let ready = wait(&sources, Some(&wake), None).unwrap();
        assert_eq!((ready.sources, ready.woken), (vec![0], false));
        assert_eq!(sources[0].read(&mut buf).unwrap(), Some(2));

        wake.signal();
        let ready = wait(&sources, Some(&wake), None).unwrap();
        assert!(ready.woken && ready.sources.is_empty());
        wake.clear();
        let ready = wait(&sources, Some(&wake), short).unwrap();
        assert!(ready.timed_out, "a cleared wake is quiet again");
        wake.signal();
        let ready = wait(&sources, None, short).unwrap();
        assert!(ready.timed_out, "a wake not asked for is not reported");

        drop(writer);
        let ready = wait(&sources, None, None).unwrap();
        assert_eq!(ready.sources, vec![0], "the end is readable");
        assert_eq!(sources[0].read(&mut buf).unwrap(), Some(0));
    }
}
