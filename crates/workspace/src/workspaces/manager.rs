//! Workspace life cycle: create, start, stop, halt, delete, list, inspect,
//! TTL changes, and crash detection. Every change to a workspace happens
//! under its lock; the running VMM process records its own state changes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::host::settings::{host_tool, now_ms};
use crate::images::registry::{ImageInfo, ImageRegistry};
use crate::remedy::Remedy;
use crate::store::events::EventKind;
use crate::store::process;
use crate::store::spec::{DeleteOptions, Limits, Meta, Runtime, StartKind, WorkspaceSpec, LIMITS};
use crate::store::state::State;
use crate::store::workspace_dir::{WorkspaceDir, WorkspaceDirError, VMM_LOG};
use crate::store::{StateDir, WorkspaceLock};
use crate::vmm::control::{self, ControlRequest, ControlResponse};
use crate::vmm::launch::VmmLaunch;
use vmm_core::KernelVariant;

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

/// `inspect`: the record plus what is known live.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WorkspaceInfo {
    /// The record.
    #[serde(flatten)]
    pub meta: Meta,
    /// The workspace directory.
    pub dir: PathBuf,
    /// Milliseconds since creation.
    pub age_ms: u64,
    /// Milliseconds since the current run started (null when no VMM runs).
    pub uptime_ms: Option<u64>,
    /// Host bytes the writable disk uses.
    pub disk_used_bytes: u64,
    /// The guest's network as it is now (null on `none`, or when the
    /// network's record is gone).
    #[serde(default)]
    pub network: Option<crate::network::GuestNetwork>,
}

/// Filters for `list`.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<State>,
    /// Only this image.
    pub image: Option<String>,
    /// Only workspaces with all these labels.
    pub labels: Vec<(String, String)>,
}

/// The workspaces of one state directory.
///
/// # Blocking
///
/// The synchronous methods do file I/O under a per-workspace lock (`flock`),
/// so any of them may wait while another caller, in this process or another,
/// changes the same workspace. Some take seconds even uncontended:
///
/// - [`create`](Self::create) formats the writable disk (`mkfs.ext4`);
/// - [`halt`](Self::halt) waits up to 10 s for the VMM process to die;
/// - [`delete`](Self::delete) halts a running workspace first (with
///   `force`), then removes its directory and disk;
/// - [`set_ttl`](Self::set_ttl) asks a running VMM over its control socket
///   (up to 5 s);
/// - [`remove_image`](Self::remove_image) and the image imports of
///   [`images`](Self::images) remove or copy image files;
/// - [`new`](Self::new) and [`from_env`](Self::from_env) may run a short KVM
///   probe to pick the kernel variant.
///
/// [`get`](Self::get), [`list`](Self::list), [`inspect`](Self::inspect) and
/// `logs` read small files and return quickly when no lock is held.
///
/// An async caller runs the synchronous methods with
/// `tokio::task::spawn_blocking`, as the MCP server does. The async methods
/// wait with `tokio::time::sleep` and talk to the guest agent
/// asynchronously, but run their own quick synchronous steps inline; two
/// can still block their task for long: [`stop`](Self::stop) falls back to
/// [`halt`](Self::halt) when the guest does not shut down in time, and
/// [`start`](Self::start) halts a VM that did not boot within its timeout.
/// `copy_in` builds the archive of a host directory in memory before
/// sending it.
#[derive(Clone, Debug)]
pub struct Workspaces {
    state: StateDir,
    images: ImageRegistry,
    /// The asset directory built images are imported from.
    assets: Option<PathBuf>,
    vmm_binary: PathBuf,
    /// What `create` and `set_ttl` accept.
    limits: Limits,
}

/// The kernel variant built images are imported with: the one built, or
/// when both are, the one this host needs.
fn kernel_variant(assets: Option<&PathBuf>) -> KernelVariant {
    let has = |v: KernelVariant| assets.is_some_and(|a| a.join(v.vmlinux_file()).exists());
    match (has(KernelVariant::Compat), has(KernelVariant::Standard)) {
        (true, false) => KernelVariant::Compat,
        // No built kernel: no built image to import, nothing to choose.
        (false, _) => KernelVariant::Standard,
        // Both: ask the host (a short KVM probe).
        (true, true) => vmm_core::host::probe()
            .map(|p| p.kernel_variant())
            .unwrap_or(KernelVariant::Standard),
    }
}

