//! Taking, listing, deleting and forking snapshots (the collection's side).

use std::path::{Path, PathBuf};
use std::time::Duration;

use vmm_core::disk_copy::copy_disk;
use vmm_core::snapshot::SnapshotFiles;

use crate::error::{Error, Result};
use crate::services::{ServiceOrigin, ServiceSnapshot};
use crate::snapshots::suffixed_name;
use crate::snapshots::{
    allocated_bytes, copy_snapshot_disk, copy_snapshot_volumes, volume_disk_index, SnapshotInfo,
    WORKSPACE_DISK,
};
use crate::workspaces::handle::Workspace;
use crate::workspaces::lifecycle::StartProgress;
use crate::workspaces::services::Snapshots;

use base::host::settings::now_ms;
use base::store::events::EventKind;
use base::store::name::validate_full_name;
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::state::State;
use base::store::{make_private_dir, read_json, write_json_atomic, SNAPSHOTS_DIR};
use base::vmm::control::{self, ControlRequest, ControlResponse};
use base::vmm::seal;
use base::volumes::VolumeStore;

/// A snapshot's record in its directory.
const RECORD: &str = "snapshot.json";
/// Where a live fork keeps the snapshot it started from, in its own
/// directory (deleted with it).
const FORK_ORIGIN: &str = "origin";
/// How long the VMM may take to write a snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

impl Snapshots<'_> {
    fn snapshots_dir(self) -> PathBuf {
        self.all.state_dir().root().join(SNAPSHOTS_DIR)
    }

    /// Removes the `.NAME.PID.tmp` and `.NAME.PID.rm` directories of takes
    /// and deletes whose process was killed half-way.
    fn sweep_abandoned_snapshots(self) {
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(stem) = file_name
                .to_str()
                .filter(|n| n.starts_with('.'))
                .and_then(|n| n.strip_suffix(".tmp").or_else(|| n.strip_suffix(".rm")))
            else {
                continue;
            };
            if base::store::leftover_pid(stem, '.')
                .is_some_and(|pid| base::store::process::start_ticks(pid).is_none())
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    fn snapshot_dir(self, name: &str) -> Result<PathBuf> {
        validate_full_name(name).map_err(|e| Error::InvalidInput(format!("snapshot name: {e}")))?;
        Ok(self.snapshots_dir().join(name))
    }

    /// Writes `workspace`'s machine into the new directory `dir`: memory
    /// and disk when it runs, the disk alone when it is stopped. Returns
    /// whether memory was saved and the pause in ms.
    fn write_machine(self, workspace: &str, dir: &Path) -> Result<(bool, f64)> {
        let meta = self.all.at(workspace).get_here()?;
        let ws = self.all.dir(workspace)?;
        match meta.state {
            State::Running => {
                let shared = match &meta.runtime {
                    Some(rt) => base::vmm::user::share_with_running(
                        rt.pid,
                        dir,
                        self.all.state_dir().root(),
                    )?,
                    None => false,
                };
                let answer = control::call(
                    &ws.control(),
                    &ControlRequest::Snapshot {
                        dir: dir.to_path_buf(),
                    },
                    SNAPSHOT_TIMEOUT,
                );
                if shared {
                    base::vmm::user::take_back(dir)?;
                }
                let answer = answer?;
                let paused_us = match answer {
                    ControlResponse::Snapshot { paused_us, .. } => paused_us,
                    _ => 0,
                };
                Ok((true, paused_us as f64 / 1000.0))
            }
            State::Stopped | State::Crashed => {
                let files = SnapshotFiles::new(dir);
                let mut disks = vec![(WORKSPACE_DISK, ws.disk())];
                let store = VolumeStore::new(self.all.state_dir());
                for (slot, m) in meta.spec.volumes.iter().enumerate() {
                    if !m.read_only {
                        disks.push((volume_disk_index(slot), store.mount_disk(&ws, slot, m)?));
                    }
                }
                for (index, from) in disks {
                    let to = files.disk(index);
                    copy_disk(&from, &to).map_err(Error::host_io(format!(
                        "copying {} to {}",
                        from.display(),
                        to.display()
                    )))?;
                }
                Ok((false, 0.0))
            }
            state => Err(Error::WrongState {
                name: workspace.to_owned(),
                state,
                why: "it is between states; a snapshot needs it running or stopped",
                remedy: Some(base::remedy::Remedy::WaitOrHalt {
                    workspace: workspace.to_owned(),
                }),
            }),
        }
    }
}

