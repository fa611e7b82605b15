//! The life cycle of a workspace with a VMM: start (warm, cold or
//! restored), stop, halt, delete, and its TTL; its hibernation and the
//! wake every call to a guest goes through (`hibernation`, above this).

pub(crate) mod hibernation;
mod standbys;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;
use base::host::settings::now_ms;
use base::remedy::Remedy;
use base::store::process;
use base::store::spec::{DeleteOptions, Meta, Runtime, StartKind};
use base::store::state::State;
use base::store::workspace_dir::VMM_LOG;
use base::vmm::control::{self, ControlRequest, ControlResponse};
use base::vmm::launch::VmmLaunch;

/// Default time `start` waits for the agent.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(300);
/// Default grace period of `stop` before the VM is torn down.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How one start launches the VMM.
#[derive(Clone, Debug)]
pub(crate) struct Boot {
    /// Cold, warm or from a snapshot.
    pub kind: StartKind,
    /// The snapshot directory to restore, if not booting.
    pub restore: Option<PathBuf>,
    /// Where the VMM keeps a warm snapshot once the agent answers.
    pub keep_warm: Option<PathBuf>,
    /// The warm snapshot restored, held (shared) until the start is
    /// over so that it is not replaced while its VMM opens it, and its
    /// record's time (the one a failed resume may discard).
    pub warm_held: Option<(std::sync::Arc<base::store::file_lock::FileLock>, u64)>,
}

/// What `start` reports while it waits.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StartProgress {
    /// Time since the start request.
    pub elapsed: Duration,
    /// The newest console line.
    pub console: Option<String>,
}

impl Workspaces {
    /// [`Workspace::start`], restoring the snapshot in `restore` (whose
    /// writable disk the workspace's disk is a copy of) instead of booting;
    /// its services start from their parts of the snapshot in
    /// `services_from` where it has them.
    pub(crate) async fn start_from(
        &self,
        name: &str,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
        restore: Option<&Path>,
        services_from: Option<crate::services::ServiceOrigin<'_>>,
    ) -> Result<Meta> {
        let meta = self.start_machine(name, timeout, progress, restore).await?;
        crate::services::start_all(self, name, &meta, services_from).await?;
        Ok(meta)
    }

    /// Starts the machine of `name` alone (not its services), restoring
    /// the snapshot in `restore` instead of booting when given.
    pub(crate) async fn start_machine(
        &self,
        name: &str,
        timeout: Duration,
        mut progress: impl FnMut(StartProgress) + Send,
        restore: Option<&Path>,
    ) -> Result<Meta> {
        let started = Instant::now();
        self.launch_vmm(name, |_| {
            Ok(Boot {
                kind: match restore {
                    None => StartKind::Cold,
                    Some(_) => StartKind::Snapshot,
                },
                restore: restore.map(Path::to_path_buf),
                keep_warm: None,
                warm_held: None,
            })
        })?;
        self.wait_running(name, started, timeout, &mut progress)
            .await
    }

