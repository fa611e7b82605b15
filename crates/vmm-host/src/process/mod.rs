//! The detached VMM process of one running workspace, as a library: boots
//! the guest, marks the workspace running when the agent answers, serves
//! the control socket, enforces the TTL, and records how the run ended. It
//! owns the workspace's state while it lives. The process itself (its
//! `main`, signals, exit status) belongs to the program that runs it
//! ([`base::vmm::launch::VmmLaunch`] says how it is started).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Result, VmmProcessError};
use base::host::settings::now_ms;
use base::store::console_log::tail_lines;
use base::store::events::EventKind;
use base::store::ports::PortMapping;
use base::store::state::State;
use base::store::workspace_dir::{WorkspaceDir, AGENT_PORT};
use base::store::StateDir;
use base::vmm::control;
use base::vmm::launch::VmmLaunch;
use guest_agent::client::blocking::BlockingClient;
use vmm_core::machine::MachineHandle;
use vmm_core::{Machine, StopReason};

mod answers;
mod hibernate;
mod idle;
mod listeners;
mod memory;
mod record;

use crate::build::Built;
use crate::port_forward::PortForwarder;

/// Grace period a TTL expiry gives the guest to shut down.
const TTL_GRACE: Duration = Duration::from_secs(10);
/// How long a guest whose owner process ended gets to shut down.
const OWNER_GRACE: Duration = Duration::from_secs(2);

struct Shared {
    ws: WorkspaceDir,
    /// The machine was restored from a snapshot: the guest gets a fresh
    /// identity once its agent answers.
    restored: bool,
    /// The guest's addresses on its network (a restored guest takes them).
    guest_net: Option<base::network::Addressing>,
    /// Where to keep the image's warm snapshot once the agent answers.
    keep_warm: Option<std::path::PathBuf>,
    /// The named volumes the guest mounts before it counts as running.
    volumes: Vec<guest_agent::protocol::VolumeToMount>,
    state: StateDir,
    started: Instant,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// Why the stop under way was started.
    stop_reason: Mutex<Option<&'static str>>,
    /// Unix ms of the TTL deadline; the condvar wakes the TTL thread on change.
    ttl_deadline: Mutex<Option<u64>>,
    ttl_changed: Condvar,
    /// The published ports' listeners.
    ports: PortForwarder,
    /// The `user` network's egress filter.
    egress: Option<crate::egress::EgressControl>,
    /// Set by whoever records the end first.
    finished: AtomicBool,
    /// Controls the machine's run (teardown, snapshots), once it exists.
    machine: OnceLock<MachineHandle>,
    /// The confinement in force, recorded with `running` (a write with
    /// its fsyncs before the guest runs would delay it).
    protections: Mutex<Vec<String>>,
    /// The machine's balloon, once it exists.
    balloon: OnceLock<vmm_core::devices::virtio::balloon::BalloonHandle>,
    /// Paused (idle, or on request: a pool member waiting): its agent
    /// cannot answer.
    paused: AtomicBool,
    /// Paused because it was idle: the next arrival resumes it.
    idle_paused: AtomicBool,
    /// Held across a pause or resume and its flags.
    transition: Mutex<()>,
    /// Host programs arriving at the vsock socket (what wakes an idle
    /// pause), once the machine exists.
    arrivals: OnceLock<Arc<vmm_core::devices::virtio::vsock::HostArrivals>>,
    /// When the idle guest drops its caches, pauses and hibernates.
    idle: idle::IdlePolicy,
    /// It may hibernate (`WorkspaceSpec::may_hibernate`).
    can_hibernate: bool,
    /// A hibernation is being written.
    hibernating: AtomicBool,
}

impl Shared {
    /// Updates meta.json under the workspace lock.
    fn update(&self, f: impl FnOnce(&mut base::store::spec::Meta) -> Result<()>) -> Result<()> {
        let _lock = self.state.lock_workspace(self.ws.name())?;
        let mut meta = self.ws.read_meta()?;
        f(&mut meta)?;
        Ok(self.ws.write_meta(&meta)?)
    }