impl Snapshots<'_> {
    /// Writes workspace `name`'s machine into the new directory `into`
    /// (where no VMM may enter): first where its VMM sees, the snapshots
    /// directory, then moved there. Returns whether memory was saved.
    pub(super) fn write_moved(self, name: &str, into: &Path) -> Result<bool> {
        let parent = self.snapshots_dir();
        let scratch = parent.join(format!(
            ".{name}-{}.{}.tmp",
            base::host::settings::unique_id(),
            std::process::id()
        ));
        make_private_dir(&scratch)?;
        let written = self
            .write_machine(name, &scratch)
            .and_then(|(has_memory, _)| {
                std::fs::rename(&scratch, into).map_err(Error::host_io(format!(
                    "moving the snapshot to {}",
                    into.display()
                )))?;
                Ok(has_memory)
            });
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        written
    }

    /// Writes companion `name`'s machine into the new directory `into`,
    /// service `service`'s part of a snapshot (in a directory no VMM may
    /// enter), digested and synced.
    pub(super) fn write_part(
        self,
        name: &str,
        service: &str,
        into: &Path,
    ) -> Result<ServiceSnapshot> {
        let mut part = ServiceSnapshot::new(service, self.write_moved(name, into)?);
        (part.memory_sha256, part.disk_sha256) = digests(into, part.has_memory)?;
        seal::sync_tree(into).map_err(Error::host_io(format!("syncing {}", into.display())))?;
        Ok(part)
    }
}

/// The digests of the memory file (when `has_memory`) and the disk copy of
/// the machine just written into `dir`, for its record.
fn digests(dir: &Path, has_memory: bool) -> Result<(Option<String>, Option<String>)> {
    let memory = has_memory
        .then(|| seal::Sealed::Memory.digest(dir))
        .transpose()
        .map_err(Error::host_io("reading the memory file back"))?;
    let disk = seal::Sealed::Disk
        .digest(dir)
        .map_err(Error::host_io("reading the disk copy back"))?;
    Ok((memory, Some(disk)))
}

/// `<workspace>-<ms>`, the workspace's name cut so the whole is a valid
/// name (at most 63 characters, not ending in `-` before the time).
fn default_snapshot_name(workspace: &str, ms: u64) -> String {
    suffixed_name(workspace, &ms.to_string())
}

