//! The detached VMM process of one running workspace (`microagent vmm
//! serve-workspace`): boots the guest, marks the workspace running when the
//! agent answers, serves the control socket, enforces the TTL, and records
//! how the run ended. It owns the workspace's state while it lives.

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vmm_core::devices::serial::ConsoleSink;
use vmm_core::machine::{DiskConfig, VsockConfig};
use vmm_core::{Machine, MachineConfig, StopReason};

use crate::console_log::{tail_lines, ConsoleLogWriter};
use crate::control::{self, ControlRequest, ControlResponse};
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::image::ImageRegistry;
use crate::spec::{now_ms, validate_ttl};
use crate::state::State;
use crate::store::StateDir;
use crate::workspace_dir::WorkspaceDir;

/// Grace period a TTL expiry gives the guest to shut down.
const TTL_GRACE: Duration = Duration::from_secs(10);
/// The guest's vsock context id (each VMM has its own device).
const GUEST_CID: u64 = 3;

struct Shared {
    ws: WorkspaceDir,
    state: StateDir,
    started: Instant,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// Why the stop under way was started.
    stop_reason: Mutex<Option<&'static str>>,
    /// Unix ms of the TTL deadline; the condvar wakes the TTL thread on change.
    ttl_deadline: Mutex<Option<u64>>,
    ttl_changed: Condvar,
    /// Set by whoever records the end first.
    finished: AtomicBool,
}

impl Shared {
    /// Updates meta.json under the workspace lock.
    fn update(&self, f: impl FnOnce(&mut crate::spec::Meta) -> Result<()>) -> Result<()> {
        let _lock = self.state.lock_workspace(self.ws.name())?;
        let mut meta = self.ws.read_meta()?;
        f(&mut meta)?;
        self.ws.write_meta(&meta)
    }

    /// Records the end of the run once; later calls do nothing.
    fn finish(&self, crashed: bool, reason: &str) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        eprintln!("microagent-vmm: run ended: {reason}");
        let result = (|| {
            let _lock = self.state.lock_workspace(self.ws.name())?;
            let mut meta = self.ws.read_meta()?;
            if !meta.state.has_vmm() {
                return Ok(());
            }
            self.ws.record_exit(&mut meta, crashed, reason)
        })();
        if let Err(e) = result {
            eprintln!(
                "microagent-vmm: could not record the end: {}",
                e.full_message()
            );
        }
    }

    /// Starts a stop: asks the agent to shut the guest down, and tears the
    /// VM down (by ending this process) if it has not gone after `grace`.
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
                let endpoint = shared.ws.agent();
                let asked = block_on(async move {
                    let client = endpoint.connect().await?;
                    client.shutdown().await
                });
                if let Err(e) = asked {
                    eprintln!("microagent-vmm: agent shutdown failed: {e}");
                } else {
                    std::thread::sleep(grace);
                }
            }
            shared.finish(
                false,
                &format!("{reason} (VM torn down after the grace period)"),
            );
            std::process::exit(0);
        });
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// Runs the VMM of workspace `name` in this process until the guest ends.
/// Returns the process exit code.
pub fn serve(state: StateDir, name: &str) -> Result<i32> {
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread below receives these.
    let termination = block_termination_signals();
    let ws = WorkspaceDir::new(&state, name)?;
    // The starter holds the lock until it has recorded this process.
    let meta = {
        let _lock = state.lock_workspace(name)?;
        ws.read_meta()?
    };
    let me = std::process::id();
    match &meta.runtime {
        Some(rt) if rt.pid == me && meta.state == State::Starting => {}
        _ => {
            return Err(Error::WrongState {
                name: name.to_owned(),
                state: meta.state,
                hint: "this VMM process was not started for it; use `microagent start`",
            })
        }
    }
    let shared = Arc::new(Shared {
        ws: ws.clone(),
        state: state.clone(),
        started: Instant::now(),
        ready: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        stop_reason: Mutex::new(None),
        ttl_deadline: Mutex::new(meta.runtime.as_ref().and_then(|r| r.ttl_deadline_ms)),
        ttl_changed: Condvar::new(),
        finished: AtomicBool::new(false),
    });
    // Stale sockets of a crashed run would make the binds below fail.
    ws.remove_sockets();
    let machine = match build_machine(&state, &ws, &meta.spec) {
        Ok(m) => m,
        Err(e) => {
            shared.finish(
                true,
                &format!("the VM could not be built: {}", e.full_message()),
            );
            return Ok(1);
        }
    };
    let listener = UnixListener::bind(ws.control()).map_err(Error::host_io(format!(
        "binding {}",
        ws.control().display()
    )))?;
    let s = shared.clone();
    std::thread::spawn(move || control::serve(listener, |req| handle_control(&s, req)));
    let s = shared.clone();
    std::thread::spawn(move || wait_for_agent(&s));
    let s = shared.clone();
    std::thread::spawn(move || enforce_ttl(&s));
    let s = shared.clone();
    std::thread::spawn(move || stop_on_signals(&s, termination));

    let outcome = machine.run(None);
    let stopping = *shared.stop_reason.lock().unwrap_or_else(|p| p.into_inner());
    let (crashed, reason) = match outcome {
        Ok(o) => classify_end(&o.reason, stopping, &ws),
        Err(e) => (true, format!("the VMM failed: {e}")),
    };
    shared.finish(crashed, &reason);
    Ok(i32::from(crashed))
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
        StopReason::TripleFault => (true, "the guest triple-faulted".into()),
        other => (true, format!("the VM stopped: {other:?}")),
    }
}

