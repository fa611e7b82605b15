//! Execs on a pseudo-terminal (`exec` with `pty`, protocol 2).
//!
//! The process gets a new session whose controlling terminal is the pty's
//! slave side, which is also its stdin, stdout and stderr; the agent keeps
//! the master. So the guest's line discipline does what a terminal user
//! expects: Ctrl-C typed by the client becomes SIGINT for the foreground
//! process group, and programs see a tty (prompts, colours, editors).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use guest_agent::frame::{self, FrameKind};
use guest_agent::protocol::{Request, WinSize};

use super::spawn::{Input, Output, Session, Spawn};
use crate::agent::conn::Conn;

/// Why a pty could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    /// posix_openpt, grantpt, unlockpt or ptsname failed.
    #[error("opening a pseudo-terminal")]
    Open(#[source] io::Error),
    /// The slave side could not be opened or duplicated.
    #[error("opening the pseudo-terminal's slave side")]
    Slave(#[source] io::Error),
    /// TIOCSWINSZ failed.
    #[error("setting the terminal size")]
    Size(#[source] io::Error),
}

/// The agent's side of a pty.
pub struct Master {
    file: File,
}

impl Master {
    /// A handle for writing keystrokes while another thread reads output.
    pub fn try_clone(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Output reads: EIO once every slave descriptor is closed (the
    /// process and everything it started have exited).
    pub fn into_reader(self) -> File {
        self.file
    }
}

fn last_error<T>(rc: libc::c_int, ok: T) -> io::Result<T> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ok)
    }
}

/// Sets the terminal size of `fd` (master or slave).
pub fn set_size(fd: &impl AsRawFd, size: WinSize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which lives for
    // the call; a bad fd is an error return.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    last_error(rc, ())
}

fn open_master() -> io::Result<(OwnedFd, String)> {
    // SAFETY: posix_openpt has no memory arguments; it returns a new fd or -1.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    let fd = last_error(fd, fd)?;
    // SAFETY: fd was just returned by posix_openpt and is owned by no one else.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: grantpt and unlockpt only take the fd.
    last_error(unsafe { libc::grantpt(master.as_raw_fd()) }, ())?;
    // SAFETY: as above.
    last_error(unsafe { libc::unlockpt(master.as_raw_fd()) }, ())?;
    let mut name = [0u8; 128];
    // SAFETY: ptsname_r writes at most name.len() bytes, NUL included.
    let rc = unsafe {
        libc::ptsname_r(
            master.as_raw_fd(),
            name.as_mut_ptr().cast::<libc::c_char>(),
            name.len(),
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok((master, String::from_utf8_lossy(&name[..len]).into_owned()))
}

/// Opens a pty of `size` and makes it `cmd`'s terminal: stdin, stdout and
/// stderr, and, in the child, a new session with it as controlling tty.
/// Spawning `cmd` closes the agent's copies of the slave side.
pub fn attach(cmd: &mut Spawn, size: WinSize) -> Result<Master, PtyError> {
    let (master, slave_path) = open_master().map_err(PtyError::Open)?;
    set_size(&master, size).map_err(PtyError::Size)?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&slave_path)
        .map_err(PtyError::Slave)?;
    let out = slave.try_clone().map_err(PtyError::Slave)?;
    let err = slave.try_clone().map_err(PtyError::Slave)?;
    // A new session (and process group, so signals to the exec's group
    // reach it) whose controlling terminal is stdin.
    cmd.stdin(Input::Fd(slave.into()))
        .stdout(Output::Fd(out.into()))
        .stderr(Output::Fd(err.into()))
        .session(Session::Terminal);
    Ok(Master {
        file: File::from(master),
    })
}

/// Client frames to the terminal: stdin bytes are typed, `resize`
/// messages change its size. An empty stdin frame or the client leaving
/// ends the input (a terminal has no end of input; the user types Ctrl-D).
pub fn pump_input(mut conn: Conn, mut master: File) {
    loop {
        match conn.read_frame() {
            Ok(Some(f)) if f.kind == FrameKind::Stdin => {
                if f.payload.is_empty() {
                    return;
                }
                if master.write_all(&f.payload).is_err() {
                    return;
                }
            }
            Ok(Some(f)) if f.kind == FrameKind::Json => match frame::decode_json(&f) {
                Ok(Request::Resize(size)) => {
                    if let Err(e) = set_size(&master, size) {
                        log!("pty resize to {}x{}: {e}", size.cols, size.rows);
                    }
                }
                Ok(other) => log!("pty input: ignoring a `{}` message", other.name()),
                Err(e) => log!("pty input: bad message ({e}); ignored"),
            },
            Ok(Some(f)) => {
                log!("pty input: unexpected {:?} frame; input ends", f.kind);
                return;
            }
            Ok(None) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_child_on_the_pty_sees_a_terminal_of_the_given_size() {
        let mut cmd = Spawn::new(std::path::Path::new("/bin/sh"), "sh");
        cmd.arg("-c").arg("test -t 0 && stty size && echo pgrp-ok");
        let master = attach(
            &mut cmd,
            WinSize {
                rows: 33,
                cols: 101,
            },
        )
        .unwrap();
        let child = cmd.spawn().unwrap();
        let mut out = Vec::new();
        let mut reader = master.into_reader();
        let mut buf = [0u8; 1024];
        // EIO ends the output once the child (the last slave holder) exits.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let mut status = -1;
        // SAFETY: waitpid stores into `status`.
        unsafe { libc::waitpid(child.pid as libc::pid_t, &mut status, 0) };
        assert_eq!(status, 0);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("33 101"), "{text:?}");
        assert!(text.contains("pgrp-ok"), "{text:?}");
    }
}