    /// Checks that `name` can start and launches its VMM process as `boot`
    /// (decided under the workspace's lock from its record) says.
    pub(crate) fn launch_vmm(
        &self,
        name: &str,
        boot: impl FnOnce(&Meta) -> Result<Boot>,
    ) -> Result<Boot> {
        let ws = self.dir(name)?;
        self.at(name).get_here()?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        match meta.state {
            State::Stopped | State::Crashed | State::Hibernated => {}
            State::Running => {
                return Err(Error::WrongState {
                    name: name.into(),
                    state: meta.state,
                    why: "it is already running",
                    remedy: None,
                })
            }
            state => {
                return Err(Error::WrongState {
                    name: name.into(),
                    state,
                    why: "it is between states",
                    remedy: Some(Remedy::WaitOrHalt {
                        workspace: name.into(),
                    }),
                })
            }
        }
        self.images.get(&meta.spec.image)?;
        base::network::attach::preflight(&self.state, &meta.spec)?;
        // The VMM reads it too, and would fall back to the default: a
        // broken setting is said here, where someone reads it.
        base::host::idle::IdleConfig::load(self.state.root()).map_err(|e| {
            Error::InvalidInput(format!(
                "{e} (in {}; fix or remove the `idle` object)",
                self.state
                    .root()
                    .join(base::host::settings::CONFIG_FILE)
                    .display()
            ))
        })?;
        // Held until this start is recorded as starting: two starts at
        // once cannot both take the budget's last place.
        let _budget = crate::host::budget::BudgetLock::take(self.state.root())?;
        self.check_budget_start(name, meta.spec.mem_mib)?;
        // Under the same lock: two starts cannot both take a volume.
        self.check_mountable(name, &meta.spec.volumes)?;
        let boot = boot(&meta)?;
        if meta.state == State::Hibernated && boot.kind != StartKind::Hibernation {
            // Hibernated meanwhile (an idle hibernation racing this start).
            return Err(Error::WrongState {
                name: name.into(),
                state: meta.state,
                why: "it is hibernated: `resume` restores it, `stop` discards it",
                remedy: None,
            });
        }
        let ttl_left = if boot.kind == StartKind::Hibernation {
            meta.leave_hibernation(now_ms())
        } else {
            // A machine left by a hibernation that did not finish, or by a
            // wake that failed, is of no use to this start.
            ws.remove_hibernation();
            None
        };
        // Groups a VMM running as its own account could not remove.
        base::host::cgroup::remove_recorded(ws.path());
        ws.clear_pending_identity();
        let log = std::fs::File::create(ws.path().join(VMM_LOG))
            .map_err(Error::host_io(format!("creating {VMM_LOG}")))?;
        let mut launch = VmmLaunch::new(
            &self.vmm_binary,
            self.state.root(),
            name,
            self.images.kernel_variant(),
        );
        if let Some(dir) = &boot.restore {
            launch = launch.restoring(dir);
        }
        if let Some(dir) = &boot.keep_warm {
            launch = launch.keeping_warm(dir);
        }
        if let Some(user) = base::vmm::user::for_state(self.state.root())? {
            user.hand_over_tree(ws.path())?;
            user.hand_over(&self.state.lock_path(name))?;
            if let Some(dir) = &boot.keep_warm {
                user.hand_over_tree(dir)?;
                if let Some(parent) = dir.parent() {
                    user.share(parent)?;
                }
            }
            launch = launch.as_user(user.uid, user.gid);
        }
        // The VMM cannot name its owner from a PID namespace of its own:
        // it gets a pidfd. An owner already gone is not watched.
        let owner = meta
            .spec
            .owner
            .and_then(|o| process::pidfd(o.pid, o.start_ticks));
        if owner.is_some() {
            launch = launch.watching_owner();
        }
        launch = launch.with_ticket(&ws.issue_launch_ticket()?);
        meta.state = meta.state.become_(State::Starting)?;
        meta.pristine = false;
        // A restore goes to a VMM process made ahead, when one waits.
        let standbys = match boot.restore {
            Some(_) if self.standby_vmms => standbys::kept(self.state.root()),
            _ => 0,
        };
        let launched_mono_ns = vmm_core::vcpu::monotonic_ns();
        let launch = launch.launched_at(launched_mono_ns);
        let claimed = (standbys > 0)
            .then(|| {
                standbys::claim(
                    self.state.root(),
                    &meta.spec,
                    &self.vmm_binary,
                    &launch,
                    &log,
                    owner.as_ref(),
                )
            })
            .flatten();
        let pid = match claimed {
            Some(pid) => pid,
            None => {
                let spawned =
                    launch
                        .spawn(&log, owner.as_ref())
                        .map_err(|e| Error::StartFailed {
                            name: name.into(),
                            reason: format!(
                                "the VMM process {} could not be started: {}",
                                self.vmm_binary.display(),
                                base::error_chain::error_chain(&e)
                            ),
                        })?;
                let pid = spawned.pid;
                // Reaped by a thread, so a long-lived caller collects no zombies.
                std::thread::spawn(move || process::reap(pid));
                pid
            }
        };
        let Some(pid_start) = process::start_ticks(pid) else {
            return Err(Error::StartFailed {
                name: name.into(),
                reason: format!(
                    "the VMM process exited at once; see {}",
                    ws.path().join(VMM_LOG).display()
                ),
            });
        };
        let now = now_ms();
        let mut runtime = Runtime::launched(
            pid,
            pid_start,
            now,
            ttl_left.unwrap_or_else(|| meta.spec.ttl_secs.map(|s| now + s * 1000)),
        );
        runtime.start_kind = Some(boot.kind);
        runtime.launched_mono_ns = Some(launched_mono_ns);
        meta.runtime = Some(runtime);
        if let Err(e) = ws.write_meta(&meta) {
            process::kill(pid, pid_start);
            return Err(e.into());
        }
        if standbys > 0 {
            standbys::refill_soon(
                self.state.root(),
                &self.vmm_binary,
                name,
                &meta.spec,
                standbys,
            );
        }
        Ok(boot)
    }

