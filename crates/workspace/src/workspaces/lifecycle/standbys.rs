//! Standby VMM processes for restores (`base::vmm::standby`): when the
//! state directory keeps standbys (`config.json` `standby.count`), a
//! restore hands its launch to one waiting for its shape, and a new one
//! is started for the next restore. A standby that cannot be claimed or
//! started only means a process started the usual way.

use std::os::fd::OwnedFd;
use std::path::Path;

use base::store::spec::WorkspaceSpec;
use base::vmm::launch::VmmLaunch;
use base::vmm::standby::{self, StandbyConfig, StandbyShape};

/// Where standbys' own messages go until a claim gives them a workspace's
/// `vmm.log`; started afresh past this size.
const STANDBY_LOG: &str = "standby.log";
const STANDBY_LOG_MAX_BYTES: u64 = 1 << 20;

/// How many standbys of a shape the state directory at `root` keeps.
pub(crate) fn kept(root: &Path) -> u8 {
    StandbyConfig::load(root).map(|c| c.count).unwrap_or(0)
}

fn shape_of(spec: &WorkspaceSpec) -> StandbyShape {
    StandbyShape {
        vcpus: spec.vcpus,
        mem_mib: spec.mem_mib,
    }
}

/// Hands `launch` to a standby for `spec`'s shape: the pid of the process
/// that took it, now the workspace's VMM.
pub(crate) fn claim(
    root: &Path,
    spec: &WorkspaceSpec,
    launch: &VmmLaunch,
    log: &std::fs::File,
    owner: Option<&OwnedFd>,
) -> Option<u32> {
    standby::claim(root, shape_of(spec), launch, log, owner)
}

/// Starts standbys for `spec`'s shape until `count` wait.
pub(crate) fn refill(root: &Path, program: &Path, spec: &WorkspaceSpec, count: u8) {
    let shape = shape_of(spec);
    let missing = usize::from(count).saturating_sub(standby::waiting(root, shape));
    if missing == 0 {
        return;
    }
    let dir = standby::standby_dir(root);
    if let Err(e) = base::store::make_private_dir(&dir) {
        tracing::warn!(error = %e, "no standby VMM started");
        return;
    }
    let path = dir.join(STANDBY_LOG);
    let fresh = std::fs::metadata(&path).is_ok_and(|m| m.len() > STANDBY_LOG_MAX_BYTES);
    let log = std::fs::File::options()
        .create(true)
        .append(!fresh)
        .write(true)
        .truncate(fresh)
        .open(&path);
    let log = match log {
        Ok(log) => log,
        Err(e) => {
            tracing::warn!(error = %e, "no standby VMM started");
            return;
        }
    };
    for _ in 0..missing {
        match base::vmm::spawn::spawn(program, &standby::standby_args(root, shape), &log, None) {
            // Reaped by a thread, so a long-lived caller collects no zombies.
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