    /// Records the end of the run once; later calls do nothing.
    fn finish(&self, crashed: bool, reason: &str) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!(%reason, "run ended");
        let result = (|| {
            let _lock = self.state.lock_workspace(self.ws.name())?;
            let mut meta = self.ws.read_meta()?;
            if !meta.state.has_vmm() {
                return Ok(());
            }
            Ok::<(), VmmProcessError>(self.ws.record_exit(&mut meta, crashed, reason)?)
        })();
        if let Err(e) = result {
            tracing::error!(error = %e.full_message(), "could not record the end");
        }
    }

    /// Ends the run at once; nothing happens before the machine exists.
    fn tear_down(&self) {
        if let Some(handle) = self.machine.get() {
            handle.stop();
        }
    }

    /// Starts a stop: asks the agent to shut the guest down, and tears the
    /// VM down if it has not gone after `grace`.
    fn begin_stop(self: &Arc<Self>, grace: Duration, reason: &'static str) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.stop_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        let _ = self.update(|m| {
            if m.state == State::Starting || m.state == State::Running {
                m.state = m.state.become_(State::Stopping)?;
            }
            Ok(())
        });
        self.ttl_changed.notify_all();
        let shared = self.clone();
        std::thread::spawn(move || {
            if shared.ready.load(Ordering::SeqCst) {
                let asked = shared
                    .ws
                    .agent_blocking(crate::guest_ready::AGENT_CALL_TIMEOUT)
                    .and_then(BlockingClient::shutdown);
                if let Err(e) = asked {
                    tracing::warn!(error = %e, "agent shutdown failed");
                } else {
                    std::thread::sleep(grace);
                }
            }
            shared.finish(
                false,
                &format!("{reason} (VM torn down after the grace period)"),
            );
            shared.tear_down();
        });
    }
}

/// The VMM of one workspace in this process: checked against the
/// workspace's record and built, its guest not yet running.
#[derive(Debug)]
pub struct VmmProcess {
    shared: Arc<Shared>,
    /// None when the VM could not be built (the end is already recorded).
    machine: Option<Machine>,
    /// The listeners of the spec's published ports, bound in the host's
    /// network namespace and served once the process is confined.
    listeners: Vec<(PortMapping, std::net::TcpListener)>,
    /// A service's relay sockets (`relay/<port>.sock`), bound before the
    /// confinement.
    relays: Vec<(u16, std::os::unix::net::UnixListener)>,
    /// The `user` network's passt, ended with the run.
    passt: Option<base::network::Passt>,
    /// A pidfd of the process this workspace lives for, if any.
    owner: Option<std::os::fd::OwnedFd>,
    /// The account to run as once the machine is built (root only).
    user: Option<(u32, u32)>,
    /// Its disk and memory sizes in MiB (the largest files it writes).
    disk_and_mem_mib: (u64, u64),
    /// Its cgroup, joined before the guest was built.
    cgroup: base::host::cgroup::Placement,
    /// Its own mount namespace, or why it has none (`vmm_jail`).
    mount_ns: std::result::Result<Option<base::host::jail::RootAhead>, String>,
    /// Its own empty network namespace, or why it has none.
    net_ns: std::result::Result<(), String>,
    /// When its starter launched it (monotonic ns), for the log's times.
    launched_mono_ns: Option<u64>,
    /// The record names this process already (else `run` checks it before
    /// the guest runs).
    record_checked: bool,
    /// Seccomp filters a standby compiled ahead.
    filters_ahead: Option<vmm_core::seccomp::Filters>,
}

/// Stops a [`VmmProcess`] from another thread (the program's signal
/// handling): the first call stops gracefully, as a stop request does; a
/// call while stopping tears the VM down at once.
#[derive(Clone, Debug)]
pub struct VmmStopper {
    shared: Arc<Shared>,
}

