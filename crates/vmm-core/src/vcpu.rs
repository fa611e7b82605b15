//! vCPUs: configuring one for boot, and running each on its own thread with
//! an explicit state, stopped by a flag plus a kick (signal + immediate_exit).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Once};
use std::thread::JoinHandle;

use kvm_bindings::CpuId;
use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::arch::cpuid::{apply_template, CpuTemplate, VcpuTopology};
use crate::arch::regs;
use crate::exit::{handle_exit, Buses, ExitAction, StopReason};
use crate::xstate_switch::{self, XstateSwitch};

/// Why a vCPU could not be configured or started.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A KVM vCPU ioctl failed while setting boot state.
    #[error("could not set {what} of vCPU {index}")]
    Configure {
        /// Which state.
        what: &'static str,
        /// The vCPU.
        index: u8,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM accepted fewer MSRs than given.
    #[error("KVM accepted only {accepted} of {wanted} boot MSRs on vCPU {index}")]
    PartialMsrs {
        /// The vCPU.
        index: u8,
        /// How many KVM took.
        accepted: usize,
        /// How many we gave.
        wanted: usize,
    },
    /// Boot register state could not be prepared.
    #[error("could not prepare boot registers")]
    Regs(#[from] regs::RegsError),
    /// The kick signal handler could not be installed.
    #[error("could not install the vCPU kick signal handler")]
    SignalHandler(#[source] vmm_sys_util::errno::Error),
    /// The vCPU thread could not be spawned.
    #[error("could not start the thread of vCPU {index}")]
    Spawn {
        /// The vCPU.
        index: u8,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The state of a vCPU thread, as its owner observes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuThreadState {
    /// Thread started, not yet in the guest.
    Starting,
    /// In its run loop (in or between KVM_RUN calls).
    Running,
    /// Its loop ended; the thread is finishing or done.
    Exited,
}

#[derive(Debug)]
struct SharedState(AtomicU8);

impl SharedState {
    fn set(&self, state: VcpuThreadState) {
        self.0.store(state as u8, Ordering::Release);
    }

    fn get(&self) -> VcpuThreadState {
        match self.0.load(Ordering::Acquire) {
            0 => VcpuThreadState::Starting,
            1 => VcpuThreadState::Running,
            _ => VcpuThreadState::Exited,
        }
    }
}

/// Configures a fresh vCPU: CPUID from `template`, MSRs, FPU, LAPIC LINTs
/// and, for the boot vCPU (`entry` given), long-mode registers at `entry`.
/// Application processors wait for INIT/SIPI from the in-kernel LAPIC.
/// Returns the CPUID set (some hosts' KVM_GET_CPUID2 reports other bits,
/// so a snapshot saves this).
pub fn configure(
    fd: &VcpuFd,
    supported: &CpuId,
    template: CpuTemplate,
    topo: VcpuTopology,
    entry: Option<u64>,
    has_lapic: bool,
) -> Result<CpuId, VcpuError> {
    let index = topo.index;
    let err = |what| {
        move |source| VcpuError::Configure {
            what,
            index,
            source,
        }
    };
    let mut cpuid = supported.clone();
    apply_template(template, cpuid.as_mut_slice(), topo);
    fd.set_cpuid2(&cpuid).map_err(err("CPUID"))?;

    let msrs = regs::boot_msrs()?;
    let accepted = fd.set_msrs(&msrs).map_err(err("MSRs"))?;
    if accepted != msrs.as_slice().len() {
        return Err(VcpuError::PartialMsrs {
            index,
            accepted,
            wanted: msrs.as_slice().len(),
        });
    }
    fd.set_fpu(&regs::boot_fpu()).map_err(err("FPU"))?;
    if has_lapic {
        let mut lapic = fd.get_lapic().map_err(err("LAPIC"))?;
        regs::set_lapic_lints(&mut lapic);
        fd.set_lapic(&lapic).map_err(err("LAPIC"))?;
    }
    if let Some(entry) = entry {
        let mut sregs = fd.get_sregs().map_err(err("special registers"))?;
        regs::set_long_mode_sregs(&mut sregs);
        fd.set_sregs(&sregs).map_err(err("special registers"))?;
        fd.set_regs(&regs::boot_regs(entry))
            .map_err(err("registers"))?;
    }
    Ok(cpuid)
}

thread_local! {
    /// This thread's `kvm_run.immediate_exit`, for the kick signal handler.
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The kick signal.
fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only a TLS load and a byte store: async-signal-safe.
    let ptr = IMMEDIATE_EXIT.with(Cell::get);
    if !ptr.is_null() {
        // SAFETY: the pointer is set by this thread to its own kvm_run mapping
        // and cleared before that mapping goes away.
        unsafe { std::ptr::write_volatile(ptr, 1) };
    }
}

fn install_kick_handler() -> Result<(), VcpuError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| result = register_signal_handler(kick_signal(), handle_kick));
    result.map_err(VcpuError::SignalHandler)
}

/// Shared between the VM's owner and its vCPU threads.
#[derive(Debug, Default)]
pub struct RunControl {
    stop: AtomicBool,
    /// CLOCK_MONOTONIC nanoseconds at the boot vCPU's first KVM_RUN (0 before).
    first_run_ns: AtomicU64,
    /// Whether the boot vCPU's thread had a seccomp filter at its first
    /// KVM_RUN: 0 not yet run, 1 no, 2 yes.
    first_run_confined: AtomicU8,
}

impl RunControl {
    /// Lets vCPU threads run again after [`stop_all`] paused them.
    pub fn clear_stop(&self) {
        self.stop.store(false, Ordering::Release);
    }

    /// Whether the boot vCPU's thread was under a seccomp filter when it
    /// first entered the guest (None before it did).
    pub fn first_run_confined(&self) -> Option<bool> {
        match self.first_run_confined.load(Ordering::Acquire) {
            0 => None,
            n => Some(n == 2),
        }
    }

    /// When the boot vCPU first entered the guest, in CLOCK_MONOTONIC ns.
    pub fn first_run_ns(&self) -> Option<u64> {
        match self.first_run_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(ns),
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (shared by all processes on the host, so
/// a parent can compare it with its own clock).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A vCPU's report when its loop stops the VM.
#[derive(Debug)]
pub struct VcpuExitReport {
    /// The vCPU.
    pub index: u8,
    /// Why.
    pub reason: StopReason,
    /// Its registers, when the reason is a failure.
    pub registers: Option<String>,
}

/// A running vCPU thread.
#[derive(Debug)]
pub struct VcpuThread {
    index: u8,
    state: Arc<SharedState>,
    handle: Option<JoinHandle<VcpuFd>>,
}

impl VcpuThread {
    /// Starts vCPU `index` running; its stop report goes to `reports`.
    /// `xstate` serves the compat kernel's FPU state requests (see [`xstate_switch`]).
    /// When it cannot start, `fd` comes back with the error.
    pub fn spawn<R: From<VcpuExitReport> + Send + 'static>(
        index: u8,
        fd: VcpuFd,
        buses: Arc<Buses>,
        xstate: Option<XstateSwitch>,
        control: Arc<RunControl>,
        reports: Sender<R>,
    ) -> Result<Self, (VcpuFd, VcpuError)> {
        if let Err(e) = install_kick_handler() {
            return Err((fd, e));
        }
        let state = Arc::new(SharedState(AtomicU8::new(VcpuThreadState::Starting as u8)));
        let thread_state = state.clone();
        let builder = std::thread::Builder::new().name(format!("vcpu{index}"));
        let handle = crate::spawn::spawn_owning(builder, fd, move |fd| {
            // Before the first KVM_RUN: no guest code runs unconfined.
            if let Err(e) = crate::seccomp::enter(crate::seccomp::ThreadRole::Vcpu) {
                let _ = reports.send(R::from(VcpuExitReport {
                    index,
                    reason: StopReason::KvmFailure(format!("vCPU {index}: {e}")),
                    registers: None,
                }));
                thread_state.set(VcpuThreadState::Exited);
                return fd;
            }
            thread_state.set(VcpuThreadState::Running);
            let fd = run_loop(index, fd, &buses, xstate.as_ref(), &control, &reports);
            thread_state.set(VcpuThreadState::Exited);
            fd
        })
        .map_err(|failed| {
            let source = failed.error;
            (failed.value, VcpuError::Spawn { index, source })
        })?;
        Ok(Self {
            index,
            state,
            handle: Some(handle),
        })
    }

    /// Where the vCPU's thread is.
    pub fn state(&self) -> VcpuThreadState {
        self.state.get()
    }

    /// The vCPU's index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// Interrupts KVM_RUN so the loop sees the stop flag.
    fn kick(&self) {
        if let Some(h) = &self.handle {
            if !h.is_finished() {
                if let Err(e) = h.kill(kick_signal()) {
                    tracing::warn!(vcpu = self.index, "could not kick vCPU: {e}");
                }
            }
        }
    }
}

/// Asks every vCPU to stop, waits for their threads and returns the vCPU
/// fds of those that ended normally (in index order), so their final state
/// can still be read, or saved and run again (a pause): a stopped vCPU has
/// completed the I/O it exited for.
pub fn stop_all(control: &RunControl, threads: &mut [VcpuThread]) -> Vec<VcpuFd> {
    control.stop.store(true, Ordering::Release);
    for t in threads.iter() {
        t.kick();
    }
    let mut fds = Vec::with_capacity(threads.len());
    for t in threads.iter_mut() {
        if let Some(h) = t.handle.take() {
            match h.join() {
                Ok(fd) => fds.push(fd),
                Err(_) => tracing::error!(vcpu = t.index, "vCPU thread panicked"),
            }
        }
    }
    fds
}

/// Tells each stopped vCPU's kvm-clock that the host paused it: the
/// guest's RCU stall check, which otherwise takes a pause that caught a
/// grace period for a stall, then skips the gap. The report it would print
/// (about sixty lines through the emulated serial port) cost the first call
/// on a workspace idle-paused past the stall timeout (21 s) half a second
/// or more on an emulating host. A guest without kvm-clock refuses it
/// (EINVAL): nothing to tell.
pub fn tell_paused(fds: &[VcpuFd]) {
    for (index, fd) in fds.iter().enumerate() {
        match fd.kvmclock_ctrl() {
            Ok(()) => {}
            Err(e) if e.errno() == libc::EINVAL => {
                tracing::debug!(vcpu = index, "no kvm-clock to tell of the pause");
            }
            Err(e) => tracing::warn!(vcpu = index, "cannot tell kvm-clock of the pause: {e}"),
        }
    }
}

/// A one-line register summary of a vCPU (None if KVM cannot read them).
pub fn registers(fd: &VcpuFd) -> Option<String> {
    let r = fd.get_regs().ok()?;
    let s = fd.get_sregs().ok()?;
    Some(regs::describe(&r, &s))
}

/// Most exits handled while completing pending I/O before a stop.
const MAX_COMPLETION_EXITS: u32 = 16;

/// Lets KVM finish the instruction the vCPU last exited for (the result of
/// an MMIO or port read is only written on the next KVM_RUN), without
/// entering the guest: KVM completes pending I/O before it looks at
/// `immediate_exit`.
fn complete_pending_io(index: u8, fd: &mut VcpuFd, buses: &Buses) {
    fd.set_kvm_immediate_exit(1);
    for _ in 0..MAX_COMPLETION_EXITS {
        match fd.run() {
            Ok(exit) => {
                // A string I/O instruction may need another exit to finish.
                if let ExitAction::Stop(reason) = handle_exit(exit, buses) {
                    tracing::warn!(
                        vcpu = index,
                        ?reason,
                        "guest stop request lost while stopping"
                    );
                }
            }
            Err(_) => break,
        }
    }
    fd.set_kvm_immediate_exit(0);
}

fn run_loop<R: From<VcpuExitReport>>(
    index: u8,
    mut fd: VcpuFd,
    buses: &Buses,
    xstate: Option<&XstateSwitch>,
    control: &RunControl,
    reports: &Sender<R>,
) -> VcpuFd {
    let mut xstate_failures = 0u64;
    let immediate_exit: *mut u8 = &mut fd.get_kvm_run().immediate_exit;
    IMMEDIATE_EXIT.with(|c| c.set(immediate_exit));
    let report = loop {
        if control.stop.load(Ordering::Acquire) {
            break None;
        }
        if index == 0 && control.first_run_ns.load(Ordering::Relaxed) == 0 {
            // Where the thread stands before the guest's first instruction
            // (2: SECCOMP_MODE_FILTER).
            // SAFETY: PR_GET_SECCOMP takes no pointers.
            let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP) };
            control
                .first_run_confined
                .store(if mode == 2 { 2 } else { 1 }, Ordering::Release);
            control
                .first_run_ns
                .store(monotonic_ns(), Ordering::Release);
        }
        let mut xstate_request = None;
        match fd.run() {
            // Served after the match: it needs the vCPU fd the exit borrows.
            Ok(VcpuExit::IoOut(port, data))
                if xstate.is_some()
                    && (port == xstate_switch::SAVE_PORT || port == xstate_switch::LOAD_PORT) =>
            {
                xstate_request = xstate_switch::SwitchRequest::decode(port, data);
            }
            Ok(exit) => match handle_exit(exit, buses) {
                ExitAction::Continue => {}
                ExitAction::Stop(reason) => {
                    let registers = if reason.is_clean() {
                        None
                    } else {
                        registers(&fd)
                    };
                    break Some(VcpuExitReport {
                        index,
                        reason,
                        registers,
                    });
                }
            },
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                fd.set_kvm_immediate_exit(0);
            }
            Err(e) => {
                let reason = StopReason::KvmFailure(format!("KVM_RUN failed: {e}"));
                break Some(VcpuExitReport {
                    index,
                    reason,
                    registers: registers(&fd),
                });
            }
        }
        if let (Some(xstate), Some(request)) = (xstate, xstate_request) {
            if let Err(e) = xstate.serve(&fd, request) {
                // A guest can repeat a bad request endlessly: log the first.
                xstate_failures += 1;
                if xstate_failures == 1 {
                    tracing::warn!(vcpu = index, error = %e, "could not serve an FPU state request of the guest kernel");
                }
            }
        }
    };
    IMMEDIATE_EXIT.with(|c| c.set(std::ptr::null_mut()));
    match report {
        // The receiver may be gone when the VM is already stopping.
        Some(report) => {
            let _ = reports.send(report.into());
        }
        None => complete_pending_io(index, &mut fd, buses),
    }
    fd
}
