//! A workspace's services in its snapshots: each companion's machine is
//! written into `services/<service>/` of the workspace's snapshot (or a
//! live fork's origin), taken while every companion is paused so that the
//! services and the workspace are caught at one moment as far as they can
//! see each other; a restore or a fork puts each companion back from its
//! part (its disk, and its memory when it ran).

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::services::{command_of, create_one, failed, CompanionStart, ServiceHost};
use base::code::ErrorCode;
use base::store::spec::services::companion_name;
use base::store::spec::WorkspaceSpec;

/// Where a snapshot keeps its services' parts.
const SERVICES_DIR: &str = "services";

/// One service's part of a snapshot, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ServiceSnapshot {
    /// The service's name.
    pub service: String,
    /// Whether its memory is in it (its companion ran), or only its disk.
    pub has_memory: bool,
    /// The memory file's digest, checked before it is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_sha256: Option<String>,
    /// The disk copy's digest, checked before it is restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_sha256: Option<String>,
}

impl ServiceSnapshot {
    /// The part of service `service` without digests yet.
    pub(crate) fn new(service: &str, has_memory: bool) -> Self {
        Self {
            service: service.to_owned(),
            has_memory,
            memory_sha256: None,
            disk_sha256: None,
        }
    }
}

/// The directory of service `service`'s part in the snapshot directory
/// `snapshot` (a service's name is a checked host name: one component).
pub(crate) fn part_dir(snapshot: &Path, service: &str) -> PathBuf {
    snapshot.join(SERVICES_DIR).join(service)
}

/// Whether the part in `part` holds memory to resume (its machine's state
/// file, which only a running machine's snapshot writes).
fn has_memory(part: &Path) -> bool {
    vmm_core::snapshot::SnapshotFiles::new(part)
        .state()
        .is_file()
}

/// Takes the snapshot of workspace `workspace` (its spec `spec`) into the
/// directory `dir`: its services' companions are paused, `write_workspace`
/// writes the workspace's own machine, then each companion's is written
/// into its part, and the companions run again whatever happened. A
/// companion that is missing has no part (a restore makes it afresh).
pub(crate) fn snapshot_all<T>(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    dir: &Path,
    write_workspace: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<ServiceSnapshot>)> {
    let companions: Vec<_> = spec
        .services
        .iter()
        .map(|s| (s, companion_name(workspace, &s.name)))
        .collect();
    let mut paused = Vec::new();
    let taken = (|| {
        for (service, name) in &companions {
            if host
                .pause_companion(name, true)
                .map_err(failed(&service.name))?
            {
                paused.push(name.as_str());
            }
        }
        let written = write_workspace()?;
        if companions.is_empty() {
            return Ok((written, Vec::new()));
        }
        // The workspace's VMM could write into `dir` while it wrote its
        // machine: whatever it left under this name goes.
        let parts_dir = dir.join(SERVICES_DIR);
        let _ = std::fs::remove_dir_all(&parts_dir);
        base::store::make_private_dir(&parts_dir)?;
        let mut parts = Vec::new();
        for (service, name) in &companions {
            match host.snapshot_companion(name, &service.name, &part_dir(dir, &service.name)) {
                Ok(part) => parts.push(part),
                Err(e) if e.code() == ErrorCode::NotFound => {}
                Err(e) => return Err(failed(&service.name)(e)),
            }
        }
        Ok((written, parts))
    })();
    for name in paused {
        if let Err(e) = host.pause_companion(name, false) {
            tracing::warn!(workspace, companion = name, "resuming a service: {e}");
        }
    }
    taken
}

/// Puts the disks of stopped workspace `workspace`'s services back as
/// the snapshot in `dir` has them (a restore in place of a snapshot
/// without memory: nothing starts). A companion that is missing is made.
pub(crate) fn restore_disks(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    dir: &Path,
) -> Result<()> {
    for (index, service) in spec.services.iter().enumerate() {
        let part = part_dir(dir, &service.name);
        if !part.is_dir() {
            continue;
        }
        ensure_companion(host, workspace, spec, index)
            .and_then(|name| host.load_companion_disk(&name, &part))
            .map_err(failed(&service.name))?;
    }
    Ok(())
}

/// Companion `index` of workspace `workspace`, made when it is missing (a
/// fork's, a restore's, or a create cut short); the caller names the
/// service in a failure.
pub(crate) fn ensure_companion(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    index: usize,
) -> Result<String> {
    let service = &spec.services[index];
    let name = companion_name(workspace, &service.name);
    match host.record_of(&name) {
        Err(e) if e.code() == ErrorCode::NotFound => create_one(host, workspace, spec, index),
        Err(e) => Err(e),
        Ok(_) => Ok(name),
    }
}

/// How service `index` of `spec` starts: from its part of the snapshot in
/// `from` when there is one (its disk put back first; resumed when it
/// holds memory, its command still running there), else by running its
/// command.
pub(crate) fn how_to_start<'p>(
    host: &impl ServiceHost,
    name: &str,
    spec: &WorkspaceSpec,
    index: usize,
    part: Option<&'p Path>,
) -> Result<CompanionStart<'p>> {
    let service = &spec.services[index];
    let Some(part) = part.filter(|p| p.is_dir()) else {
        return command_of(host, service).map(CompanionStart::Run);
    };
    host.load_companion_disk(name, part)?;
    if has_memory(part) {
        Ok(CompanionStart::Resume(part))
    } else {
        command_of(host, service).map(CompanionStart::Run)
    }
}