impl Workspaces {
    /// Workspaces in `state`, built images from `assets`, VMM processes run
    /// as `vmm_binary vmm serve-workspace`.
    pub fn new(state: StateDir, assets: Option<PathBuf>, vmm_binary: PathBuf) -> Self {
        let variant = kernel_variant(assets.as_ref());
        let images = ImageRegistry::new(&state, assets.clone(), variant);
        Self {
            state,
            images,
            assets,
            vmm_binary,
            limits: LIMITS,
        }
    }

    /// The same, accepting only specs within `limits`.
    pub(crate) fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits `create` and `set_ttl` check against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The asset directory these workspaces were built with (where
    /// `cargo xtask setup` puts kernels and built images), if any: what
    /// `doctor` checks.
    pub fn assets(&self) -> Option<&Path> {
        self.assets.as_deref()
    }

    /// The state directory.
    pub fn state_dir(&self) -> &StateDir {
        &self.state
    }

    /// The image registry.
    pub fn images(&self) -> &ImageRegistry {
        &self.images
    }

    pub(crate) fn dir(&self, name: &str) -> Result<WorkspaceDir> {
        Ok(WorkspaceDir::new(&self.state, name)?)
    }

    fn lock(&self, name: &str) -> Result<WorkspaceLock> {
        Ok(self.state.lock_workspace(name)?)
    }

    /// Takes the lock of an existing workspace and reads its record. If it
    /// was deleted meanwhile, the lock file this made is removed again.
    pub(crate) fn lock_existing(&self, name: &str) -> Result<(WorkspaceLock, Meta)> {
        let lock = self.lock(name)?;
        match self.dir(name)?.read_meta() {
            Ok(meta) => Ok((lock, meta)),
            Err(e @ WorkspaceDirError::NotFound(_)) => {
                let _ = self.state.remove_lock(name, lock);
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Workspaces that use image `name`.
    pub fn image_users(&self, image: &str) -> Result<Vec<String>> {
        Ok(self
            .list(&ListFilter {
                image: Some(image.to_owned()),
                ..ListFilter::default()
            })?
            .into_iter()
            .map(|m| m.name)
            .collect())
    }

    /// Removes image `name` unless a workspace uses it.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        self.delete_image(name, false).map(drop)
    }

    /// Removes image `name` unless a workspace uses it (CONFLICT naming
    /// them); with `preview` it only checks. Returns what goes.
    pub fn delete_image(&self, name: &str, preview: bool) -> Result<ImageInfo> {
        let info = self.images.get(name)?;
        let users = self.image_users(name)?;
        if preview && users.is_empty() {
            return Ok(info);
        }
        self.images.remove(name, users)?;
        Ok(info)
    }

    /// Creates a stopped workspace with its writable disk.
    pub fn create(&self, name: &str, spec: WorkspaceSpec) -> Result<Meta> {
        let ws = self.dir(name)?;
        spec.validate_within(&self.limits)?;
        self.check_budget_disk()?;
        ws.check_socket_paths()?;
        crate::network::ports::check_free(&spec.ports)?;
        let image: ImageInfo = self.images.get(&spec.image)?;
        let (_network, spec) = self.place_on_network(spec)?;
        let lock = self.lock(name)?;
        if ws.meta_path().exists() {
            return Err(Error::WorkspaceExists(name.to_owned()));
        }
        // A directory without metadata is a create that died half-way.
        let _ = std::fs::remove_dir_all(ws.path());
        let made = (|| {
            std::fs::create_dir_all(ws.path())
                .map_err(Error::host_io(format!("creating {}", ws.path().display())))?;
            make_disk(&ws.disk(), spec.disk_mib)?;
            crate::pause_point::pause_point("create:disk");
            let meta = Meta {
                name: name.to_owned(),
                spec: spec.with_image(image),
                created_at_ms: now_ms(),
                state: State::Stopped,
                runtime: None,
                last_exit: None,
                pristine: true,
            };
            ws.write_meta(&meta)?;
            ws.events().append(EventKind::Created)?;
            Ok(meta)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(ws.path());
            let _ = self.state.remove_lock(name, lock);
        }
        made
    }

    /// Reads a workspace, first recording a crash if its VMM died.
    pub fn get(&self, name: &str) -> Result<Meta> {
        let ws = self.dir(name)?;
        let meta = ws.read_meta()?;
        if !vmm_died(&meta) {
            return Ok(meta);
        }
        let (_lock, mut meta) = self.lock_existing(name)?;
        if vmm_died(&meta) {
            let pid = meta.runtime.as_ref().map_or(0, |r| r.pid);
            let reason = match crate::vmm_process::guard::seccomp_violation(&ws) {
                Some(what) => {
                    format!("its VMM process {pid} was killed by its seccomp filter: {what}")
                }
                None => format!("its VMM process {pid} died unexpectedly (killed or crashed)"),
            };
            crate::vmm_process::cgroup::remove_recorded(ws.path());
            ws.record_exit(&mut meta, true, &reason)?;
        }
        Ok(meta)
    }

    /// Every workspace that matches `filter`, by name.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<Meta>> {
        self.state.sweep_abandoned();
        let mut out = Vec::new();
        for name in self.state.list_workspaces()? {
            let meta = match self.get(&name) {
                Ok(m) => m,
                // Deleted while listing.
                Err(Error::WorkspaceNotFound(_)) => continue,
                // One damaged record does not hide the others; `inspect`
                // names the damage.
                Err(Error::Store(e @ crate::store::StoreError::Parse { .. })) => {
                    tracing::warn!("skipping workspace `{name}`: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let keep = filter.state.is_none_or(|s| s == meta.state)
                && filter.image.as_ref().is_none_or(|i| *i == meta.spec.image)
                && filter
                    .labels
                    .iter()
                    .all(|(k, v)| meta.spec.labels.get(k) == Some(v));
            if keep {
                out.push(meta);
            }
        }
        Ok(out)
    }

    /// The record plus ages and disk use.
    pub fn inspect(&self, name: &str) -> Result<WorkspaceInfo> {
        let meta = self.get(name)?;
        let ws = self.dir(name)?;
        let now = now_ms();
        let disk_used_bytes = std::fs::metadata(ws.disk())
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        Ok(WorkspaceInfo {
            age_ms: now.saturating_sub(meta.created_at_ms),
            uptime_ms: meta
                .runtime
                .as_ref()
                .map(|r| now.saturating_sub(r.started_at_ms)),
            dir: ws.path().to_owned(),
            disk_used_bytes,
            network: self.guest_network(&meta),
            meta,
        })
    }

    /// Starts the workspace's VMM and waits (at most `timeout`) for the
    /// agent, reporting progress about once a second. A workspace never
    /// started before resumes its image's warm snapshot when there is a
    /// usable one (no boot), and otherwise boots and keeps one.
    pub async fn start(
        &self,
        name: &str,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.start_maybe_warm(name, timeout, progress, false).await
    }

    /// [`Workspaces::start`] that always boots the kernel (no warm snapshot
    /// is used or kept).
    pub async fn start_cold(
        &self,
        name: &str,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.start_maybe_warm(name, timeout, progress, true).await
    }

    /// [`Workspaces::start`], restoring the snapshot in `restore` (whose
    /// writable disk the workspace's disk is a copy of) instead of booting.
    pub(crate) async fn start_from(
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
        self.get(name)?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        match meta.state {
            State::Stopped | State::Crashed => {}
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
        crate::network::attach::preflight(&self.state, &meta.spec)?;
        // Held until this start is recorded as starting: two starts at
        // once cannot both take the budget's last place.
        let _budget = crate::host::budget::BudgetLock::take(self.state.root())?;
        self.check_budget_start(name, meta.spec.mem_mib)?;
        let boot = boot(&meta)?;
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
        launch = launch.with_ticket(&ws.issue_launch_ticket()?);
        let mut cmd = launch.command();
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        // No pre_exec step (the VMM leaves this session itself), so the
        // standard library spawns with posix_spawn, not a fork of this
        // process: a restore's launch is part of its time to running.
        meta.state = meta.state.become_(State::Starting)?;
        meta.pristine = false;
        let launched_mono_ns = vmm_core::vcpu::monotonic_ns();
        let child = cmd.spawn().map_err(Error::host_io(format!(
            "starting the VMM process {}",
            self.vmm_binary.display()
        )))?;
        let pid = child.id();
        // Reaped by a thread, so a long-lived caller collects no zombies.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
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
        meta.runtime = Some(Runtime {
            pid,
            pid_start,
            started_at_ms: now,
            ready_at_ms: None,
            ttl_deadline_ms: meta.spec.ttl_secs.map(|s| now + s * 1000),
            start_kind: Some(boot.kind),
            launched_mono_ns: Some(launched_mono_ns),
            vcpu_running_us: None,
            protections: Vec::new(),
            ready_us: None,
        });
        if let Err(e) = ws.write_meta(&meta) {
            process::kill(pid, pid_start);
            return Err(e.into());
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
        crate::pause_point::pause_point("start:waiting");
        let ws = self.dir(name)?;
        let mut last_report = Instant::now();
        loop {
            let meta = self.get(name)?;
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
                self.halt(name)?;
                return Err(Error::StartTimedOut {
                    name: name.into(),
                    secs: timeout.as_secs(),
                });
            }
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                progress(StartProgress {
                    elapsed: started.elapsed(),
                    console: crate::store::console_log::tail_lines(ws.path(), 1)
                        .ok()
                        .and_then(|mut l| l.pop()),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the workspace: the agent shuts the guest down; after `timeout`
    /// the VM is torn down. Stopping a stopped or crashed workspace does
    /// nothing.
    pub async fn stop(&self, name: &str, timeout: Duration) -> Result<Meta> {
        let ws = self.dir(name)?;
        let meta = self.get(name)?;
        let Some(rt) = meta.runtime.clone().filter(|_| meta.state.has_vmm()) else {
            return Ok(meta);
        };
        let req = ControlRequest::Stop {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let asked = control::call(&ws.control(), &req, Duration::from_secs(5));
        if asked.is_err() {
            // A VMM that cannot take requests is torn down.
            return self.halt(name);
        }
        crate::pause_point::pause_point("stop:asked");
        let deadline =
            crate::host::settings::deadline_after(timeout.saturating_add(Duration::from_secs(10)));
        // Until its last thread is gone it may still hold a published port.
        while process::not_yet_gone(rt.pid, rt.pid_start) {
            if Instant::now() > deadline {
                return self.halt(name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.settle(name, "stopped on request")
    }

    /// After the VMM is gone: records the end if it did not.
    fn settle(&self, name: &str, reason: &str) -> Result<Meta> {
        let ws = self.dir(name)?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        if meta.state.has_vmm() {
            // A VMM killed after its guest stopped did not leave its group.
            crate::vmm_process::cgroup::remove_recorded(ws.path());
            ws.record_exit(&mut meta, false, reason)?;
        }
        Ok(meta)
    }

    /// Tears the VM down at once (SIGKILL to its VMM). Guest writes not yet
    /// on the disk are lost.
    pub fn halt(&self, name: &str) -> Result<Meta> {
        self.get(name)?;
        let (_lock, _) = self.lock_existing(name)?;
        self.halt_locked(name)
    }

    fn halt_locked(&self, name: &str) -> Result<Meta> {
        let ws = self.dir(name)?;
        let mut meta = ws.read_meta()?;
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
        crate::vmm_process::cgroup::remove_recorded(ws.path());
        ws.record_exit(&mut meta, false, "halted (VM torn down)")?;
        Ok(meta)
    }

    /// Deletes a workspace and everything it has. A running one is refused
    /// unless `options.force`, which halts it first.
    pub fn delete(&self, name: &str, options: DeleteOptions) -> Result<Meta> {
        let ws = self.dir(name)?;
        self.get(name)?;
        let (lock, meta) = self.lock_existing(name)?;
        meta.check_delete(options)?;
        if meta.state.has_vmm() {
            self.halt_locked(name)?;
        }
        crate::network::attach::remove_tap(&self.state, &meta.spec);
        // Whatever group a killed VMM left behind goes with it.
        crate::vmm_process::cgroup::remove_recorded(ws.path());
        // Gone from every listing at once; a delete killed while removing
        // leaves a directory the next listing sweeps.
        let doomed = ws.path().with_file_name(format!(
            "{}{name}-{}",
            crate::store::DELETING_PREFIX,
            std::process::id()
        ));
        std::fs::rename(ws.path(), &doomed)
            .map_err(Error::host_io(format!("removing {}", ws.path().display())))?;
        crate::pause_point::pause_point("delete:renamed");
        std::fs::remove_dir_all(&doomed)
            .map_err(Error::host_io(format!("removing {}", doomed.display())))?;
        self.state.remove_lock(name, lock)?;
        Ok(meta)
    }

    /// Sets the TTL (seconds from each start; from now if it is running),
    /// or removes it.
    pub fn set_ttl(&self, name: &str, ttl_secs: Option<u64>) -> Result<Meta> {
        if let Some(ttl) = ttl_secs {
            self.limits.check_ttl(ttl)?;
        }
        let ws = self.dir(name)?;
        let meta = self.get(name)?;
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
        let (_lock, mut meta) = self.lock_existing(name)?;
        meta.spec.ttl_secs = ttl_secs;
        ws.write_meta(&meta)?;
        Ok(meta)
    }
}

impl Workspaces {
    /// Extends the TTL by `by_secs`: a running workspace's deadline moves
    /// that much later, and the TTL of later starts grows by as much (a
    /// workspace without a TTL gets one of `by_secs`, from now if it runs).
    pub fn extend_ttl(&self, name: &str, by_secs: u64) -> Result<Meta> {
        if by_secs == 0 {
            return Err(Error::InvalidInput("extend the TTL by at least 1 s".into()));
        }
        let meta = self.get(name)?;
        let per_start = meta
            .spec
            .ttl_secs
            .map_or(by_secs, |t| t.saturating_add(by_secs));
        self.limits.check_ttl(per_start)?;
        let deadline = meta.runtime.as_ref().and_then(|r| r.ttl_deadline_ms);
        if !meta.state.has_vmm() {
            return self.set_ttl(name, Some(per_start));
        }
        let left = deadline.map_or(0, |at| at.saturating_sub(now_ms()) / 1000);
        let running = left.saturating_add(by_secs);
        self.limits.check_ttl(running)?;
        self.set_ttl(name, Some(running))?;
        let ws = self.dir(name)?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        meta.spec.ttl_secs = Some(per_start);
        ws.write_meta(&meta)?;
        Ok(meta)
    }
}

/// True when the record expects a VMM that is no longer there.
fn vmm_died(meta: &Meta) -> bool {
    meta.state.has_vmm()
        && meta
            .runtime
            .as_ref()
            .is_none_or(|rt| !process::is_alive(rt.pid, rt.pid_start))
}

/// A sparse file of `mib` MiB formatted ext4.
pub(crate) fn make_disk(path: &Path, mib: u64) -> Result<()> {
    let file = std::fs::File::create(path)
        .map_err(Error::host_io(format!("creating {}", path.display())))?;
    file.set_len(mib << 20)
        .map_err(Error::host_io(format!("sizing {}", path.display())))?;
    let mkfs = host_tool("mkfs.ext4").ok_or_else(|| {
        Error::HostUnsupported(
            "mkfs.ext4 is not installed; install e2fsprogs (apt-get install e2fsprogs)".into(),
        )
    })?;
    let out = Command::new(mkfs)
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
        ])
        .arg(path)
        .output()
        .map_err(Error::host_io("running mkfs.ext4"))?;
    if !out.status.success() {
        return Err(Error::HostIo {
            what: format!("mkfs.ext4 {}", path.display()),
            source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