impl VmmStopper {
    /// Stops the workspace for `reason` (recorded as how the run ended).
    pub fn stop(&self, reason: &'static str) {
        if self.shared.stopping.load(Ordering::SeqCst) {
            self.shared
                .finish(false, &format!("{reason} (while stopping: VM torn down)"));
            self.shared.tear_down();
        } else {
            self.shared.begin_stop(TTL_GRACE, reason);
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("workspace", &self.ws.name())
            .finish_non_exhaustive()
    }
}

impl VmmProcess {
    /// Builds the VM of the workspace `launch` names with the kernel
    /// variant the starter chose, or restores it from the snapshot the
    /// launch names. Whether this process was started for it is checked
    /// first, or, with the starter's ticket, by [`VmmProcess::run`] before
    /// the guest runs. A VM that cannot be built is recorded as a crash
    /// (on a record naming this process), and [`VmmProcess::run`] then
    /// returns at once.
    ///
    /// The process first leaves its starter's session, so it outlives the
    /// terminal and the starter and no terminal signal reaches it (the
    /// starter spawns it without a pre-exec step, which keeps the launch
    /// fast).
    pub fn prepare(state: StateDir, launch: &VmmLaunch) -> Result<Self> {
        let entered = vmm_core::vcpu::monotonic_ns();
        crate::guard::leave_starter(launch.owner_fd);
        Self::prepare_on(state, launch, None, entered)
    }

    /// As [`VmmProcess::prepare`], for a standby process that took
    /// `launch` (`crate::standby`): it left its starter when it started,
    /// its machine goes onto the VM it prepared, its cgroups become the
    /// workspace's, and it enters the network namespace it made.
    pub fn prepare_claimed(
        state: StateDir,
        launch: &VmmLaunch,
        ahead: crate::standby::MadeAhead,
    ) -> Result<Self> {
        let entered = vmm_core::vcpu::monotonic_ns();
        Self::prepare_on(state, launch, Some(ahead), entered)
    }

