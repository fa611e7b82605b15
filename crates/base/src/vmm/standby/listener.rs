//! The standby's side of a claim: its socket, the one claim it takes,
//! and the checks on who sends it and what.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{generation, standby_dir, StandbyError, StandbyShape, ANSWER_WAIT, MAX_CLAIM_BYTES};
use crate::vmm::fd_pass::recv_with_fd;
use crate::vmm::launch::VmmLaunch;

/// The launch a standby took, with the descriptors that came with it.
#[derive(Debug)]
pub struct Claim {
    /// What to run.
    pub launch: VmmLaunch,
    /// The workspace's `vmm.log`, the process's stderr from now on.
    pub log: OwnedFd,
    /// The owner's pidfd, when the launch watches one.
    pub owner: Option<OwnedFd>,
}

/// A standby's socket, removed when dropped.
#[derive(Debug)]
pub struct ClaimListener {
    listener: UnixListener,
    path: PathBuf,
    /// The socket's inode: its name still names it while this is there.
    inode: u64,
    /// The state directory whose workspaces it serves (device, inode).
    home: (u64, u64),
}

/// A directory's device and inode (how two spellings of it compare).
fn dir_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl ClaimListener {
    /// Binds a new socket for `shape` in `home`'s standby directory, named
    /// for this process's program and environment ([`generation`]).
    pub fn bind(home: &Path, shape: StandbyShape) -> Result<Self, StandbyError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = standby_dir(home);
        let dir_err = |source| StandbyError::Bind {
            path: dir.clone(),
            source,
        };
        crate::store::make_private_dir(&dir).map_err(|e| dir_err(std::io::Error::other(e)))?;
        let generation = generation(Path::new("/proc/self/exe"))
            .ok_or_else(|| dir_err(std::io::Error::other("this program's file cannot be read")))?;
        let home_id = dir_id(home).ok_or_else(|| dir_err(std::io::ErrorKind::NotFound.into()))?;
        let path = dir.join(format!(
            "{}{}.sock",
            shape.prefix(&generation),
            crate::host::settings::own_pid()
        ));
        let bind_err = |source| StandbyError::Bind {
            path: path.clone(),
            source,
        };
        // A socket of a process gone by this pid's name before.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(bind_err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(bind_err)?;
        let inode = std::fs::symlink_metadata(&path).map_err(bind_err)?.ino();
        Ok(Self {
            listener,
            path,
            inode,
            home: home_id,
        })
    }

    /// Its socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether its name still names its socket (a claimer that renamed it
    /// and gave up, or a retirement, took the name away).
    fn still_named(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode)
    }

    /// Waits up to `wait` for the one claim this standby takes: `None`
    /// when none came, when it was asked to end, when its claimer did not
    /// go on with it, or when its name was taken away. A connection from
    /// another user, one that is not a claim, or a claim for another state
    /// directory is refused and the wait goes on while the name is there.
    pub fn wait(self, wait: Duration) -> Result<Option<Claim>, StandbyError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || !readable(&self.listener, left).map_err(StandbyError::Claim)? {
                return Ok(None);
            }
            let (stream, _) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StandbyError::Claim(e)),
            };
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if peer_ids(&stream).map(|(_, uid)| uid).ok() == Some(me) {
                match take_claim(&stream) {
                    // Asked to end (`retire_all`).
                    Ok(None) => return Ok(None),
                    Ok(Some(claim)) if dir_id(&claim.launch.home) != Some(self.home) => {
                        tracing::warn!(home = %claim.launch.home.display(), "a claim for another state directory refused");
                    }
                    Ok(Some(claim)) => {
                        // Taken: the claimer says whether it goes on with
                        // this process (it gave up if it waited too long).
                        let mut go = [0u8; 1];
                        let went = (&stream).write_all(b"1").is_ok()
                            && (&stream).read_exact(&mut go).is_ok()
                            && go == *b"g";
                        return Ok(went.then_some(claim));
                    }
                    Err(e) => tracing::warn!(error = %e, "a claim refused"),
                }
            }
            if !self.still_named() {
                return Ok(None);
            }
        }
    }
}

impl Drop for ClaimListener {
    fn drop(&mut self) {
        if self.still_named() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Reads one claim from `stream` (bounded, with a deadline); `None` for
/// an empty one, which asks the standby to end.
fn take_claim(stream: &UnixStream) -> Result<Option<Claim>, StandbyError> {
    stream
        .set_read_timeout(Some(ANSWER_WAIT))
        .map_err(StandbyError::Claim)?;
    let mut len = [0u8; 4];
    let (got, log) = recv_with_fd(stream, &mut len).map_err(StandbyError::Claim)?;
    let log = log.ok_or(StandbyError::Malformed("no log descriptor"))?;
    (&*stream)
        .read_exact(&mut len[got..])
        .map_err(StandbyError::Claim)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > MAX_CLAIM_BYTES {
        return Err(StandbyError::Malformed("its length is out of bounds"));
    }
    let mut bytes = vec![0u8; len];
    (&*stream)
        .read_exact(&mut bytes)
        .map_err(StandbyError::Claim)?;
    let args = bytes
        .split(|b| *b == 0)
        .map(|a| OsString::from_vec(a.to_vec()));
    let launch = VmmLaunch::from_args(args).ok_or(StandbyError::Malformed("its arguments"))?;
    let owner = if launch.owner_fd {
        let mut byte = [0u8; 1];
        let (_, fd) = recv_with_fd(stream, &mut byte).map_err(StandbyError::Claim)?;
        Some(fd.ok_or(StandbyError::Malformed("no owner descriptor"))?)
    } else {
        None
    };
    Ok(Some(Claim { launch, log, owner }))
}

/// Whether `listener` has a connection within `wait`.
fn readable(listener: &UnixListener, wait: Duration) -> std::io::Result<bool> {
    let mut poll = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&mut poll, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// The pid (in the caller's PID namespace) and uid of a socket's peer.
pub(super) fn peer_ids(stream: &UnixStream) -> std::io::Result<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for the kernel to fill.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if got != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid))
}
