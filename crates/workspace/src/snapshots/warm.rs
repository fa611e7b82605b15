//! Warm starts: the first time a fresh workspace of an image (for one
//! kernel, vCPU count, memory and disk size) reaches agent-ready, its VMM
//! keeps a snapshot of it in `warm/<key>/` of the state directory; a later
//! start of a fresh workspace with the same key resumes that snapshot, with
//! a copy of its disk, instead of booting. A warm snapshot that no longer
//! fits (snapshot format, kernel, image or guest command line changed) is
//! discarded with an event saying why, and that start boots and keeps a new
//! one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmm_core::snapshot::{MachineState, SnapshotFiles};

use crate::error::{Error, Result};
use crate::snapshots::copy_snapshot_disk;
use crate::workspaces::handle::Workspace;
use crate::workspaces::lifecycle::{Boot, StartProgress};
use crate::workspaces::manager::make_disk;
use crate::workspaces::services::Snapshots;
use base::host::settings::{now_ms, unique_id};
use base::store::console_log::CONSOLE_FILE;
use base::store::events::EventKind;
use base::store::file_lock::FileLock;
use base::store::spec::{Meta, StartKind, WorkspaceSpec};
use base::vmm::seal;
use base::vmm::warm::{WarmRecord, PENDING_PREFIX, WARM_RECORD};

/// The warm snapshots' directory in the state directory.
const WARM_DIR: &str = "warm";
/// A pending warm snapshot this old belongs to a VMM that died: a start
/// keeps its warm snapshot right after the agent first answers.
const PENDING_STALE_AFTER: Duration = Duration::from_secs(3600);

/// Removes the pending warm snapshots in `root` that their VMM left behind
/// when it died, and those set aside by a replacement killed half-way
/// (older than [`PENDING_STALE_AFTER`]).
fn sweep_stale_pending(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(PENDING_PREFIX) || name.starts_with(ASIDE_PREFIX)) {
            continue;
        }
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > PENDING_STALE_AFTER) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The prefix of a warm snapshot set aside while another replaces it, or
/// on its way out.
const ASIDE_PREFIX: &str = ".discard-";
/// How long a replacement waits for the starts resuming the warm snapshot
/// it replaces.
const REPLACE_WAIT: Duration = Duration::from_secs(120);

/// Warm snapshot `dir` locked, when nobody holds it against this use: a
/// start that resumes it holds it `shared` until its VMM runs; replacing
/// or discarding it holds it exclusively. The lock is the directory's own
/// (no lock file anyone else could replace), and never waited for: a
/// start finding it taken boots, a discard finding it taken leaves it.
fn try_lock(dir: &Path, shared: bool) -> Option<FileLock> {
    FileLock::try_directory(dir, shared)
        .ok()
        .flatten()
        .filter(|held| held.holds(dir))
}

impl Workspace<'_> {
    /// Starts the workspace's VMM and waits (at most `timeout`) for the
    /// agent, reporting progress about once a second. A workspace never
    /// started before resumes its image's warm snapshot when there is a
    /// usable one (no boot), and otherwise boots and keeps one. Here, above
    /// the life cycle it drives, with the first start's clone of the
    /// workspace's repository.
    pub async fn start(
        self,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.start_as(timeout, progress, false).await
    }

    /// [`Workspace::start`] that always boots the kernel (no warm snapshot
    /// is used or kept).
    pub async fn start_cold(
        self,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.start_as(timeout, progress, true).await
    }

    async fn start_as(
        self,
        timeout: Duration,
        mut progress: impl FnMut(StartProgress) + Send,
        cold: bool,
    ) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            let timeout_ms = crate::servers::millis(timeout);
            let call = crate::servers::WorkspaceCall::Start { cold, timeout_ms };
            // The server's progress, as it reports it.
            let mut on_frame = |frame| match frame {
                crate::servers::CallFrame::StartProgress {
                    elapsed_ms,
                    console,
                } => {
                    let elapsed = Duration::from_millis(elapsed_ms);
                    progress(StartProgress { elapsed, console });
                    true
                }
                // A start sends nothing else.
                _ => false,
            };
            let streams = crate::servers::RunStreams {
                on_frame: Some(&mut on_frame),
                ..Default::default()
            };
            return Ok(remote.call_streaming(call, streams).await?);
        }
        let (all, name) = (self.all, self.name.as_str());
        let hibernated = |state| state == base::store::state::State::Hibernated;
        if hibernated(self.get_here()?.state) {
            // As it was: its services (none: they cannot hibernate) and
            // repository are part of it already.
            return all.wake(name, timeout, progress).await;
        }
        let meta = match all
            .snapshots()
            .start_maybe_warm(name, timeout, &mut progress, cold)
            .await
        {
            // It hibernated by itself between the look and the start.
            Err(Error::WrongState { state, .. }) if hibernated(state) => {
                return all.wake(name, timeout, progress).await
            }
            other => other?,
        };
        crate::services::start_all(all, name, &meta, None).await?;
        self.clone_pending_repo().await?;
        Ok(meta)
    }
}