    fn prepare_on(
        state: StateDir,
        launch: &VmmLaunch,
        ahead: Option<crate::standby::MadeAhead>,
        entered: u64,
    ) -> Result<Self> {
        let owner = launch.owner_fd.then(|| {
            use std::os::fd::FromRawFd;
            // SAFETY: the starter put the owner's pidfd there
            // (`--owner-fd`) and leave_starter kept it; nothing else owns it.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(base::vmm::spawn::OWNER_FD) }
        });
        let name = launch.workspace.as_str();
        let ws = WorkspaceDir::new(&state, name)?;
        // With its starter's ticket the machine is built while the starter
        // still holds the lock to record this process: a workspace's spec
        // never changes and its record is replaced atomically, so it can be
        // read unlocked, and while the starter holds the lock no other VMM
        // of this workspace runs, so stale sockets of a crashed run (the
        // binds would fail) can go. Its guest runs only once the record
        // names this process: a starter that died before writing it leaves
        // a VMM whose guest never ran, whatever starts next. Without the
        // ticket nothing is touched before the record says so.
        let claimed = ahead.is_some();
        let mut ahead = ahead;
        let empty_network = ahead.as_mut().and_then(|a| a.empty_network.take());
        let filters_ahead = ahead.as_mut().and_then(|a| a.filters.take());
        let ticketed = launch
            .ticket
            .as_deref()
            .is_some_and(|t| ws.holds_launch_ticket(t));
        // Ticketed: its spec now; its runtime is the starter's to write,
        // checked in `run` once the process is confined (meanwhile the
        // starter writes it), or below when there is no machine to run.
        let (mut meta, mut built) = if ticketed {
            let meta = ws.read_meta()?;
            let built = Built::build(&state, &ws, launch, &meta.spec, ahead.take());
            (meta, built)
        } else {
            let meta = record::started_for_it(&state, &ws, false)?;
            ws.remove_launch_ticket();
            let built = Built::build(&state, &ws, launch, &meta.spec, ahead.take());
            (meta, built)
        };
        let (listeners, net_ns) =
            listeners::bind_ports(&meta.spec, &mut built.machine, empty_network);
        let relays = listeners::bind_relays(&state, &ws, &meta.spec, &mut built.machine);
        let mut record_checked = !ticketed;
        // A run that ends here records its end (below): only on a record
        // naming this process.
        if ticketed && built.machine.is_err() {
            meta = record::started_for_it(&state, &ws, true)?;
            ws.remove_launch_ticket();
            record_checked = true;
        }
        let spec = &meta.spec;
        // Only a checked record's runtime is this run's.
        let runtime = meta.runtime.as_ref().filter(|_| record_checked);
        let Built {
            machine: built,
            passt,
            egress,
            guest_net,
            cgroup,
            mount_ns,
            began_ns: building,
            cgroup_ns,
            network_ns,
            unshared_ns,
            built_ns: built_at,
        } = built;
        let launched = launch
            .launched_ns
            .or(runtime.and_then(|r| r.launched_mono_ns));
        let ms_after_launch = |ns| us_after(launched, Some(ns)).map(|us| us as f64 / 1e3);
        tracing::info!(
            process_ms = ms_after_launch(entered),
            build_began_ms = ms_after_launch(building),
            cgroup_ms = ms_after_launch(cgroup_ns),
            network_ms = ms_after_launch(network_ns),
            mount_ns_ms = ms_after_launch(unshared_ns),
            built_ms = ms_after_launch(built_at),
            ports_bound_ms = ms_after_launch(vmm_core::vcpu::monotonic_ns()),
            restored = launch.restore.is_some(),
            before_the_record = !record_checked,
            standby = claimed,
            "machine built (times since the VMM's launch)"
        );
        let shared = Arc::new(Shared {
            ws: ws.clone(),
            restored: launch.restore.is_some(),
            guest_net,
            keep_warm: launch.keep_warm.clone(),
            volumes: crate::guest_ready::to_mount(spec),
            state: state.clone(),
            started: Instant::now(),
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stop_reason: Mutex::new(None),
            ttl_deadline: Mutex::new(runtime.and_then(|r| r.ttl_deadline_ms)),
            ttl_changed: Condvar::new(),
            ports: PortForwarder::new(&ws.vsock(), AGENT_PORT),
            egress: egress.map(crate::egress::EgressControl::new),
            finished: AtomicBool::new(false),
            machine: OnceLock::new(),
            protections: Mutex::new(Vec::new()),
            balloon: OnceLock::new(),
            paused: AtomicBool::new(false),
            idle_paused: AtomicBool::new(false),
            transition: Mutex::new(()),
            arrivals: OnceLock::new(),
            idle: idle_policy(&state, spec),
            can_hibernate: spec.may_hibernate(),
            hibernating: AtomicBool::new(false),
        });
        let machine = match built {
            Ok(m) => {
                let _ = shared.machine.set(m.handle());
                if let Some(balloon) = m.balloon() {
                    let _ = shared.balloon.set(balloon);
                }
                if let Some(arrivals) = m.vsock_arrivals() {
                    let _ = shared.arrivals.set(arrivals);
                }
                Some(m)
            }
            Err(e) => {
                shared.finish(
                    true,
                    &format!("the VM could not be built: {}", e.full_message()),
                );
                None
            }
        };
        Ok(Self {
            shared,
            machine,
            listeners,
            relays,
            passt,
            owner,
            user: launch.user,
            disk_and_mem_mib: (
                crate::guest_ready::largest_disk_mib(&state, &ws, spec),
                spec.mem_mib,
            ),
            cgroup,
            mount_ns,
            net_ns,
            launched_mono_ns: launched,
            record_checked,
            filters_ahead,
        })
    }

