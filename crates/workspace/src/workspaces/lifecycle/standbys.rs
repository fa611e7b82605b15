//! Standby VMM processes for restores (`base::vmm::standby`): when the
//! program's VMM runs standbys (`WorkspacesBuilder::standby_vmms`) and the
//! state directory keeps them (`config.json` `standby.count`), a restore
//! hands its launch to one waiting for its shape, and a new one is started
//! for the next restore. A standby that cannot be claimed or started only
//! means a process started the usual way.

use std::os::fd::OwnedFd;
use std::path::Path;

use base::store::spec::WorkspaceSpec;
use base::vmm::launch::VmmLaunch;
use base::vmm::standby::{self, StandbyArgs, StandbyConfig, StandbyShape, MAX_ALL_STANDBYS};

/// Where standbys' own messages go until a claim gives them a workspace's
/// `vmm.log`; started afresh past this size.
const STANDBY_LOG: &str = "standby.log";
const STANDBY_LOG_MAX_BYTES: u64 = 1 << 20;

/// How many standbys of a shape the state directory at `root` keeps; with
/// none kept, those still waiting are asked to end.
pub(crate) fn kept(root: &Path) -> u8 {
    let count = StandbyConfig::load(root).map(|c| c.count).unwrap_or(0);
    if count == 0 && standby::waiting_all(root) > 0 {
        standby::retire_all(root);
    }
    count
}

fn shape_of(spec: &WorkspaceSpec) -> StandbyShape {
    StandbyShape {
        vcpus: spec.vcpus,
        mem_mib: spec.mem_mib,
    }
}

/// Hands `launch` to a standby of `program` for `spec`'s shape: the pid of
/// the process that took it, now the workspace's VMM.
pub(crate) fn claim(
    root: &Path,
    spec: &WorkspaceSpec,
    program: &Path,
    launch: &VmmLaunch,
    log: &std::fs::File,
    owner: Option<&OwnedFd>,
) -> Option<u32> {
    standby::claim(root, shape_of(spec), program, launch, log, owner)
}

/// Starts standbys of `program` for `spec`'s shape until `count` wait (and
/// no more than [`MAX_ALL_STANDBYS`] of all shapes), on a thread of its
/// own: the restore that called it is not held up.
/// They are made like the workspace `like` (its network's passt).
pub(crate) fn refill_soon(
    root: &Path,
    program: &Path,
    like: &str,
    spec: &WorkspaceSpec,
    count: u8,
) {
    let standby = StandbyArgs {
        home: root.to_owned(),
        shape: shape_of(spec),
        like: Some(like.to_owned()),
    };
    let program = program.to_owned();
    std::thread::spawn(move || refill(&standby, &program, count));
}

fn refill(standby: &StandbyArgs, program: &Path, count: u8) {
    let (root, shape) = (standby.home.as_path(), standby.shape);
    standby::sweep(root);
    let missing = usize::from(count)
        .saturating_sub(standby::waiting(root, shape, program))
        .min(MAX_ALL_STANDBYS.saturating_sub(standby::waiting_all(root)));
    if missing == 0 {
        return;
    }
    let log = match open_log(root) {
        Ok(log) => log,
        Err(e) => {
            tracing::warn!(error = %e, "no standby VMM started");
            return;
        }
    };
    for _ in 0..missing {
        match base::vmm::spawn::spawn(program, &standby::standby_args(standby), &log, None) {
            // Reaped by this thread's successor, so a long-lived caller
            // collects no zombies.
            Ok(spawned) => {
                std::thread::spawn(move || base::store::process::reap(spawned.pid));
            }
            Err(e) => {
                tracing::warn!(error = %base::error_chain::error_chain(&e), "no standby VMM started");
                return;
            }
        }
    }
}

/// The standbys' log: a regular file of this user's standby directory,
/// never through a link; started afresh past its size.
fn open_log(root: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = standby::standby_dir(root);
    base::store::make_private_dir(&dir).map_err(std::io::Error::other)?;
    let path = dir.join(STANDBY_LOG);
    let fresh = std::fs::symlink_metadata(&path).is_ok_and(|m| m.len() > STANDBY_LOG_MAX_BYTES);
    let log = std::fs::File::options()
        .create(true)
        .append(!fresh)
        .write(true)
        .truncate(fresh)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    if !log.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(log)
}