    /// Runs a synchronous (file-locking, possibly slow) call off the async
    /// runtime when there is one.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Workspaces) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ws = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(move || f(&ws))
                .await
                .map_err(|e| Error::BlockingStep(e.to_string()))?,
            Err(_) => f(&ws),
        }
    }

    /// Waits (until `timeout` after `started`) for a launched workspace to
    /// run, reporting progress about once a second; halts it on timeout.
    pub(crate) async fn wait_running(
        &self,
        name: &str,
        started: Instant,
        timeout: Duration,
        progress: &mut (impl FnMut(StartProgress) + Send),
    ) -> Result<Meta> {
        self.wait_until_running(name, started, timeout, progress, true)
            .await
    }

    /// [`Self::wait_running`]; on timeout it halts the workspace only with
    /// `halt_late`.
    pub(crate) async fn wait_until_running(
        &self,
        name: &str,
        started: Instant,
        timeout: Duration,
        progress: &mut (impl FnMut(StartProgress) + Send),
        halt_late: bool,
    ) -> Result<Meta> {
        base::pause_point::pause_point("start:waiting");
        let ws = self.dir(name)?;
        let mut last_report = Instant::now();
        loop {
            let meta = self.at(name).get_here()?;
            match meta.state {
                State::Running => return Ok(meta),
                State::Starting => {}
                _ => {
                    let reason = meta
                        .last_exit
                        .as_ref()
                        .map_or_else(|| format!("it is {}", meta.state), |e| e.reason.clone());
                    return Err(Error::StartFailed {
                        name: name.into(),
                        reason,
                    });
                }
            }
            if started.elapsed() > timeout {
                if !halt_late {
                    return Err(Error::Timeout(format!(
                        "workspace `{name}` did not answer within {} s; its restore goes on (call it again, or `stop` it)",
                        timeout.as_secs()
                    )));
                }
                self.at(name).halt()?;
                return Err(Error::StartTimedOut {
                    name: name.into(),
                    secs: timeout.as_secs(),
                });
            }
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                progress(StartProgress {
                    elapsed: started.elapsed(),
                    console: base::store::console_log::tail_lines(ws.path(), 1)
                        .ok()
                        .and_then(|mut l| l.pop()),
                });
            }
            // A warm start is ready within a few hundred ms: a coarse
            // look would add half its period to each; a boot takes tens of
            // seconds, which a fine look would only read the record through.
            let step = if started.elapsed() < Duration::from_secs(2) {
                25
            } else {
                200
            };
            tokio::time::sleep(Duration::from_millis(step)).await;
        }
    }
}