impl Snapshots<'_> {
    fn warm_root(self) -> PathBuf {
        self.all
            .warm_dir
            .clone()
            .or_else(base::host::settings::warm_dir_override)
            .unwrap_or_else(|| self.all.state_dir().root().join(WARM_DIR))
    }

    /// The usable warm snapshot of `key`, or why there is none (`None`:
    /// there never was one).
    fn usable_warm(
        self,
        key: &str,
        fingerprint: &str,
    ) -> std::result::Result<(PathBuf, WarmRecord), Option<String>> {
        let dir = self.warm_root().join(key);
        let record = dir.join(WARM_RECORD);
        if !record.exists() {
            return Err(None);
        }
        let record: WarmRecord = base::store::read_json(&record)
            .map_err(|e| Some(format!("its record is unreadable: {e}")))?;
        if record.fingerprint != fingerprint {
            return Err(Some(
                "the kernel, the image, the guest command line or the snapshot format changed"
                    .into(),
            ));
        }
        MachineState::read(&SnapshotFiles::new(&dir))
            .map_err(|e| Some(format!("its state file is unusable: {e}")))?;
        seal::Sealed::Memory
            .check(&dir, record.memory_sha256.as_deref())
            .map_err(Some)?;
        seal::Sealed::Disk
            .check(&dir, record.disk_sha256.as_deref())
            .map_err(Some)?;
        Ok((dir, record))
    }

    /// Discards warm snapshot `key` unless a start resumes it, or it was
    /// replaced since it was found wanting: with `resumed` (the snapshot
    /// whose resume failed: its record's time) only that one; without, only
    /// one still unusable.
    fn discard_warm(
        self,
        (key, fingerprint): (&str, &str),
        workspace: &str,
        reason: &str,
        resumed: Option<u64>,
    ) {
        let dir = self.warm_root().join(key);
        let Some(_held) = try_lock(&dir, false) else {
            return;
        };
        let still = match resumed {
            Some(made) => base::store::read_json::<WarmRecord>(&dir.join(WARM_RECORD))
                .is_ok_and(|r| r.created_at_ms == made),
            None => self.usable_warm(key, fingerprint).is_err(),
        };
        if !still {
            return;
        }
        let doomed = self
            .warm_root()
            .join(format!("{ASIDE_PREFIX}{key}-{}", unique_id()));
        if std::fs::rename(&dir, &doomed).is_ok() {
            let _ = std::fs::remove_dir_all(&doomed);
        }
        if let Ok(ws) = self.all.dir(workspace) {
            let _ = ws.events().append(EventKind::WarmSnapshotDiscarded {
                reason: reason.to_owned(),
            });
        }
    }

    /// How `meta`'s start goes: warm when it is pristine and a usable warm
    /// snapshot exists (its disk then becomes a copy of the snapshot's),
    /// else a boot that keeps one when it is pristine.
    fn plan_boot(self, meta: &Meta, cold: bool) -> Result<Boot> {
        let boot = Boot {
            kind: StartKind::Cold,
            restore: None,
            keep_warm: None,
            warm_held: None,
        };
        if cold || !meta.pristine {
            return Ok(boot);
        }
        let (key, fingerprint) = self.all.warm_identity(&meta.spec)?;
        // A snapshot planted there would be resumed into new workspaces:
        // the directory must be this user's alone (and its VMMs' account's,
        // which fill it).
        let vmm_gid = base::vmm::user::for_state(self.all.state.root())?.map(|u| u.gid);
        base::store::private_dir_shared_with(
            &self.warm_root(),
            "warm snapshot directory",
            vmm_gid,
        )?;
        // Held before it is checked, so what is checked is what resumes;
        // one being replaced: this start boots (and keeps nothing).
        let warm = self.warm_root().join(&key);
        let held = try_lock(&warm, true);
        if held.is_none() && warm.exists() {
            return Ok(boot);
        }
        match self.usable_warm(&key, &fingerprint) {
            Ok((dir, record)) => {
                let Some(held) = held else {
                    return Ok(boot);
                };
                let ws = self.all.dir(&meta.name)?;
                copy_snapshot_disk(&dir, &ws)?;
                // The boot's console, so `logs` shows how the guest came up.
                let _ = std::fs::copy(dir.join(CONSOLE_FILE), ws.path().join(CONSOLE_FILE));
                Ok(Boot {
                    kind: StartKind::Warm,
                    restore: Some(dir),
                    warm_held: Some((std::sync::Arc::new(held), record.created_at_ms)),
                    ..boot
                })
            }
            Err(why) => {
                drop(held);
                if let Some(reason) = why {
                    self.discard_warm((&key, &fingerprint), &meta.name, &reason, None);
                }
                // A warm snapshot has its volume slots empty: a boot with
                // volumes keeps none.
                if !meta.spec.volumes.is_empty() {
                    return Ok(boot);
                }
                sweep_stale_pending(&self.warm_root());
                let pending = self
                    .warm_root()
                    .join(format!("{PENDING_PREFIX}{key}-{}", unique_id()));
                std::fs::create_dir_all(&pending)
                    .map_err(Error::host_io(format!("creating {}", pending.display())))?;
                let record = WarmRecord {
                    key,
                    fingerprint,
                    from: meta.name.clone(),
                    created_at_ms: now_ms(),
                    memory_sha256: None,
                    disk_sha256: None,
                    ready_kernels: Vec::new(),
                };
                base::store::write_json_atomic(&pending.join(WARM_RECORD), &record)?;
                Ok(Boot {
                    keep_warm: Some(pending),
                    ..boot
                })
            }
        }
    }

    /// Keeps running workspace `name`'s machine as the warm snapshot of its
    /// image and size, in place of the one there: a fresh workspace made
    /// ready by the library (kernels of `ready_kernels` running in it)
    /// that later fresh workspaces resume as it is. `Ok(Some(why))` when it
    /// was not kept: starts kept resuming the one there, or a start kept
    /// its own first.
    pub(crate) async fn keep_warm_from(
        self,
        name: &str,
        ready_kernels: Vec<String>,
    ) -> Result<Option<&'static str>> {
        let meta = self.all.at(name).get_here()?;
        let (key, fingerprint) = self.all.warm_identity(&meta.spec)?;
        let vmm = base::vmm::user::for_state(self.all.state.root())?;
        let root = self.warm_root();
        base::store::private_dir_shared_with(
            &root,
            "warm snapshot directory",
            vmm.as_ref().map(|u| u.gid),
        )?;
        let pending = root.join(format!("{PENDING_PREFIX}{key}-{}", unique_id()));
        // Written, digested and synced before anything waits on it.
        let written = self.write_moved(name, &pending).and_then(|_| {
            let ws = self.all.dir(name)?;
            let _ = std::fs::copy(ws.path().join(CONSOLE_FILE), pending.join(CONSOLE_FILE));
            let record = WarmRecord {
                key: key.clone(),
                fingerprint,
                from: name.to_owned(),
                created_at_ms: now_ms(),
                memory_sha256: None,
                disk_sha256: None,
                ready_kernels,
            };
            base::store::write_json_atomic(&pending.join(WARM_RECORD), &record)?;
            // As the warm snapshots the VMMs keep: theirs to read.
            if let Some(user) = &vmm {
                user.hand_over_tree(&pending)?;
                user.share(&root)?;
            }
            base::vmm::warm::seal(&pending)
                .map_err(Error::host_io(format!("sealing {}", pending.display())))?;
            Ok(())
        });
        let kept = match written {
            Ok(()) => self.swap_warm(&root, &key, &pending).await,
            Err(e) => Err(e),
        };
        if !matches!(kept, Ok(None)) {
            let _ = std::fs::remove_dir_all(&pending);
        }
        kept
    }

    /// Puts `pending` in the place of warm snapshot `key`, once no start
    /// resumes the one there (which goes aside, and comes back if `pending`
    /// cannot take its place).
    async fn swap_warm(
        self,
        root: &Path,
        key: &str,
        pending: &Path,
    ) -> Result<Option<&'static str>> {
        let current = root.join(key);
        let deadline = Instant::now() + REPLACE_WAIT;
        let held = loop {
            if !current.exists() {
                break None;
            }
            if let Some(held) = try_lock(&current, false) {
                break Some(held);
            }
            if Instant::now() > deadline {
                return Ok(Some("starts kept resuming the warm snapshot there"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let aside = root.join(format!("{ASIDE_PREFIX}{key}-{}", unique_id()));
        let replaced = held.is_some() && std::fs::rename(&current, &aside).is_ok();
        // Not onto one a start kept meanwhile (a directory that is there).
        let placed = std::fs::rename(pending, &current);
        drop(held);
        if placed.is_err() {
            if replaced && std::fs::rename(&aside, &current).is_err() {
                let _ = std::fs::remove_dir_all(&aside);
            }
            return Ok(Some("a start kept a warm snapshot of its own first"));
        }
        if replaced {
            let _ = std::fs::remove_dir_all(&aside);
        }
        seal::sync_dir(root).map_err(Error::host_io(format!("syncing {}", root.display())))?;
        Ok(None)
    }

    /// The code-session kernels running in the warm snapshot a fresh
    /// workspace of `spec` would resume now (none when it would boot).
    pub(crate) fn warm_ready_kernels(self, spec: &WorkspaceSpec) -> Vec<String> {
        let Ok((key, fingerprint)) = self.all.warm_identity(spec) else {
            return Vec::new();
        };
        self.usable_warm(&key, &fingerprint)
            .map(|(_, record)| record.ready_kernels)
            .unwrap_or_default()
    }

    /// Whether a workspace of `spec` would resume a warm snapshot now.
    pub(crate) fn has_warm(self, spec: &WorkspaceSpec) -> bool {
        self.all
            .warm_identity(spec)
            .is_ok_and(|(key, fingerprint)| self.usable_warm(&key, &fingerprint).is_ok())
    }

    /// Starts `name`: warm when it can (see the module), cold when `cold`
    /// or when the warm start fails (the warm snapshot is then discarded
    /// and the workspace boots from a fresh disk).
    pub(crate) async fn start_maybe_warm(
        self,
        name: &str,
        timeout: Duration,
        mut progress: impl FnMut(StartProgress) + Send,
        cold: bool,
    ) -> Result<Meta> {
        let started = Instant::now();
        if !cold {
            if let Some(meta) = self.all.pools().claim(name).await? {
                return Ok(meta);
            }
        }
        let mut boot = self
            .all
            .launch_vmm(name, |meta| self.plan_boot(meta, cold))?;
        let result = self
            .all
            .wait_running(name, started, timeout, &mut progress)
            .await;
        // Its VMM has the snapshot open, or gave up.
        let resumed = boot.warm_held.take().map(|(_, made)| made);
        let Err(e) = &result else {
            return result;
        };
        if boot.kind != StartKind::Warm || matches!(e, Error::StartTimedOut { .. }) {
            return result;
        }
        // Halted or stopped while it resumed: not the snapshot's doing.
        let meta = self.all.at(name).get_here()?;
        if meta.state != base::store::state::State::Crashed {
            return result;
        }
        // The warm snapshot did not resume here: boot instead.
        let (key, fingerprint) = self.all.warm_identity(&meta.spec)?;
        self.discard_warm(
            (&key, &fingerprint),
            name,
            &format!("resuming it failed: {}", e.full_message()),
            resumed,
        );
        let ws = self.all.dir(name)?;
        make_disk(&ws.disk(), meta.spec.disk_mib)?;
        {
            let _lock = self.all.state_dir().lock_workspace(name)?;
            let mut meta = ws.read_meta()?;
            meta.pristine = true;
            ws.write_meta(&meta)?;
        }
        self.all
            .launch_vmm(name, |meta| self.plan_boot(meta, false))?;
        self.all
            .wait_running(name, started, timeout, &mut progress)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_only_pending_snapshots_older_than_the_bound() {
        let root = std::env::temp_dir().join(format!("ma-warm-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let old_pending = root.join(format!("{PENDING_PREFIX}minimal-old"));
        let new_pending = root.join(format!("{PENDING_PREFIX}minimal-new"));
        let old_kept = root.join("minimal-1c-256m-1024d-compat-user");
        for dir in [&old_pending, &new_pending, &old_kept] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let long_ago = std::time::SystemTime::now() - PENDING_STALE_AFTER * 2;
        for dir in [&old_pending, &old_kept] {
            std::fs::File::open(dir)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        sweep_stale_pending(&root);
        assert!(!old_pending.exists(), "a stale pending snapshot stays");
        assert!(
            new_pending.exists(),
            "a pending snapshot in use was removed"
        );
        assert!(old_kept.exists(), "a kept warm snapshot was removed");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