fn build_machine(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &crate::spec::WorkspaceSpec,
) -> Result<Machine> {
    let host = vmm_core::host::probe()
        .map_err(|e| Error::HostUnsupported(format!("KVM is not usable: {e}")))?;
    let images = ImageRegistry::new(state, crate::doctor::asset_dir(), host.kernel_variant());
    let image = images.get(&spec.image)?;
    let console = ConsoleLogWriter::create(ws.path())?;
    let cmdline = format!(
        "root=/dev/vda ro rootfstype=ext4 microagent_overlay=/dev/vdb microagent_hostname={}",
        ws.name()
    );
    Machine::build(MachineConfig {
        kernel: image.kernel,
        initrd: None,
        extra_cmdline: Some(cmdline),
        mem_mib: spec.mem_mib,
        vcpus: spec.vcpus,
        template: host.cpu_template(),
        console: ConsoleSink::new().with(Box::new(console)),
        disks: vec![
            DiskConfig {
                path: image.rootfs,
                read_only: true,
            },
            DiskConfig {
                path: ws.disk(),
                read_only: false,
            },
        ],
        vsock: Some(VsockConfig {
            guest_cid: GUEST_CID,
            uds_path: ws.vsock(),
        }),
    })
    .map_err(|e| Error::StartFailed {
        name: ws.name().to_owned(),
        reason: format!(
            "{e}: {}",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
        ),
    })
}

/// Polls the agent until it answers, then marks the workspace running.
fn wait_for_agent(shared: &Arc<Shared>) {
    let endpoint = shared.ws.agent();
    // One runtime for every attempt of this thread.
    let rt = runtime();
    loop {
        if shared.stopping.load(Ordering::SeqCst) || shared.finished.load(Ordering::SeqCst) {
            return;
        }
        let attempt = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                endpoint.connect().await?.hello().await
            })
            .await
        });
        if matches!(attempt, Ok(Ok(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    shared.ready.store(true, Ordering::SeqCst);
    let marked = shared.update(|m| {
        if m.state == State::Starting {
            m.state = m.state.become_(State::Running)?;
            if let Some(rt) = m.runtime.as_mut() {
                rt.ready_at_ms = Some(now_ms());
            }
        }
        Ok(())
    });
    match marked.and_then(|()| Ok(shared.ws.events().append(EventKind::Started)?)) {
        Ok(_) => eprintln!(
            "microagent-vmm: agent ready after {:.1} s",
            shared.started.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!(
            "microagent-vmm: could not mark running: {}",
            e.full_message()
        ),
    }
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
        eprintln!("microagent-vmm: could not log the TTL expiry: {e}");
    }
    shared.begin_stop(TTL_GRACE, "its TTL expired");
}

fn handle_control(shared: &Arc<Shared>, req: ControlRequest) -> ControlResponse {
    match req {
        ControlRequest::Status => ControlResponse::Status {
            pid: std::process::id(),
            uptime_ms: shared.started.elapsed().as_millis() as u64,
            ready: shared.ready.load(Ordering::SeqCst),
            stopping: shared.stopping.load(Ordering::SeqCst),
            ttl_deadline_ms: *shared
                .ttl_deadline
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        },
        ControlRequest::Stop { timeout_ms } => {
            shared.begin_stop(Duration::from_millis(timeout_ms), "stopped on request");
            ControlResponse::Ok {
                ttl_deadline_ms: None,
            }
        }
        ControlRequest::SetTtl { ttl_secs } => {
            if let Some(Err(e)) = ttl_secs.map(validate_ttl) {
                return ControlResponse::Error {
                    message: e.to_string(),
                };
            }
            let at = ttl_secs.map(|s| now_ms() + s * 1000);
            let recorded = shared.update(|m| {
                if let Some(rt) = m.runtime.as_mut() {
                    rt.ttl_deadline_ms = at;
                }
                Ok(())
            });
            if let Err(e) = recorded {
                return ControlResponse::Error {
                    message: e.full_message(),
                };
            }
            *shared
                .ttl_deadline
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = at;
            shared.ttl_changed.notify_all();
            ControlResponse::Ok {
                ttl_deadline_ms: at,
            }
        }
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and in every
/// thread it starts later); returns the set for [`stop_on_signals`].
fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; an all-zero value is then initialised
    // by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only
    // write to it and to this thread's signal mask.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Turns SIGTERM/SIGINT/SIGHUP into a graceful stop (as `microagent stop`
/// does, so a host shutdown syncs the guest's disk); a second one while
/// stopping tears the VM down at once.
fn stop_on_signals(shared: &Arc<Shared>, set: libc::sigset_t) {
    loop {
        let mut signal = 0;
        // SAFETY: `set` was initialised by block_termination_signals and
        // `signal` is a valid place for the result.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            continue;
        }
        let reason = match signal {
            libc::SIGTERM => "stopped by SIGTERM",
            libc::SIGINT => "stopped by SIGINT",
            _ => "stopped by SIGHUP",
        };
        if shared.stopping.load(Ordering::SeqCst) {
            shared.finish(false, &format!("{reason} (second signal: VM torn down)"));
            std::process::exit(0);
        }
        shared.begin_stop(Duration::from_secs(10), reason);
    }
}
