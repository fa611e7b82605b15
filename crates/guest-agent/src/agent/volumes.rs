//! Mounting the workspace's named volumes: each is the virtio-blk disk
//! whose serial (`/sys/block/vdX/serial`, the device's GET_ID answer) the
//! host names, never a device order. A disk attached at a restore may take
//! a moment to show its size, so an empty one is waited for, briefly. A
//! volume already mounted where asked (a fork's) is left as it is.

use std::ffi::CString;
use std::time::{Duration, Instant};

use guest_agent::protocol::{AgentErrorCode, VolumeToMount};

/// How long a disk may take to show its size after a restore.
const SIZE_WAIT: Duration = Duration::from_secs(10);
/// How long a volume may stay busy at shutdown (its last users dying).
const UNMOUNT_WAIT: Duration = Duration::from_secs(5);

/// Why a volume could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// No disk answers with that serial.
    #[error("no disk has serial {0:?}")]
    NoDisk(String),
    /// The disk has no size (its file was not attached).
    #[error("disk {0} stayed empty")]
    Empty(String),
    /// The mount point is not an absolute path.
    #[error("mount point {0:?} is not an absolute path")]
    BadPath(String),
    /// A system call failed.
    #[error("{what} {path} failed")]
    Sys {
        /// Which step.
        what: &'static str,
        /// On what.
        path: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl MountError {
    /// The protocol code.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::NoDisk(_) | Self::Empty(_) => AgentErrorCode::NotFound,
            Self::BadPath(_) => AgentErrorCode::InvalidInput,
            Self::Sys { .. } => AgentErrorCode::Internal,
        }
    }
}

/// Mounts each volume in turn.
pub fn mount_all(volumes: &[VolumeToMount]) -> Result<(), MountError> {
    for v in volumes {
        mount_one(v)?;
    }
    Ok(())
}

fn mount_one(v: &VolumeToMount) -> Result<(), MountError> {
    if !v.path.starts_with('/') || v.path.contains('\0') || v.path.split('/').any(|c| c == "..") {
        return Err(MountError::BadPath(v.path.clone()));
    }
    let device = find_disk(&v.serial)?;
    let target = v.path.trim_end_matches('/');
    if mounted(&device, target) {
        return Ok(());
    }
    std::fs::create_dir_all(target).map_err(|source| MountError::Sys {
        what: "making",
        path: target.to_owned(),
        source,
    })?;
    let sys = |what, path: &str| {
        let path = path.to_owned();
        move |source| MountError::Sys { what, path, source }
    };
    let dev_c = CString::new(device.as_str()).map_err(|_| MountError::BadPath(device.clone()))?;
    let target_c = CString::new(target).map_err(|_| MountError::BadPath(v.path.clone()))?;
    // A read-only volume is never replayed: its journal stays as written.
    let (flags, data) = if v.read_only {
        (libc::MS_RDONLY | libc::MS_NOATIME, "noload")
    } else {
        (libc::MS_NOATIME, "")
    };
    let data_c = CString::new(data).map_err(|_| MountError::BadPath(data.into()))?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            dev_c.as_ptr(),
            target_c.as_ptr(),
            c"ext4".as_ptr(),
            flags,
            data_c.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(sys("mounting", target)(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Before the guest ends: every volume unmounted, so its journal is clean
/// and its next mount replays nothing (a replay costs seconds where the
/// guest's kernel is emulated). Every other process is killed first, so
/// none holds a volume busy; one that stays busy past [`UNMOUNT_WAIT`] is
/// left mounted (the caller has synced it). Only the guest's PID 1 calls
/// this.
pub fn unmount_all() {
    let targets = volume_targets();
    if targets.is_empty() {
        return;
    }
    // SAFETY: kill(-1) signals every process but the caller (PID 1);
    // the guest is about to end.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    for target in targets.iter().rev() {
        let Ok(c) = CString::new(target.as_str()) else {
            continue;
        };
        let started = Instant::now();
        loop {
            // SAFETY: a NUL-terminated path alive for the call.
            if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) || started.elapsed() > UNMOUNT_WAIT {
                log!("volume {target} stays mounted at shutdown: {e}");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where volumes are mounted: the ext4 filesystems on virtio disks (the
/// root is an overlay; the writable layer's own mount was detached at
/// boot).
fn volume_targets() -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (device, target, kind) = (f.next()?, f.next()?, f.next()?);
            (device.starts_with("/dev/vd") && kind == "ext4")
                .then(|| super::sysinfo::unescape(target))
        })
        .collect()
}

/// `/dev/vdX` whose serial is `serial`, once it has a size.
fn find_disk(serial: &str) -> Result<String, MountError> {
    let started = Instant::now();
    loop {
        let found = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("vd"))
            .find(|n| {
                std::fs::read_to_string(format!("/sys/block/{n}/serial"))
                    .is_ok_and(|s| s.trim_end_matches(['\0', '\n']) == serial)
            });
        let Some(name) = found else {
            if started.elapsed() > SIZE_WAIT {
                return Err(MountError::NoDisk(serial.to_owned()));
            }
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let sectors = std::fs::read_to_string(format!("/sys/block/{name}/size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if sectors > 0 {
            return Ok(format!("/dev/{name}"));
        }
        if started.elapsed() > SIZE_WAIT {
            return Err(MountError::Empty(format!("/dev/{name}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `device` is mounted on `target` already.
fn mounted(device: &str, target: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(device) && f.next() == Some(target)
        })
    })
}
