//! A workspace's services in its snapshots: each companion's machine is
//! written into `services/<service>/` of the workspace's snapshot (or a
//! live fork's origin), taken while every companion is paused so that the
//! services and the workspace are caught at one moment as far as they can
//! see each other; a restore or a fork puts each companion back from its
//! part (its disk, and its memory when it ran).

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::services::{command_of, ensure_companion, failed, CompanionStart, ServiceHost};
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
/// `snapshot` (`service` a checked host name: one path component).
pub(super) fn part_dir(snapshot: &Path, service: &str) -> PathBuf {
    snapshot.join(SERVICES_DIR).join(service)
}

/// Moves the services' parts of the snapshot in `from` into the directory
/// `to` (a live fork's: where no VMM may enter).
pub(crate) fn move_parts(from: &Path, to: &Path) -> Result<()> {
    let (from, to) = (from.join(SERVICES_DIR), to.join(SERVICES_DIR));
    std::fs::rename(&from, &to).map_err(crate::error::Error::host_io(format!(
        "moving the services' parts to {}",
        to.display()
    )))
}

/// Where a start's or a restore's services come from: a snapshot's
/// directory and the parts its record lists. Only what the record lists is
/// used, as the record says (memory or a disk alone), never what else lies
/// in the directory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServiceOrigin<'a> {
    /// The snapshot's directory.
    pub(crate) dir: &'a Path,
    /// Its record's parts.
    pub(crate) parts: &'a [ServiceSnapshot],
}

impl<'a> ServiceOrigin<'a> {
    /// Service `service`'s part, named by the workspace's spec (checked
    /// at its create): its directory and record.
    fn part(&self, service: &str) -> Option<(PathBuf, &'a ServiceSnapshot)> {
        self.parts
            .iter()
            .find(|p| p.service == service)
            .map(|p| (part_dir(self.dir, service), p))
    }

    /// Fails, saying which and why, unless every part reads whole (the
    /// digests its record keeps; a part named as no service could be is
    /// refused).
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        for part in self.parts {
            base::store::name::validate_name(&part.service)
                .map_err(|e| format!("a service part's name: {e}"))?;
            base::vmm::seal::check_machine(
                &part_dir(self.dir, &part.service),
                part.has_memory,
                part.memory_sha256.as_deref(),
                part.disk_sha256.as_deref(),
            )
            .map_err(|reason| format!("service `{}`: {reason}", part.service))?;
        }
        Ok(())
    }
}

/// Takes the snapshot of workspace `workspace` (its spec `spec`) into the
/// directory `dir`: its services' companions are paused, `write_workspace`
/// writes the workspace's own machine, then each companion's is written
/// into its part, and the companions run again whatever happened. A
/// companion that is missing has no part (a restore in place leaves it as
/// it is then, a fork makes it afresh).
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
    let taken = (|| {
        for (service, name) in &companions {
            host.pause_companion(name, true)
                .map_err(failed(&service.name))?;
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
    // Every one, not only those this take paused: one a killed take left
    // paused runs again here.
    for (_, name) in &companions {
        if let Err(e) = host.pause_companion(name, false) {
            tracing::warn!(workspace, companion = name, "resuming a service: {e}");
        }
    }
    taken
}

/// Puts the disks of stopped workspace `workspace`'s services back as
/// the snapshot `from` has them (a restore in place of a snapshot without
/// memory: nothing starts). A companion that is missing is made.
pub(crate) fn restore_disks(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    from: ServiceOrigin<'_>,
) -> Result<()> {
    for (index, service) in spec.services.iter().enumerate() {
        let Some((part, _)) = from.part(&service.name) else {
            continue;
        };
        ensure_companion(host, workspace, spec, index)
            .and_then(|name| host.load_companion_disk(&name, &part))
            .map_err(failed(&service.name))?;
    }
    Ok(())
}

/// How service `index` of `spec` starts: from its part of the snapshot
/// `from` when it has one (its disk put back first; resumed when the
/// record says it holds memory, its command still running there), else by
/// running its command.
pub(crate) fn how_to_start(
    host: &impl ServiceHost,
    name: &str,
    spec: &WorkspaceSpec,
    index: usize,
    from: Option<ServiceOrigin<'_>>,
) -> Result<CompanionStart> {
    let service = &spec.services[index];
    let Some((dir, record)) = from.and_then(|f| f.part(&service.name)) else {
        return command_of(host, service).map(CompanionStart::Run);
    };
    host.load_companion_disk(name, &dir)?;
    if !record.has_memory {
        return command_of(host, service).map(CompanionStart::Run);
    }
    Ok(CompanionStart::Resume(dir))
}