    /// Runs the guest until it ends; returns whether the run crashed (the
    /// program's exit status is its own choice). The process is confined
    /// before any thread of it starts, so every thread inherits the
    /// confinement; `when_confined` then starts the program's own threads
    /// (its signal thread) with a [`VmmStopper`].
    pub fn run(self, when_confined: impl FnOnce(VmmStopper)) -> Result<RunEnd> {
        let shared = self.shared;
        let Some(machine) = self.machine else {
            return Ok(RunEnd { crashed: true });
        };
        let ws = shared.ws.clone();
        let listener = UnixListener::bind(ws.control()).map_err(VmmProcessError::host_io(
            format!("binding {}", ws.control().display()),
        ))?;
        // Only this user drives the VMM (the directory is 0700 as well).
        std::fs::set_permissions(ws.control(), std::fs::Permissions::from_mode(0o600)).map_err(
            VmmProcessError::host_io(format!("restricting {}", ws.control().display())),
        )?;
        let owner = self.owner;

        // Confined before any thread starts and before the guest runs; a
        // VMM that cannot be is not run.
        let leaving = base::host::cgroup::Leaving::prepare(&self.cgroup);
        let keep = crate::guard::jail_keeps(&shared.state, &ws, shared.keep_warm.as_deref());
        let lockdown = crate::guard::Lockdown {
            disk_and_mem_mib: self.disk_and_mem_mib,
            mount_ns: self.mount_ns,
            net_ns: self.net_ns,
            keep,
            children: self.passt.iter().map(base::network::Passt::pid).collect(),
            filters_ahead: self.filters_ahead,
            removable: leaving.holders(),
            user: self.user,
        };
        let launched = self.launched_mono_ns;
        let ms_after_launch =
            || us_after(launched, Some(vmm_core::vcpu::monotonic_ns())).map(|us| us as f64 / 1e3);
        let lockdown_ms = ms_after_launch();
        match lockdown.apply(&ws) {
            Ok(mut protections) => {
                protections.push(self.cgroup.describe());
                *shared.protections.lock().unwrap_or_else(|p| p.into_inner()) = protections;
            }
            Err(why) => {
                if !self.record_checked {
                    check_record(&shared)?;
                }
                shared.finish(true, &why);
                return Ok(RunEnd { crashed: true });
            }
        }
        // Confined while the starter wrote its record: its guest runs only
        // once that record names this process (a starter that died before
        // writing it leaves a VMM that ends without running it).
        if !self.record_checked {
            check_record(&shared)?;
            tracing::info!(
                record_checked_ms = ms_after_launch(),
                "record checked (times since the VMM's launch)"
            );
        }
        if let Err(e) = self
            .listeners
            .into_iter()
            .try_for_each(|(mapping, listener)| shared.ports.publish(mapping, listener))
            .and_then(|()| {
                self.relays
                    .into_iter()
                    .try_for_each(|(port, listener)| shared.ports.relay(port, listener))
            })
        {
            shared.finish(
                true,
                &format!(
                    "its published ports could not be served: {}",
                    e.full_message()
                ),
            );
            return Ok(RunEnd { crashed: true });
        }
        tracing::info!(
            lockdown_ms,
            confined_ms = ms_after_launch(),
            "confined (times since the VMM's launch)"
        );
        crate::pause_point("vmm:confined");
        // The process's own threads once the vCPUs are on their way: none
        // of them is needed before the guest's first instruction.
        let outcome = machine.run_then(None, || {
            let s = shared.clone();
            std::thread::spawn(move || {
                control::serve(listener, |req, fd| answers::handle_control(&s, req, fd))
            });
            let s = shared.clone();
            std::thread::spawn(move || wait_for_agent(&s));
            let s = shared.clone();
            std::thread::spawn(move || enforce_ttl(&s));
            if shared.idle.reclaim_after.is_some() || shared.idle.pause_after.is_some() {
                let s = shared.clone();
                std::thread::spawn(move || idle::watch(&s, s.idle));
            }
            if shared.egress.is_some() {
                let s = shared.clone();
                std::thread::spawn(move || record_refusals(&s));
            }
            if let Some(owner) = owner {
                let s = shared.clone();
                std::thread::spawn(move || {
                    if crate::guard::wait_for_owner_end(&owner) {
                        s.begin_stop(OWNER_GRACE, "the process it ran for ended");
                    }
                });
            }
            when_confined(VmmStopper {
                shared: shared.clone(),
            });
            tracing::info!(
                threads_ms = ms_after_launch(),
                "threads started (times since the VMM's launch)"
            );
        });
        crate::pause_point("vmm:finishing");
        // The network's helper ends with the guest it served.
        drop(self.passt);
        let stopping = *shared.stop_reason.lock().unwrap_or_else(|p| p.into_inner());
        let (crashed, reason) = match outcome {
            Ok(o) => classify_end(&o.reason, stopping, &ws),
            Err(e) => (true, format!("the VMM failed: {e}")),
        };
        // Whatever the run held on the host is let go before its end is
        // recorded: a start that follows the record at once must not find
        // its ports taken or its fresh group record removed by this one.
        shared.ports.close_all();
        // A VMM running as its own account may not remove its groups: the
        // record then stays for the next start or the delete.
        if leaving.leave() {
            let _ = std::fs::remove_file(ws.path().join(base::host::cgroup::RECORD_FILE));
        }
        shared.finish(crashed, &reason);
        Ok(RunEnd { crashed })
    }
}

/// Checks that the record names this process (`record::started_for_it`),
/// then takes its TTL: no thread of the run has started yet.
fn check_record(shared: &Shared) -> Result<()> {
    let meta = record::started_for_it(&shared.state, &shared.ws, true)?;
    shared.ws.remove_launch_ticket();
    *shared
        .ttl_deadline
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = meta.runtime.and_then(|rt| rt.ttl_deadline_ms);
    Ok(())
}

/// When the idle workspace drops its caches, pauses and hibernates: its
/// own settings, else the host's (a broken host setting falls back to the
/// defaults, with a warning in the VMM's log).
fn idle_policy(state: &StateDir, spec: &base::store::spec::WorkspaceSpec) -> idle::IdlePolicy {
    let config = base::host::idle::IdleConfig::load(state.root()).unwrap_or_else(|e| {
        tracing::warn!("idle settings unreadable, using the defaults: {e}");
        base::host::idle::IdleConfig::default()
    });
    let hibernate_after = config
        .hibernate_after(spec.idle_hibernate_secs)
        .filter(|_| spec.may_hibernate());
    idle::IdlePolicy::new(
        memory::reclaim_after(state),
        config.pause_after(spec.idle_pause_secs),
        hibernate_after,
    )
}

/// How a [`VmmProcess`] run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunEnd {
    /// The guest or the VMM failed (the workspace is recorded as crashed).
    pub crashed: bool,
}