impl Workspace<'_> {
    /// Stops the workspace: the agent shuts the guest down; after `timeout`
    /// the VM is torn down. Stopping a stopped or crashed workspace does
    /// nothing.
    pub async fn stop(self, timeout: Duration) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Stop {
                    timeout_ms: crate::servers::millis(timeout),
                })
                .await?);
        }
        let (all, name) = (self.all, self.name.as_str());
        let ws = all.dir(name)?;
        let meta = self.get_here()?;
        if meta.state == State::Hibernated {
            return self.halt();
        }
        let Some(rt) = meta.runtime.clone().filter(|_| meta.state.has_vmm()) else {
            return Ok(meta);
        };
        let req = ControlRequest::Stop {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let asked = control::call(&ws.control(), &req, Duration::from_secs(5));
        if asked.is_err() {
            // A VMM that cannot take requests is torn down.
            return self.halt();
        }
        base::pause_point::pause_point("stop:asked");
        let deadline =
            base::host::settings::deadline_after(timeout.saturating_add(Duration::from_secs(10)));
        // Until its last thread is gone it may still hold a published port.
        while process::not_yet_gone(rt.pid, rt.pid_start) {
            if Instant::now() > deadline {
                return self.halt();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stopped = all.settle(name, "stopped on request")?;
        crate::services::halt_all(all, name, &stopped.spec);
        Ok(stopped)
    }
}

impl Workspaces {
    /// After the VMM is gone: records the end if it did not.
    fn settle(&self, name: &str, reason: &str) -> Result<Meta> {
        let ws = self.dir(name)?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        if meta.state == State::Hibernated {
            // It hibernated as the stop came: the stop wins.
            ws.record_hibernation_discarded(&mut meta, reason)?;
        } else if meta.state.has_vmm() {
            // A VMM killed after its guest stopped did not leave its group.
            base::host::cgroup::remove_recorded(ws.path());
            ws.record_exit(&mut meta, false, reason)?;
        }
        Ok(meta)
    }
}

impl Workspace<'_> {
    /// Stops its vCPUs: the guest keeps its memory and devices, answers
    /// nothing (commands wait), and goes on where it was at
    /// [`Workspace::resume`]. Its state stays `running`.
    pub fn pause(self) -> Result<()> {
        let (all, name) = (self.all, self.name.as_str());
        all.running(name)?;
        all.pause_or_resume(name, ControlRequest::Pause)
    }
}

impl Workspaces {
    /// Pauses or resumes (`request`) the machine of `name` (a pool member
    /// too).
    pub(crate) fn pause_or_resume(&self, name: &str, request: ControlRequest) -> Result<()> {
        let ws = self.dir(name)?;
        match control::call(&ws.control(), &request, Duration::from_secs(10))? {
            ControlResponse::Ok { .. } => Ok(()),
            other => Err(control::ControlError::Refused(format!(
                "workspace `{name}` did not take {request:?}: {other:?}"
            ))
            .into()),
        }
    }
}

impl Workspace<'_> {
    /// Tears the VM down at once (SIGKILL to its VMM). Guest writes not yet
    /// on the disk are lost.
    pub fn halt(self) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::Halt {})?);
        }
        let (all, name) = (self.all, self.name.as_str());
        self.get_here()?;
        let halted = {
            let (_lock, _) = all.lock_existing(name)?;
            all.halt_locked(name)?
        };
        crate::services::halt_all(all, name, &halted.spec);
        Ok(halted)
    }
}

impl Workspaces {
    fn halt_locked(&self, name: &str) -> Result<Meta> {
        let ws = self.dir(name)?;
        let mut meta = ws.read_meta()?;
        if meta.state == State::Hibernated {
            ws.record_hibernation_discarded(
                &mut meta,
                "stopped while hibernated (its memory discarded)",
            )?;
            return Ok(meta);
        }
        if !meta.state.has_vmm() {
            return Ok(meta);
        }
        if let Some(rt) = &meta.runtime {
            process::kill(rt.pid, rt.pid_start);
            if !process::wait_gone(rt.pid, rt.pid_start, Duration::from_secs(10)) {
                return Err(Error::Timeout(format!(
                    "VMM process {} did not die after SIGKILL",
                    rt.pid
                )));
            }
        }
        base::host::cgroup::remove_recorded(ws.path());
        ws.record_exit(&mut meta, false, "halted (VM torn down)")?;
        Ok(meta)
    }
}

