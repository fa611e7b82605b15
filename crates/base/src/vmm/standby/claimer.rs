//! The claimer's side: handing a launch to a standby that is the process
//! the caller would have started, and asking standbys to end.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::listener::peer_ids;
use super::{generation, live_sockets, standby_dir, StandbyShape, ANSWER_WAIT, MAX_CLAIM_BYTES};
use crate::vmm::fd_pass::send_with_fd;
use crate::vmm::launch::VmmLaunch;

/// Hands `launch` to a standby of `shape` waiting in `home` that runs
/// `program` as the caller would start it (same file, same environment:
/// [`generation`]), if one takes it: the pid of the process that is now
/// the workspace's VMM. `None` when no standby took it (the caller starts
/// a process as usual).
pub fn claim(
    home: &Path,
    shape: StandbyShape,
    program: &Path,
    launch: &VmmLaunch,
    log: &std::fs::File,
    owner: Option<&OwnedFd>,
) -> Option<u32> {
    let mut bytes = Vec::new();
    for (i, arg) in launch.args().iter().enumerate() {
        if i > 0 {
            bytes.push(0);
        }
        bytes.extend_from_slice(arg.as_bytes());
    }
    if bytes.len() > MAX_CLAIM_BYTES || launch.owner_fd != owner.is_some() {
        return None;
    }
    let prefix = shape.prefix(&generation(program)?);
    for socket in live_sockets(home, &prefix) {
        // Only one claimer's rename of a socket succeeds.
        let taken =
            socket
                .path
                .with_file_name(format!("{}.claimed-{}", socket.name, std::process::id()));
        if std::fs::rename(&socket.path, &taken).is_err() {
            continue;
        }
        let pid = hand_over(&taken, &bytes, log, owner);
        let _ = std::fs::remove_file(&taken);
        match pid {
            Ok(pid) => return Some(pid),
            Err(e) => {
                tracing::debug!(socket = %socket.path.display(), error = %e, "a standby did not take the launch")
            }
        }
    }
    None
}

/// Ends every standby waiting in `home` (of any shape); how many were
/// asked.
pub fn retire_all(home: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(standby_dir(home)) else {
        return 0;
    };
    let mut asked = 0;
    for socket in entries.flatten().map(|e| e.path()) {
        if socket.extension().is_none_or(|e| e != "sock") {
            continue;
        }
        let taken = socket.with_extension(format!("retiring-{}", std::process::id()));
        if std::fs::rename(&socket, &taken).is_err() {
            continue;
        }
        let null = std::fs::File::open("/dev/null");
        if let (Ok(stream), Ok(null)) = (UnixStream::connect(&taken), null) {
            asked += usize::from(send_with_fd(&stream, &0u32.to_le_bytes(), null.as_fd()).is_ok());
        }
        let _ = std::fs::remove_file(&taken);
    }
    asked
}

/// Sends the claim to the standby at `socket`; its pid once it answered.
fn hand_over(
    socket: &Path,
    bytes: &[u8],
    log: &std::fs::File,
    owner: Option<&OwnedFd>,
) -> std::io::Result<u32> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(ANSWER_WAIT))?;
    stream.set_write_timeout(Some(ANSWER_WAIT))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let (pid, uid) = peer_ids(&stream)?;
    if uid != me || pid == 0 {
        return Err(std::io::Error::other("the standby is another user's"));
    }
    let len = (bytes.len() as u32).to_le_bytes();
    send_with_fd(&stream, &len, log.as_fd())?;
    (&stream).write_all(bytes)?;
    if let Some(owner) = owner {
        send_with_fd(&stream, b"o", owner.as_fd())?;
    }
    let mut answer = [0u8; 1];
    (&stream).read_exact(&mut answer)?;
    // Going on with it: from here the standby is the workspace's VMM.
    (&stream).write_all(b"g")?;
    Ok(pid)
}