/// Whether the run crashed, and why it ended, in words.
fn classify_end(reason: &StopReason, stopping: Option<&str>, ws: &WorkspaceDir) -> (bool, String) {
    let panicked = tail_lines(ws.path(), 60)
        .unwrap_or_default()
        .iter()
        .any(|l| l.contains("Kernel panic"));
    match reason {
        _ if panicked => (true, "the guest kernel panicked".into()),
        StopReason::Reset | StopReason::PowerOff if stopping.is_some() => {
            (false, stopping.unwrap_or_default().to_owned())
        }
        StopReason::Reset | StopReason::PowerOff => {
            (false, "the guest shut down or rebooted itself".into())
        }
        StopReason::Stopped => (
            false,
            format!("{} (VM torn down)", stopping.unwrap_or("stopped")),
        ),
        StopReason::TripleFault => (true, "the guest triple-faulted".into()),
        other => (true, format!("the VM stopped: {other:?}")),
    }
}

/// Polls the agent until it answers, then marks the workspace running.
fn wait_for_agent(shared: &Arc<Shared>) {
    let mut attempts = 0u32;
    let mut retry = Duration::from_millis(20);
    loop {
        if shared.stopping.load(Ordering::SeqCst) || shared.finished.load(Ordering::SeqCst) {
            return;
        }
        attempts += 1;
        let attempt = if shared.restored {
            crate::guest_ready::give_identity(&shared.ws, shared.guest_net.as_ref())
        } else {
            crate::guest_ready::hello(&shared.ws).map(Some)
        };
        let attempt = attempt.inspect_err(|e| {
            tracing::debug!(attempts, after_ms = shared.started.elapsed().as_millis(), error = %e, "the agent did not answer")
        });
        if let Ok(hello) = attempt {
            // An agent that takes the host's clock from each hello lets the
            // guest's clock stop with its pauses; an older one's runs on.
            let takes_clock =
                hello.is_some_and(|h| h.capabilities.iter().any(|c| c == "hello_clock"));
            if let Some(machine) = shared.machine.get() {
                machine.clock_stops_with_pauses(takes_clock);
            }
            break;
        }
        // A restored agent answers within a moment (its first connection
        // may meet the guest's vsock reset); a booting one takes seconds,
        // and each refused attempt costs its emulated kernel.
        std::thread::sleep(retry);
        retry = (retry * 2).min(Duration::from_millis(300));
    }
    let answered = shared.started.elapsed();
    if let Some(dir) = &shared.keep_warm {
        keep_warm(shared, dir);
    }
    if let Err(e) = crate::guest_ready::mount(&shared.ws, &shared.volumes) {
        shared.finish(true, &format!("the guest could not mount its volumes: {e}"));
        shared.tear_down();
        return;
    }
    shared.ready.store(true, Ordering::SeqCst);
    let ready_ns = vmm_core::vcpu::monotonic_ns();
    let first_run_ns = shared.machine.get().and_then(MachineHandle::first_run_ns);
    let mut started = None;
    let marked = shared.update(|m| {
        if m.state == State::Starting {
            m.state = m.state.become_(State::Running)?;
            if let Some(rt) = m.runtime.as_mut() {
                rt.protections = shared
                    .protections
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                rt.ready_at_ms = Some(now_ms());
                rt.ready_us = us_after(rt.launched_mono_ns, Some(ready_ns));
                rt.vcpu_running_us = us_after(rt.launched_mono_ns, first_run_ns);
                started = Some(EventKind::Started {
                    start: rt.start_kind,
                    ready_ms: rt.ready_us.map(|us| us / 1000),
                });
            }
        }
        Ok(())
    });
    let event = started.unwrap_or(EventKind::Started {
        start: None,
        ready_ms: None,
    });
    match marked.and_then(|()| Ok(shared.ws.events().append(event)?)) {
        Ok(_) => tracing::info!(
            secs = shared.started.elapsed().as_secs_f64(),
            attempts,
            answered_ms = answered.as_millis(),
            "agent ready (times since the VMM's launch)"
        ),
        Err(e) => tracing::error!(error = %e.full_message(), "could not mark running"),
    }
}

