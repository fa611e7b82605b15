//! What the client knows of a VMM process's confinement: the switch that
//! turns its seccomp filters off, and how a seccomp kill shows in its log.

use crate::store::workspace_dir::WorkspaceDir;

/// Turns off confinement (for debugging a missing syscall; docs/security.md).
pub const NO_SECCOMP_VAR: &str = "MICROAGENT_VMM_NO_SECCOMP";

/// What the VMM's SIGSYS handler reported in its log, if it did.
pub fn seccomp_violation(ws: &WorkspaceDir) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut log = std::fs::File::open(ws.path().join(crate::store::workspace_dir::VMM_LOG)).ok()?;
    let len = log.metadata().ok()?.len();
    log.seek(SeekFrom::Start(len.saturating_sub(4096))).ok()?;
    let mut tail = Vec::new();
    log.read_to_end(&mut tail).ok()?;
    let tail = String::from_utf8_lossy(&tail);
    let line = tail
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(vmm_core::seccomp::VIOLATION_PREFIX))?;
    Some(line.trim().to_owned())
}