impl Workspace<'_> {
    /// Takes a snapshot of it named `name` (by default
    /// `<workspace>-<time>`, the name shortened to fit): its whole machine while it runs (the guest
    /// pauses meanwhile), its disk while it is stopped.
    pub fn snapshot_take(self, name: Option<&str>) -> Result<SnapshotInfo> {
        if let Some(remote) = self.remote()? {
            return Ok(
                remote.call_blocking(crate::servers::WorkspaceCall::SnapshotTake {
                    snapshot: name.map(str::to_owned),
                })?,
            );
        }
        let (snapshots, workspace) = (self.all.snapshots(), self.name.as_str());
        let meta = self.get_here()?;
        // In its workspace's namespace.
        let (short, namespace) = workspace
            .split_once('.')
            .unwrap_or((workspace, base::store::name::DEFAULT_NAMESPACE));
        let name = name.map_or_else(|| default_snapshot_name(short, now_ms()), str::to_owned);
        let name = base::store::name::full_name(namespace, &name)
            .map_err(|e| Error::InvalidInput(format!("snapshot name: {e}")))?;
        let dir = snapshots.snapshot_dir(&name)?;
        if dir.exists() {
            return Err(Error::SnapshotExists(name));
        }
        snapshots.sweep_abandoned_snapshots();
        let parent = snapshots.snapshots_dir();
        make_private_dir(&parent)?;
        // Unique: two takes of one name at once never share it.
        let tmp = parent.join(format!(
            ".{name}-{}.{}.tmp",
            base::host::settings::unique_id(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        make_private_dir(&tmp)?;
        let made = (|| -> Result<SnapshotInfo> {
            let ((has_memory, paused_ms), services) =
                crate::services::snapshot_all(self.all, workspace, &meta.spec, &tmp, || {
                    snapshots.write_machine(workspace, &tmp)
                })?;
            base::pause_point::pause_point("snapshot:written");
            let (memory_sha256, disk_sha256) = digests(&tmp, has_memory)?;
            let info = SnapshotInfo {
                name: name.clone(),
                workspace: workspace.to_owned(),
                created_at_ms: now_ms(),
                spec: meta.spec.clone(),
                has_memory,
                paused_ms,
                size_bytes: 0,
                memory_sha256,
                disk_sha256,
                services,
            };
            write_json_atomic(&tmp.join(RECORD), &info)?;
            // On disk before it has its name: a crash leaves a temporary
            // directory, never a snapshot with missing bytes.
            seal::sync_tree(&tmp).map_err(Error::host_io(format!("syncing {}", tmp.display())))?;
            // Fails if the name was taken meanwhile: a non-empty target.
            std::fs::rename(&tmp, &dir).map_err(|_| Error::SnapshotExists(name.clone()))?;
            seal::sync_dir(&parent)
                .map_err(Error::host_io(format!("syncing {}", parent.display())))?;
            Ok(info)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        let mut info = made?;
        info.size_bytes = allocated_bytes(&dir);
        self.all
            .dir(workspace)?
            .events()
            .append(EventKind::SnapshotTaken {
                snapshot: name,
                has_memory: info.has_memory,
            })?;
        Ok(info)
    }
}

impl<'a> Snapshots<'a> {
    /// The snapshot `name` (in this view's namespace, or a full name);
    /// FORBIDDEN when another agent owns it.
    pub fn get(self, name: &str) -> Result<SnapshotInfo> {
        let name = base::store::name::full_name(&self.all.namespace, name)
            .map_err(|e| Error::InvalidInput(format!("snapshot name: {e}")))?;
        let info = self.snapshot_record(&name)?;
        self.all.check_access("snapshot", &name, &info.spec)?;
        Ok(info)
    }

    /// The snapshot with full name `name`, unchecked.
    fn snapshot_record(self, name: &str) -> Result<SnapshotInfo> {
        let dir = self.snapshot_dir(name)?;
        let record = dir.join(RECORD);
        if !record.exists() {
            return Err(Error::SnapshotNotFound(name.to_owned()));
        }
        let mut info: SnapshotInfo = read_json(&record)?;
        info.size_bytes = allocated_bytes(&dir);
        Ok(info)
    }

    /// Every snapshot in this view's namespace (of `workspace` only, if
    /// given; a short name is in the view's namespace), oldest first. An
    /// agent's view lists what it may use, or with `all_agents` every
    /// agent's (the others' stay FORBIDDEN to use).
    pub fn list(self, workspace: Option<&str>, all_agents: bool) -> Result<Vec<SnapshotInfo>> {
        let workspace = workspace.map(|w| self.all.full_name(w)).transpose()?;
        // A workspace on a server: its snapshots are there (its owner
        // checked first, as for any call on it).
        if let Some(w) = workspace.as_deref() {
            if let Some(remote) = self.all.at(w).remote()? {
                let call = crate::servers::WorkspaceCall::SnapshotList {};
                return Ok(remote.call_blocking(call)?);
            }
        }
        self.sweep_abandoned_snapshots();
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return Ok(out);
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let shown = |info: &SnapshotInfo| {
                let spec = &info.spec;
                workspace.as_ref().is_none_or(|w| *w == info.workspace)
                    && self.all.lists(
                        base::store::name::namespace_of(&info.name),
                        spec.agent.as_deref(),
                        &spec.shared_with,
                        all_agents,
                    )
            };
            match self.snapshot_record(&name) {
                Ok(info) if shown(&info) => out.push(info),
                Ok(_) | Err(Error::SnapshotNotFound(_)) => {}
                Err(e) => tracing::warn!("skipping snapshot `{name}`: {}", e.full_message()),
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, &a.name).cmp(&(b.created_at_ms, &b.name)));
        Ok(out)
    }

    /// Deletes the snapshot `name`. Workspaces forked from it keep running:
    /// they hold its memory file open.
    pub fn delete(self, name: &str) -> Result<SnapshotInfo> {
        let info = self.get(name)?;
        let name = info.name.as_str();
        let dir = self.snapshot_dir(name)?;
        // Renamed first, so a half-deleted snapshot never looks whole.
        let doomed = self
            .snapshots_dir()
            .join(format!(".{name}.{}.rm", std::process::id()));
        std::fs::rename(&dir, &doomed)
            .and_then(|()| std::fs::remove_dir_all(&doomed))
            .map_err(Error::host_io(format!("deleting {}", dir.display())))?;
        if let Ok(ws) = self.all.dir(&info.workspace) {
            // The workspace may be gone; its snapshots outlive it.
            let _ = ws.events().append(EventKind::SnapshotDeleted {
                snapshot: name.to_owned(),
            });
        }
        Ok(info)
    }

    /// Fails unless the snapshot reads whole: its disk copy and, when it
    /// holds memory, its state file (magic, version, length, checksum) and
    /// memory file, and the same of each service's part.
    fn check_usable(self, info: &SnapshotInfo) -> Result<()> {
        let dir = self.snapshot_dir(&info.name)?;
        let unusable = |reason| Error::SnapshotUnusable {
            name: info.name.clone(),
            reason,
        };
        seal::check_machine(
            &dir,
            info.has_memory,
            info.memory_sha256.as_deref(),
            info.disk_sha256.as_deref(),
        )
        .map_err(unusable)?;
        ServiceOrigin {
            dir: &dir,
            parts: &info.services,
        }
        .check()
        .map_err(unusable)?;
        Ok(())
    }

    /// Puts the snapshot's workspace back to the snapshot's state: its disk
    /// is replaced by a copy of the snapshot's, and a snapshot with memory
    /// resumes it where it was taken (a disk-only one leaves it stopped). A
    /// running workspace is only restored with `force` (it is halted
    /// first). With `as_name`, a new workspace of that name is made from
    /// the snapshot instead (a fork) and the original is left alone.
    pub async fn restore(
        self,
        name: &str,
        as_name: Option<&str>,
        force: bool,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        let info = self.get(name)?;
        let name = info.name.as_str();
        if let Some(new_name) = as_name {
            return self
                .all
                .at(&info.workspace)
                .fork(new_name, Some(name), timeout, progress)
                .await;
        }
        self.check_usable(&info)?;
        let target = info.workspace.as_str();
        let meta = self.all.at(target).get_here()?;
        // The workspace of that name now may be another agent's (the
        // snapshot's was deleted and the name taken again).
        self.all.check_access("workspace", target, &meta.spec)?;
        // A hibernated machine's memory would be restored over the
        // snapshot's disk.
        if meta.state.has_machine() {
            if !force {
                return Err(Error::WrongState {
                    name: target.to_owned(),
                    state: meta.state,
                    why: "restoring it in place discards its running state",
                    remedy: Some(base::remedy::Remedy::StopOrForceRestore {
                        workspace: target.to_owned(),
                        snapshot: name.to_owned(),
                    }),
                });
            }
            self.all.at(target).halt()?;
        }
        let ws = self.all.dir(target)?;
        // Its read-write volumes go back to the snapshot's instant too:
        // none may be another running workspace's now.
        self.all.check_mountable(target, &meta.spec.volumes)?;
        {
            let _lock = self.all.state_dir().lock_workspace(target)?;
            let dir = self.snapshot_dir(name)?;
            copy_snapshot_disk(&dir, &ws)?;
            let mut volumes = meta.spec.volumes.clone();
            copy_snapshot_volumes(
                &dir,
                &ws,
                &mut volumes,
                &VolumeStore::new(self.all.state_dir()),
                false,
            )?;
            ws.events().append(EventKind::Restored {
                snapshot: name.to_owned(),
            })?;
        }
        let dir = self.snapshot_dir(name)?;
        let services = ServiceOrigin {
            dir: &dir,
            parts: &info.services,
        };
        if !info.has_memory {
            // Its services' disks too; nothing starts.
            crate::services::restore_disks(self.all, target, &meta.spec, services)?;
            return self.all.at(target).get();
        }
        self.all
            .start_from(target, timeout, progress, Some(&dir), Some(services))
            .await
    }
}

impl Workspace<'_> {
    /// Creates workspace `new_name` as a fork and starts it: from the
    /// snapshot `snapshot` if given, else from this workspace as it is now (a
    /// snapshot of its running machine, kept in the fork's directory). A
    /// snapshot with memory resumes where it was taken; a disk-only one
    /// boots from its disk. The fork has its own disk copy and sockets.
    pub async fn fork(
        self,
        new_name: &str,
        snapshot: Option<&str>,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            // Named as the server names it (in its source's namespace),
            // checked and free here before any ssh; the placement is of
            // that name, never of one the server answers with.
            let source_namespace = base::store::name::namespace_of(self.name());
            let to = base::store::name::full_name(source_namespace, new_name)
                .map_err(base::store::StoreError::Name)?;
            // Not into the pools' namespace, as a create there is not.
            let namespace = base::store::name::namespace_of(&to);
            crate::workspaces::tenancy::refuse_reserved_namespace(namespace)?;
            let call = crate::servers::WorkspaceCall::Fork {
                new_name: to.clone(),
                snapshot: snapshot.map(str::to_owned),
                timeout_ms: crate::servers::millis(timeout),
            };
            // The fork lives beside its source, its creator's as a create's.
            let make = async { Ok(remote.call(call).await?) };
            return self.all.make_placed(remote.server(), &to, make).await;
        }
        let (all, source) = (self.all, self.name.as_str());
        // The fork is in its source's namespace unless named in another.
        let to = base::store::name::full_name(base::store::name::namespace_of(source), new_name)
            .map_err(base::store::StoreError::Name)?;
        // Not into the pools' namespace, as a create there is not.
        crate::workspaces::tenancy::refuse_reserved_namespace(base::store::name::namespace_of(
            &to,
        ))?;
        let snap = match snapshot {
            Some(s) => Some(all.snapshots().get(s)?.name),
            None => None,
        };
        // It may write a snapshot of a running workspace and copy a disk.
        let (from, new) = (source.to_owned(), to.clone());
        let origin = all
            .blocking(move |ws| ws.snapshots().prepare_fork(&from, &new, snap.as_deref()))
            .await?;
        let services = ServiceOrigin {
            dir: &origin.services_dir,
            parts: &origin.parts,
        };
        let restore = origin.has_memory.then_some(origin.dir.as_path());
        let started = all
            .start_from(&to, timeout, progress, restore, Some(services))
            .await;
        if origin.services_scratch {
            // Its companions hold what they resumed open.
            let _ = std::fs::remove_dir_all(&origin.services_dir);
        }
        started
    }
}

/// What a fork is made from.
struct ForkOrigin {
    /// The snapshot directory (a snapshot's, or the live source's written
    /// into the fork's own directory).
    dir: PathBuf,
    /// Whether it holds memory to restore.
    has_memory: bool,
    /// Where its services' parts are: the snapshot's directory, or for a
    /// live fork a directory of the snapshots' that no VMM may enter (not
    /// the fork's own, which its VMM writes before its services start).
    services_dir: PathBuf,
    /// The parts, with their digests.
    parts: Vec<ServiceSnapshot>,
    /// Whether `services_dir` is this fork's own, removed once it started.
    services_scratch: bool,
}

impl Snapshots<'_> {
    /// Makes the fork's directory, disk and record; returns what it is
    /// made from.
    fn prepare_fork(
        self,
        source: &str,
        new_name: &str,
        snapshot: Option<&str>,
    ) -> Result<ForkOrigin> {
        let ws = self.all.dir(new_name)?;
        ws.check_socket_paths()?;
        let from_snapshot = snapshot.map(|s| self.snapshot_record(s)).transpose()?;
        // A snapshot outlives its workspace; only a live fork needs it.
        let source_meta = match &from_snapshot {
            Some(_) => None,
            None => Some(self.all.at(source).get_here()?),
        };
        if let Some(info) = &from_snapshot {
            // Checked whole before anything is made: a damaged snapshot
            // leaves no half-made fork behind.
            self.check_usable(info)?;
        }
        if let Some(meta) = source_meta.as_ref().filter(|m| m.state != State::Running) {
            return Err(Error::NotRunning {
                name: source.to_owned(),
                state: meta.state,
            });
        }
        let lock = self.all.state_dir().lock_workspace(new_name)?;
        // Taken here, or by a workspace placed on a server from here.
        self.all.check_name_free(new_name)?;
        let _ = std::fs::remove_dir_all(ws.path());
        // A live fork's services' parts, where no VMM may enter.
        let services_scratch = self.snapshots_dir().join(format!(
            ".fork-{new_name}-services-{}.{}.tmp",
            base::host::settings::unique_id(),
            std::process::id()
        ));
        let made = (|| -> Result<ForkOrigin> {
            make_private_dir(ws.path())?;
            let (origin, spec) = match (&from_snapshot, &source_meta) {
                (Some(info), _) => {
                    let dir = self.snapshot_dir(&info.name)?;
                    let origin = ForkOrigin {
                        services_dir: dir.clone(),
                        dir,
                        has_memory: info.has_memory,
                        parts: info.services.clone(),
                        services_scratch: false,
                    };
                    (origin, info.spec.clone())
                }
                (None, Some(meta)) => {
                    // Written where the source's VMM sees (its private root
                    // has the snapshots directory, not other workspaces),
                    // then moved into the fork's directory.
                    let parent = self.snapshots_dir();
                    let scratch =
                        parent.join(format!(".fork-{new_name}.{}.tmp", std::process::id()));
                    let _ = std::fs::remove_dir_all(&scratch);
                    make_private_dir(&scratch)?;
                    let dir = ws.path().join(FORK_ORIGIN);
                    // Its services' machines with it, as a snapshot
                    // takes them.
                    let written = crate::services::snapshot_all(
                        self.all,
                        source,
                        &meta.spec,
                        &scratch,
                        || self.write_machine(source, &scratch),
                    )
                    .and_then(|((has_memory, _), parts)| {
                        if !parts.is_empty() {
                            make_private_dir(&services_scratch)?;
                            crate::services::move_parts(&scratch, &services_scratch)?;
                            // Checked as a snapshot's are (`check_usable`),
                            // before anything starts from them.
                            ServiceOrigin {
                                dir: &services_scratch,
                                parts: &parts,
                            }
                            .check()
                            .map_err(|reason| {
                                Error::SnapshotUnusable {
                                    name: new_name.to_owned(),
                                    reason,
                                }
                            })?;
                        }
                        std::fs::rename(&scratch, &dir).map_err(Error::host_io(format!(
                            "moving the snapshot to {}",
                            dir.display()
                        )))?;
                        Ok(ForkOrigin {
                            dir,
                            has_memory,
                            services_dir: services_scratch.clone(),
                            parts,
                            services_scratch: true,
                        })
                    });
                    if written.is_err() {
                        let _ = std::fs::remove_dir_all(&scratch);
                    }
                    (written?, meta.spec.clone())
                }
                (None, None) => return Err(Error::WorkspaceNotFound(source.to_owned())),
            };
            copy_snapshot_disk(&origin.dir, &ws)?;
            // Read-write volumes: the fork's own copies, as at the snapshot.
            let mut volumes = spec.volumes.clone();
            copy_snapshot_volumes(
                &origin.dir,
                &ws,
                &mut volumes,
                &VolumeStore::new(self.all.state_dir()),
                true,
            )?;
            // Host ports belong to one workspace: a fork publishes none; on
            // a tap network it takes an address of its own.
            let (_network, spec) =
                self.all
                    .networks()
                    .place(self.all.owned_by_caller(WorkspaceSpec {
                        ports: Vec::new(),
                        volumes,
                        ..spec
                    }))?;
            let meta = Meta::created(new_name, spec, false);
            ws.write_meta(&meta)?;
            ws.events().append(EventKind::Forked {
                from: source.to_owned(),
                snapshot: snapshot.map(str::to_owned),
            })?;
            Ok(origin)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&services_scratch);
            let _ = std::fs::remove_dir_all(ws.path());
            let _ = self.all.state_dir().remove_lock(new_name, lock);
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::store::name::validate_name;

    #[test]
    fn default_snapshot_names_are_valid_names_for_any_workspace() {
        let ms = 1_795_435_674_448;
        assert_eq!(default_snapshot_name("dev", ms), "dev-1795435674448");
        let long = "a".repeat(63);
        let name = default_snapshot_name(&long, ms);
        assert_eq!(name.len(), 63);
        validate_name(&name).unwrap();
        // Cut where a dash would end up before the time.
        let dashed = format!("{}-bcd", "a".repeat(48));
        let name = default_snapshot_name(&dashed, ms);
        assert_eq!(name, format!("{}-{ms}", "a".repeat(48)));
        validate_name(&name).unwrap();
    }
}