/// Snapshots the freshly booted guest (before anyone has used it) as its
/// image's warm snapshot, with the boot's console.
fn keep_warm(shared: &Shared, dir: &std::path::Path) {
    let Some(machine) = shared.machine.get() else {
        return;
    };
    let kept = machine
        .snapshot(dir)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            let _ = std::fs::copy(
                shared
                    .ws
                    .path()
                    .join(base::store::console_log::CONSOLE_FILE),
                dir.join(base::store::console_log::CONSOLE_FILE),
            );
            base::vmm::warm::promote(dir).map_err(|e| e.to_string())
        });
    match kept {
        Ok(()) => tracing::info!("kept the warm snapshot of this image"),
        Err(e) => {
            tracing::error!(error = %e, "could not keep a warm snapshot");
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Microseconds from `from` to `to` (CLOCK_MONOTONIC ns), when both are known.
fn us_after(from: Option<u64>, to: Option<u64>) -> Option<u64> {
    Some(to?.saturating_sub(from?) / 1000)
}

/// Sleeps until the TTL deadline (re-reading it when it changes), then stops.
fn enforce_ttl(shared: &Arc<Shared>) {
    let mut deadline = shared
        .ttl_deadline
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let wait = match *deadline {
            None => Duration::from_secs(3600),
            Some(at) => {
                let now = now_ms();
                if now >= at {
                    break;
                }
                Duration::from_millis(at - now)
            }
        };
        deadline = shared
            .ttl_changed
            .wait_timeout(deadline, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    drop(deadline);
    if let Err(e) = shared.ws.events().append(EventKind::TtlExpired) {
        tracing::error!(error = %e, "could not log the TTL expiry");
    }
    shared.begin_stop(TTL_GRACE, "its TTL expired");
}

/// Writes the egress filter's refusals into the workspace's events as they
/// come, at most a batch a second, until the run ends: an agent reading
/// events learns why its connection failed. Between refusals the thread
/// sleeps on the filter's signal, so an idle (or paused) guest costs nothing.
fn record_refusals(shared: &Shared) {
    const BATCH: Duration = Duration::from_secs(1);
    let Some(egress) = &shared.egress else {
        return;
    };
    let refused = egress.refusals_signal();
    let mut seen = 0;
    loop {
        for refusal in egress.new_denials(&mut seen) {
            if let Err(e) = shared
                .ws
                .events()
                .append(EventKind::EgressRefused { refusal })
            {
                tracing::warn!("cannot record an egress refusal: {e}");
            }
        }
        if shared.finished.load(Ordering::SeqCst) {
            return;
        }
        // A burst's later refusals wait for the next batch.
        std::thread::sleep(BATCH);
        if refused.recv().is_err() {
            return;
        }
    }
}