impl Workspace<'_> {
    /// What a delete would remove, as `inspect` shows it; `None` for a
    /// name placed on a server that does not know it (a create cut short),
    /// which [`Self::delete`] only forgets. What a front end asks before a
    /// delete (a prompt, a preview, `check_delete`).
    pub fn before_delete(self) -> Result<Option<crate::workspaces::manager::WorkspaceInfo>> {
        match self.inspect() {
            Err(e) if e.code() == base::code::ErrorCode::NotFound && self.remote()?.is_some() => {
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// Deletes it and everything it has. A running one is refused
    /// unless `options.force`, which halts it first.
    pub fn delete(self, options: DeleteOptions) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            let call = crate::servers::WorkspaceCall::Delete {
                force: options.force,
            };
            let deleted = remote.call_blocking::<Meta>(call).map_err(Error::from);
            // Gone there (or never made: a create cut off after its
            // placement): nothing of it is kept here.
            let gone = match &deleted {
                Ok(_) => true,
                Err(e) => e.code() == base::code::ErrorCode::NotFound,
            };
            if gone {
                let servers = self.all.servers();
                servers.unforward_all(self.name())?;
                servers.unplace(self.name())?;
            }
            return deleted;
        }
        let (all, name) = (self.all, self.name.as_str());
        let ws = all.dir(name)?;
        self.get_here()?;
        let (lock, meta) = all.lock_existing(name)?;
        meta.check_delete(options)?;
        if meta.state.has_vmm() {
            all.halt_locked(name)?;
        }
        // Its services first, under its lock (a delete cut short leaves a
        // workspace that still names them); one that cannot go is named.
        crate::services::delete_all(all, name, &meta.spec)?;
        base::network::attach::remove_tap(&all.state, &meta.spec);
        // Its previews open nothing any more.
        let _ = base::store::previews::PreviewStore::new(&all.state)
            .remove_where(|r| r.workspace == name);
        // Whatever group a killed VMM left behind goes with it.
        base::host::cgroup::remove_recorded(ws.path());
        // Gone from every listing at once; a delete killed while removing
        // leaves a directory the next listing sweeps.
        let doomed = ws.path().with_file_name(format!(
            "{}{name}-{}",
            base::store::DELETING_PREFIX,
            std::process::id()
        ));
        std::fs::rename(ws.path(), &doomed)
            .map_err(Error::host_io(format!("removing {}", ws.path().display())))?;
        base::pause_point::pause_point("delete:renamed");
        std::fs::remove_dir_all(&doomed)
            .map_err(Error::host_io(format!("removing {}", doomed.display())))?;
        all.state.remove_lock(name, lock)?;
        // Its kept outputs go with it (a one-shot's stay until their
        // TTL), and any past their TTL with them.
        match base::store::kept_outputs::KeptOutputs::new(all.state.root()) {
            Ok(kept) => {
                if !options.keep_outputs {
                    if let Err(e) = kept.remove_workspace(name) {
                        tracing::warn!("removing the kept outputs of {name}: {e}");
                    }
                }
                kept.sweep();
            }
            Err(e) => tracing::warn!("kept outputs not swept: {e}"),
        }
        Ok(meta)
    }

    /// Deletes the workspace when it was to go with its owner and the owner
    /// has ended (an MCP server killed before it could clean up); true when
    /// it went.
    pub(crate) fn delete_if_orphaned(self, meta: &Meta) -> bool {
        let Some(owner) = meta.spec.owner.filter(|_| meta.spec.delete_with_owner) else {
            return false;
        };
        if process::is_alive(owner.pid, owner.start_ticks) {
            return false;
        }
        match self.delete(DeleteOptions::default().force(true)) {
            Ok(_) => {
                tracing::info!(
                    "deleted workspace {}: the process it lived for ({}) has ended",
                    meta.name,
                    owner.pid
                );
                true
            }
            Err(e) => {
                tracing::warn!("deleting workspace {} of an ended owner: {e}", meta.name);
                false
            }
        }
    }

    /// Sets the TTL (seconds from each start; from now if it is running),
    /// or removes it.
    pub fn set_ttl(self, ttl_secs: Option<u64>) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::SetTtl { ttl_secs })?);
        }
        let (all, name) = (self.all, self.name.as_str());
        if let Some(ttl) = ttl_secs {
            all.limits.check_ttl(ttl)?;
        }
        let ws = all.dir(name)?;
        let meta = self.get_here()?;
        if meta.state.has_vmm() {
            let req = ControlRequest::SetTtl { ttl_secs };
            match control::call(&ws.control(), &req, Duration::from_secs(5))? {
                ControlResponse::Ok { .. } => {}
                other => {
                    return Err(Error::InvalidInput(format!(
                        "unexpected answer from the VMM: {other:?}"
                    )))
                }
            }
        }
        let (_lock, mut meta) = all.lock_existing(name)?;
        meta.spec.ttl_secs = ttl_secs;
        // A hibernated one's TTL counts from its wake.
        if let Some(h) = meta.hibernation.as_mut() {
            h.ttl_left_ms = ttl_secs.map(|s| s.saturating_mul(1000));
        }
        ws.write_meta(&meta)?;
        Ok(meta)
    }

    /// Extends the TTL by `by_secs`: a running workspace's deadline moves
    /// that much later, and the TTL of later starts grows by as much (a
    /// workspace without a TTL gets one of `by_secs`, from now if it runs).
    pub fn extend_ttl(self, by_secs: u64) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::ExtendTtl { by_secs })?);
        }
        let (all, name) = (self.all, self.name.as_str());
        if by_secs == 0 {
            return Err(Error::InvalidInput("extend the TTL by at least 1 s".into()));
        }
        let meta = self.get_here()?;
        let per_start = meta
            .spec
            .ttl_secs
            .map_or(by_secs, |t| t.saturating_add(by_secs));
        all.limits.check_ttl(per_start)?;
        let deadline = meta.runtime.as_ref().and_then(|r| r.ttl_deadline_ms);
        let left = match &meta.hibernation {
            // What was left of it, which its wake goes on with.
            Some(h) => h.ttl_left_ms.unwrap_or(0) / 1000,
            None if !meta.state.has_vmm() => return self.set_ttl(Some(per_start)),
            None => deadline.map_or(0, |at| at.saturating_sub(now_ms()) / 1000),
        };
        let running = left.saturating_add(by_secs);
        all.limits.check_ttl(running)?;
        self.set_ttl(Some(running))?;
        let ws = all.dir(name)?;
        let (_lock, mut meta) = all.lock_existing(name)?;
        meta.spec.ttl_secs = Some(per_start);
        ws.write_meta(&meta)?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use crate::workspaces::manager::tests::{fixture, have_mkfs, spec};
    use base::store::kept_outputs::{KeptOutputs, OUTPUTS_DIR};
    use base::store::spec::DeleteOptions;

    #[test]
    fn kept_outputs_go_with_their_workspace_unless_kept() {
        if !have_mkfs("kept_outputs_go_with_their_workspace_unless_kept") {
            return;
        }
        let f = fixture("kept-outputs", "/nonexistent");
        let root = f.ws.state_dir().root().to_owned();
        let kept = KeptOutputs::new(&root).unwrap();
        for name in ["dev", "once", "other"] {
            f.ws.create(name, spec()).unwrap();
            let mut call = kept.begin(name);
            let path = call.path_for("0-out.bin").unwrap();
            std::fs::write(&path, [1u8; 8192]).unwrap();
            call.add(&path).unwrap();
            call.finish().unwrap();
        }
        f.ws.at("dev").delete(DeleteOptions::default()).unwrap();
        assert!(!kept.workspace_dir("dev").exists(), "gone with it");
        // A one-shot's stay for its caller, until their TTL.
        f.ws.at("once")
            .delete(DeleteOptions::default().keep_outputs(true))
            .unwrap();
        assert!(kept.workspace_dir("once").exists(), "a one-shot's stay");
        assert!(kept.workspace_dir("other").exists(), "others' stay");
        // A delete sweeps what is past its TTL: with a TTL of 0, everything.
        std::fs::write(
            root.join(base::host::settings::CONFIG_FILE),
            r#"{"outputs": {"ttl_secs": 0}}"#,
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        f.ws.at("other")
            .delete(DeleteOptions::default().keep_outputs(true))
            .unwrap();
        assert_eq!(
            base::test_support::visible_entries(&root.join(OUTPUTS_DIR)),
            0,
            "the one-shot's went at its TTL"
        );
    }
}
