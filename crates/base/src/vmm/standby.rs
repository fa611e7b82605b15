//! Standby VMM processes: a VMM started before its workspace is known,
//! with its KVM VM, vCPUs and guest memory's range made for one shape
//! (vCPUs and memory), waiting on a socket for the one launch it will
//! serve. A restore that claims one skips the process start and those
//! ioctls (issue 59: a restore under 3 ms).
//!
//! A standby listens on `<state>/standby/<vcpus>x<mem_mib>-<tag>.sock`
//! (the directory 0700, the socket 0600). A claimer takes a socket by
//! renaming it (only one rename wins), connects, and sends the launch: a
//! length (u32, little-endian) and the [`VmmLaunch`] arguments separated
//! by NUL bytes, at most [`MAX_CLAIM_BYTES`], with the workspace's
//! `vmm.log` attached to the first byte; then, when the launch watches an
//! owner, one byte with the owner's pidfd attached. The standby answers
//! one byte once it has taken the launch, and from then on is that
//! workspace's VMM process. It accepts one claim, from its own user only,
//! and ends by itself after [`STANDBY_WAIT`] unclaimed.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::vmm::fd_pass::{recv_with_fd, send_with_fd};
use crate::vmm::launch::VmmLaunch;

/// The directory of the standbys' sockets, in the state directory.
pub const STANDBY_DIR: &str = "standby";
/// The subcommand words of a standby process.
pub const STANDBY_SUBCOMMAND: [&str; 2] = ["vmm", "standby"];
/// Most bytes of a claim's arguments (a launch is a few hundred).
pub const MAX_CLAIM_BYTES: usize = 64 * 1024;
/// How long a standby waits for its claim before it ends.
pub const STANDBY_WAIT: Duration = Duration::from_secs(600);
/// How long a claimer waits for a standby to take its launch.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// The most standbys of one shape a state directory keeps.
pub const MAX_STANDBYS: u8 = 8;
/// Its key in `config.json`.
const CONFIG_KEY: &str = "standby";

/// How many standbys of each shape in use to keep waiting (`config.json`
/// `{"standby": {"count": N}}`; 0, the default, keeps none): a restore
/// that claims one then starts another for the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandbyConfig {
    /// Standbys kept per shape, at most [`MAX_STANDBYS`].
    #[serde(default)]
    pub count: u8,
}

impl StandbyConfig {
    /// The setting of the state directory at `root` (none kept when the
    /// file or the key is absent).
    pub fn load(root: &Path) -> Result<Self, crate::host::settings::ConfigError> {
        let config: Self = crate::host::settings::config_section(root, CONFIG_KEY)?
            .map(|(c, _)| c)
            .unwrap_or_default();
        Ok(Self {
            count: config.count.min(MAX_STANDBYS),
        })
    }
}

/// Why a standby could not wait for or take a claim.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// Its directory or socket could not be made.
    #[error("making the standby socket {}", path.display())]
    Bind {
        /// The socket or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for or reading a claim failed.
    #[error("reading a claim")]
    Claim(#[source] std::io::Error),
    /// A claim that is not what a claimer writes.
    #[error("a malformed claim: {0}")]
    Malformed(&'static str),
}

/// What a standby is made for: its VM's vCPUs and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandbyShape {
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
}

impl StandbyShape {
    /// The start of its sockets' names: `<vcpus>x<mem_mib>-`.
    fn prefix(&self) -> String {
        format!("{}x{}-", self.vcpus, self.mem_mib)
    }
}

/// The standbys' directory of the state directory `home`.
pub fn standby_dir(home: &Path) -> PathBuf {
    home.join(STANDBY_DIR)
}

/// The arguments after the program name of a standby for `shape` of the
/// state directory `home`.
pub fn standby_args(home: &Path, shape: StandbyShape) -> Vec<OsString> {
    let mut args: Vec<OsString> = STANDBY_SUBCOMMAND.iter().map(OsString::from).collect();
    args.push("--home".into());
    args.push(home.as_os_str().to_owned());
    args.push("--vcpus".into());
    args.push(shape.vcpus.to_string().into());
    args.push("--mem-mib".into());
    args.push(shape.mem_mib.to_string().into());
    args
}

/// Reads a standby's arguments (as [`standby_args`] writes them).
pub fn standby_from_args(args: &[OsString]) -> Option<(PathBuf, StandbyShape)> {
    let (words, rest) = args.split_at_checked(STANDBY_SUBCOMMAND.len())?;
    if words.iter().zip(STANDBY_SUBCOMMAND).any(|(w, s)| w != s) {
        return None;
    }
    let [home_flag, home, vcpus_flag, vcpus, mem_flag, mem] = rest else {
        return None;
    };
    if (
        home_flag.to_str()?,
        vcpus_flag.to_str()?,
        mem_flag.to_str()?,
    ) != ("--home", "--vcpus", "--mem-mib")
    {
        return None;
    }
    let shape = StandbyShape {
        vcpus: vcpus.to_str()?.parse().ok().filter(|v| *v > 0)?,
        mem_mib: mem.to_str()?.parse().ok().filter(|m| *m > 0)?,
    };
    Some((PathBuf::from(home), shape))
}

/// How many standbys of `shape` wait in `home` (their sockets).
pub fn waiting(home: &Path, shape: StandbyShape) -> usize {
    sockets_of(home, shape).len()
}

/// The sockets of standbys of `shape`, in no particular order.
fn sockets_of(home: &Path, shape: StandbyShape) -> Vec<PathBuf> {
    let prefix = shape.prefix();
    let Ok(entries) = std::fs::read_dir(standby_dir(home)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".sock"))
        })
        .map(|e| e.path())
        .collect()
}

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
    /// The state directory whose workspaces it serves.
    home: PathBuf,
}

impl ClaimListener {
    /// Binds a new socket for `shape` in `home`'s standby directory.
    pub fn bind(home: &Path, shape: StandbyShape) -> Result<Self, StandbyError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = standby_dir(home);
        crate::store::make_private_dir(&dir).map_err(|e| StandbyError::Bind {
            path: dir.clone(),
            source: std::io::Error::other(e),
        })?;
        let path = dir.join(format!(
            "{}{}.sock",
            shape.prefix(),
            crate::host::dirfd::random_hex()
        ));
        let bind_err = |source| StandbyError::Bind {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(bind_err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(bind_err)?;
        Ok(Self {
            listener,
            path,
            home: home.to_owned(),
        })
    }

    /// Its socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `wait` for the one claim this standby takes: `None`
    /// when none came. A connection from another user, one that is not a
    /// claim, or a claim for another state directory is refused and the
    /// wait goes on.
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
            if peer_ids(&stream).map(|(_, uid)| uid).ok() != Some(me) {
                continue;
            }
            match take_claim(&stream) {
                // Asked to end (`retire`).
                Ok(None) => return Ok(None),
                Ok(Some(claim)) if claim.launch.home != self.home => {
                    tracing::warn!(home = %claim.launch.home.display(), "a claim for another state directory refused");
                }
                Ok(Some(claim)) => {
                    // Answered once the launch is taken: the claimer then
                    // records this process as the workspace's VMM.
                    let _ = (&stream).write_all(b"1");
                    return Ok(Some(claim));
                }
                Err(e) => tracing::warn!(error = %e, "a claim refused"),
            }
        }
    }
}

impl Drop for ClaimListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
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
fn peer_ids(stream: &UnixStream) -> std::io::Result<(u32, u32)> {
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

/// Hands `launch` to a standby of `shape` waiting in `home`, if one takes
/// it: the pid of the process that is now the workspace's VMM. `None`
/// when no standby took it (the caller starts a process as usual).
pub fn claim(
    home: &Path,
    shape: StandbyShape,
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
    for socket in sockets_of(home, shape) {
        // Only one claimer's rename of a socket succeeds.
        let taken = socket.with_extension(format!("claimed-{}", std::process::id()));
        if std::fs::rename(&socket, &taken).is_err() {
            continue;
        }
        let pid = hand_over(&taken, &bytes, log, owner);
        let _ = std::fs::remove_file(&taken);
        match pid {
            Ok(pid) => return Some(pid),
            Err(e) => {
                tracing::debug!(socket = %socket.display(), error = %e, "a standby did not take the launch")
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
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("standby-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const SHAPE: StandbyShape = StandbyShape {
        vcpus: 1,
        mem_mib: 256,
    };

    #[test]
    fn the_setting_is_bounded_and_off_by_default() {
        let home = home("config");
        assert_eq!(StandbyConfig::load(&home).unwrap().count, 0);
        let file = home.join(crate::host::settings::CONFIG_FILE);
        std::fs::write(&file, r#"{"standby": {"count": 200}}"#).unwrap();
        assert_eq!(StandbyConfig::load(&home).unwrap().count, MAX_STANDBYS);
        std::fs::write(&file, r#"{"standby": {"count": 1, "program": "x"}}"#).unwrap();
        assert!(StandbyConfig::load(&home).is_err());
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn standby_arguments_round_trip_and_refuse_others() {
        let args = standby_args(Path::new("/state"), SHAPE);
        assert_eq!(
            standby_from_args(&args),
            Some((PathBuf::from("/state"), SHAPE))
        );
        let mut zero = args.clone();
        zero[5] = "0".into();
        assert_eq!(standby_from_args(&zero), None);
        assert_eq!(standby_from_args(&args[..6]), None);
        let mut other = args;
        other[1] = "serve-workspace".into();
        assert_eq!(standby_from_args(&other), None);
    }

    #[test]
    fn a_standby_takes_one_claim_with_its_descriptors() {
        let home = home("claim");
        let listener = ClaimListener::bind(&home, SHAPE).unwrap();
        assert_eq!(waiting(&home, SHAPE), 1);
        let other = StandbyShape {
            vcpus: 2,
            mem_mib: 256,
        };
        assert_eq!(waiting(&home, other), 0);
        let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(20)));
        let launch = VmmLaunch::new(
            Path::new("/bin/true"),
            &home,
            "ws1",
            vmm_core::KernelVariant::Standard,
        )
        .restoring(Path::new("/snap"))
        .with_ticket("t1")
        .watching_owner();
        let log = std::fs::File::create(home.join("vmm.log")).unwrap();
        let owner: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        // No standby of another shape; an owner descriptor the launch
        // does not announce is refused before any socket is touched.
        assert_eq!(claim(&home, other, &launch, &log, Some(&owner)), None);
        let plain = VmmLaunch::new(
            Path::new("/bin/true"),
            &home,
            "ws1",
            vmm_core::KernelVariant::Standard,
        );
        assert_eq!(claim(&home, SHAPE, &plain, &log, Some(&owner)), None);
        assert_eq!(
            claim(&home, SHAPE, &launch, &log, Some(&owner)),
            Some(std::process::id())
        );
        let taken = waiter.join().unwrap().unwrap().expect("a claim");
        assert_eq!(taken.launch.workspace, "ws1");
        assert_eq!(taken.launch.restore, Some(PathBuf::from("/snap")));
        assert_eq!(taken.launch.ticket.as_deref(), Some("t1"));
        assert!(taken.owner.is_some());
        // The log descriptor is the file sent.
        let sent = std::fs::metadata(home.join("vmm.log")).unwrap();
        let got = std::fs::metadata(format!("/proc/self/fd/{}", taken.log.as_raw_fd())).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((sent.dev(), sent.ino()), (got.dev(), got.ino()));
        // Taken: its socket is gone; no standby is left to claim.
        assert_eq!(waiting(&home, SHAPE), 0);
        assert_eq!(claim(&home, SHAPE, &launch, &log, Some(&owner)), None);
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn a_malformed_claim_is_refused_and_the_standby_waits_on() {
        let home = home("malformed");
        let listener = ClaimListener::bind(&home, SHAPE).unwrap();
        let path = listener.path().to_owned();
        let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(30)));
        let log = std::fs::File::create(home.join("vmm.log")).unwrap();
        let cases: [&[u8]; 3] = [
            &(MAX_CLAIM_BYTES as u32 + 1).to_le_bytes(),
            &[3, 0, 0, 0, b'a', 0, b'b'],
            &[1, 0, 0],
        ];
        for bytes in cases {
            let stream = UnixStream::connect(&path).unwrap();
            send_with_fd(&stream, bytes, log.as_fd()).unwrap();
            let mut answer = Vec::new();
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let _ = (&stream).read_to_end(&mut answer);
            assert!(answer.is_empty(), "{answer:?}");
        }
        // No descriptor at all.
        let stream = UnixStream::connect(&path).unwrap();
        (&stream).write_all(&[1, 0, 0, 0, b'x']).unwrap();
        let _ = (&stream).read_to_end(&mut Vec::new());
        // Still waiting after all that: then asked to end.
        assert_eq!(retire_all(&home), 1);
        assert!(waiter.join().unwrap().unwrap().is_none());
        assert!(!path.exists(), "the socket goes with its standby");
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn retired_standbys_end_without_a_claim() {
        let home = home("retire");
        let waiters: Vec<_> = [
            SHAPE,
            StandbyShape {
                vcpus: 2,
                mem_mib: 512,
            },
        ]
        .into_iter()
        .map(|shape| {
            let listener = ClaimListener::bind(&home, shape).unwrap();
            std::thread::spawn(move || listener.wait(Duration::from_secs(30)))
        })
        .collect();
        assert_eq!(retire_all(&home), 2);
        for waiter in waiters {
            assert!(waiter.join().unwrap().unwrap().is_none());
        }
        assert_eq!(retire_all(&home), 0);
        std::fs::remove_dir_all(&home).unwrap();
    }
}
