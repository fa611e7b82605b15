//! Running a machine: vCPU threads and the device event loop, driven by one
//! owner thread that handles vCPU exit reports and [`MachineHandle`]
//! requests (stop, pause, resume, snapshot) in the order they arrive.
//!
//! A machine is Running (vCPU threads in KVM_RUN, the event loop polling)
//! or Paused (no vCPU thread, no event loop thread: the owner holds the
//! vCPU fds and the loop, so no guest code runs and no queue is processed).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use super::{Machine, MachineError};
use crate::arch::cpuid::CpuTemplate;
use crate::devices::event_loop::{EventLoop, RunningEventLoop};
use crate::disk_copy::copy_open_disk;
use crate::exit::{Buses, StopReason};
use crate::snapshot::cpu::VcpuState;
use crate::snapshot::{memory_file, MachineState, SnapshotError, SnapshotFiles, SnapshotTaken};
use crate::stats;
use crate::vcpu::{
    registers, stop_all, RunControl, VcpuExitReport, VcpuThread, VcpuThreadState as ThreadState,
};
use crate::xstate_switch::XstateSwitch;

/// How often a run without a report checks that its vCPU threads live.
const VCPU_POLL: Duration = Duration::from_millis(500);

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why the VM stopped.
    pub reason: StopReason,
    /// The reporting vCPU's registers when it failed.
    pub registers: Option<String>,
    /// CLOCK_MONOTONIC ns of the boot vCPU's first KVM_RUN.
    pub first_run_ns: Option<u64>,
    /// Whether the boot vCPU's thread was under its seccomp filter at its
    /// first KVM_RUN, before the guest's first instruction.
    pub first_run_confined: Option<bool>,
    /// Resident memory of the VMM process outside guest RAM, in KiB, just before teardown.
    pub overhead_rss_kib: Option<u64>,
}

type Reply<T> = Sender<Result<T, MachineError>>;

/// What the owner thread is told.
#[derive(Debug)]
pub(super) enum RunMessage {
    /// A vCPU stopped the VM.
    Exit(VcpuExitReport),
    /// Tear the VM down.
    Stop,
    /// Stop all vCPUs and the device loop.
    Pause(Reply<()>),
    /// Run again after a pause.
    Resume(Reply<()>),
    /// Write a snapshot into a directory.
    Snapshot(PathBuf, Reply<SnapshotTaken>),
    /// Pause, write memory and state (no disk copies) into a directory,
    /// and stay paused.
    Hibernate(PathBuf, Reply<SnapshotTaken>),
    /// Read the guest's kvm-clock.
    Clock(Reply<u64>),
    /// Whether the guest's clock stops while the machine is paused.
    ClockStopsWithPauses(bool),
}

impl From<VcpuExitReport> for RunMessage {
    fn from(r: VcpuExitReport) -> Self {
        RunMessage::Exit(r)
    }
}

/// Controls a machine's run from other threads. Every call but
/// [`MachineHandle::stop`] waits for the run to act on it.
#[derive(Clone, Debug)]
pub struct MachineHandle(Sender<RunMessage>, Arc<RunControl>);

impl MachineHandle {
    pub(super) fn new(tx: Sender<RunMessage>, control: Arc<RunControl>) -> Self {
        Self(tx, control)
    }

    /// CLOCK_MONOTONIC ns when the boot vCPU first entered the guest (None
    /// before).
    pub fn first_run_ns(&self) -> Option<u64> {
        self.1.first_run_ns()
    }

    /// Ends the run ([`StopReason::Stopped`]; the guest is not asked);
    /// does nothing once it has ended.
    pub fn stop(&self) {
        let _ = self.0.send(RunMessage::Stop);
    }

    fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> RunMessage) -> Result<T, MachineError> {
        let (tx, rx) = mpsc::channel();
        self.0
            .send(make(tx))
            .map_err(|_| MachineError::NotRunning)?;
        rx.recv().map_err(|_| MachineError::NotRunning)?
    }

    /// Stops every vCPU and the device loop; nothing runs until
    /// [`MachineHandle::resume`]. Pausing a paused machine does nothing.
    pub fn pause(&self) -> Result<(), MachineError> {
        self.ask(RunMessage::Pause)
    }

    /// Runs a paused machine again; resuming a running one does nothing.
    pub fn resume(&self) -> Result<(), MachineError> {
        self.ask(RunMessage::Resume)
    }

    /// The guest's kvm-clock in nanoseconds: what the guest reads now, or
    /// would read when resumed (see [`MachineHandle::clock_stops_with_pauses`]).
    pub fn clock(&self) -> Result<u64, MachineError> {
        self.ask(RunMessage::Clock)
    }

    /// Whether the guest's kvm-clock stops while the machine is paused
    /// (from the next pause on). Only for a guest that learns the wall
    /// clock from its host after a resume (an agent with `hello_clock`):
    /// any other would stay behind by every pause. Off at first: the
    /// clock runs on through pauses.
    pub fn clock_stops_with_pauses(&self, stops: bool) {
        let _ = self.0.send(RunMessage::ClockStopsWithPauses(stops));
    }

    /// Writes a snapshot of the whole machine into `dir` (an existing,
    /// empty directory), pausing it meanwhile; a running machine runs
    /// again afterwards, a paused one stays paused.
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotTaken, MachineError> {
        self.ask(|reply| RunMessage::Snapshot(dir.to_path_buf(), reply))
    }

    /// Pauses the machine and writes its memory and state into `dir` (an
    /// existing, empty directory), without copies of its disks: a restore
    /// takes the disks as they are, so nothing may write them in between.
    /// The machine stays paused, for [`MachineHandle::stop`].
    pub fn hibernate(&self, dir: &Path) -> Result<SnapshotTaken, MachineError> {
        self.ask(|reply| RunMessage::Hibernate(dir.to_path_buf(), reply))
    }
}

/// How often a resume after a snapshot is tried again, and how long apart.
const RESUME_TRIES: u32 = 50;
const RESUME_RETRY: Duration = Duration::from_millis(100);

enum Phase {
    Running {
        threads: Vec<VcpuThread>,
        devices: RunningEventLoop,
    },
    Paused {
        vcpus: Vec<VcpuFd>,
        devices: EventLoop,
    },
    /// Between the two, or after a transition that lost a vCPU or the
    /// device loop (the run then ends).
    Gone,
}

/// The owner thread's view of a running machine.
struct Runner {
    machine: Machine,
    buses: Arc<Buses>,
    xstate: Option<XstateSwitch>,
    control: Arc<RunControl>,
    tx: Sender<RunMessage>,
    phase: Phase,
    vcpu_count: usize,
    /// The guest's kvm-clock when the machine paused, set again at the
    /// resume: a guest shown the pause as elapsed time catches its
    /// timekeeping up one second at a time in kernel mode, which an
    /// emulating host pays for at the first call after a long idle pause.
    /// The wall clock is the host's to tell (every agent hello carries it).
    frozen_clock: Option<u64>,
    /// Whether pauses freeze the clock at all (see
    /// [`MachineHandle::clock_stops_with_pauses`]).
    clock_stops: bool,
}

impl Runner {
    /// Starts a thread per vCPU; when one cannot start, the started ones
    /// are stopped and every descriptor comes back, in order, with the
    /// error.
    fn spawn_vcpus(
        &mut self,
        fds: Vec<VcpuFd>,
    ) -> Result<Vec<VcpuThread>, (Vec<VcpuFd>, MachineError)> {
        let mut threads = Vec::with_capacity(fds.len());
        let mut fds = fds.into_iter();
        let mut index = 0u8;
        while let Some(fd) = fds.next() {
            match VcpuThread::spawn(
                index,
                fd,
                self.buses.clone(),
                self.xstate.clone(),
                self.control.clone(),
                self.tx.clone(),
            ) {
                Ok(t) => threads.push(t),
                Err((fd, e)) => {
                    // The machine stays paused: the vCPUs that ran meanwhile
                    // took the stopped mark already.
                    let mut back = stop_all(&self.control, &mut threads);
                    crate::vcpu::tell_paused(&back);
                    self.freeze_clock();
                    back.push(fd);
                    back.extend(fds);
                    return Err((back, e.into()));
                }
            }
            index += 1;
        }
        Ok(threads)
    }

    fn pause(&mut self) -> Result<(), MachineError> {
        match std::mem::replace(&mut self.phase, Phase::Gone) {
            Phase::Running {
                mut threads,
                devices,
            } => {
                let vcpus = stop_all(&self.control, &mut threads);
                crate::vcpu::tell_paused(&vcpus);
                self.freeze_clock();
                let devices = devices.pause()?;
                if vcpus.len() != self.vcpu_count {
                    return Err(MachineError::VcpusLost);
                }
                self.phase = Phase::Paused { vcpus, devices };
                Ok(())
            }
            other => {
                self.phase = other;
                Ok(())
            }
        }
    }

    fn resume(&mut self) -> Result<(), MachineError> {
        match std::mem::replace(&mut self.phase, Phase::Gone) {
            Phase::Paused { vcpus, devices } => {
                // A thread that cannot start (pids.max, memory) leaves the
                // machine paused and whole: it can be resumed again.
                self.control.clear_stop();
                if let Some(ns) = self.frozen_clock {
                    if let Err(e) = self.machine.vm.set_clock(ns) {
                        tracing::warn!("the guest's clock ran on through the pause: {e}");
                    }
                }
                // The vCPUs first, so the guest's first instruction waits
                // for no other thread's start (what it asks of a device
                // waits in that device's eventfd until the loop runs).
                let mut threads = match self.spawn_vcpus(vcpus) {
                    Ok(threads) => threads,
                    Err((vcpus, e)) => {
                        self.phase = Phase::Paused { vcpus, devices };
                        return Err(e);
                    }
                };
                match devices.spawn() {
                    Ok(devices) => {
                        self.phase = Phase::Running { threads, devices };
                        self.frozen_clock = None;
                        Ok(())
                    }
                    Err(failed) => {
                        let (devices, e) = *failed;
                        let vcpus = stop_all(&self.control, &mut threads);
                        crate::vcpu::tell_paused(&vcpus);
                        self.freeze_clock();
                        if vcpus.len() != self.vcpu_count {
                            return Err(MachineError::VcpusLost);
                        }
                        self.phase = Phase::Paused { vcpus, devices };
                        Err(e.into())
                    }
                }
            }
            other => {
                self.phase = other;
                Ok(())
            }
        }
    }

    /// Notes the guest's clock as the vCPUs stopped (see `frozen_clock`).
    /// A clock KVM cannot read runs on through the pause, as it did before.
    fn freeze_clock(&mut self) {
        // A reading that fails leaves none: an older one set again later
        // would take the guest's clock back past what it has read since.
        self.frozen_clock = None;
        if !self.clock_stops {
            return;
        }
        match self.machine.vm.clock() {
            Ok(ns) => self.frozen_clock = Some(ns),
            Err(e) => tracing::warn!("the guest's clock will run on through the pause: {e}"),
        }
    }

    /// The clock the guest reads, or would read once resumed.
    fn clock(&self) -> Result<u64, MachineError> {
        match self.frozen_clock {
            Some(ns) => Ok(ns),
            None => Ok(self.machine.vm.clock()?),
        }
    }

    fn snapshot(&mut self, dir: &Path) -> Result<SnapshotTaken, MachineError> {
        let started = Instant::now();
        // Asked before the pause: it does not change while the guest runs.
        let host = self.machine.vm.host_cpu()?;
        let was_running = matches!(self.phase, Phase::Running { .. });
        self.pause()?;
        let paused_at = Instant::now();
        let written = self.write_snapshot(dir, &host, true);
        let paused = if was_running {
            let resumed = self.resume_retrying();
            let paused = paused_at.elapsed();
            resumed?;
            paused
        } else {
            Duration::ZERO
        };
        let mut taken = written?;
        taken.paused = paused;
        taken.total = started.elapsed();
        Ok(taken)
    }

    /// Resumes, trying again for a while when threads cannot start yet
    /// (tunnel threads ending free the VMM's task budget).
    fn resume_retrying(&mut self) -> Result<(), MachineError> {
        let mut tries = 0;
        loop {
            match self.resume() {
                Err(e) if matches!(self.phase, Phase::Paused { .. }) && tries < RESUME_TRIES => {
                    tracing::warn!("resuming after a snapshot: {e}; trying again");
                    tries += 1;
                    std::thread::sleep(RESUME_RETRY);
                }
                other => return other,
            }
        }
    }

    /// Pauses and writes memory and state, no disks; stays paused.
    fn hibernate(&mut self, dir: &Path) -> Result<SnapshotTaken, MachineError> {
        let started = Instant::now();
        let host = self.machine.vm.host_cpu()?;
        self.pause()?;
        let mut taken = self.write_snapshot(dir, &host, false)?;
        // The disks as the memory expects them, durable before the record
        // says the machine can be restored.
        for (index, (_, _, file)) in self.machine.devices.disks.iter().enumerate() {
            if let Some(file) = file {
                file.sync_data()
                    .map_err(|source| MachineError::DiskSync { index, source })?;
            }
        }
        taken.total = started.elapsed();
        taken.paused = taken.total;
        Ok(taken)
    }

    fn write_snapshot(
        &self,
        dir: &Path,
        host: &crate::vm::HostCpu,
        with_disks: bool,
    ) -> Result<SnapshotTaken, MachineError> {
        let Phase::Paused { vcpus, .. } = &self.phase else {
            return Err(MachineError::NotRunning);
        };
        let m = &self.machine;
        let vcpu_states = vcpus
            .iter()
            .enumerate()
            .zip(&m.vcpu_cpuid)
            .map(|((i, fd), cpuid)| VcpuState::save(fd, i as u8, cpuid, host))
            .collect::<Result<Vec<_>, _>>()?;
        let state = MachineState {
            mem_mib: m.mem_size >> 20,
            template: m.template,
            cmdline: m.cmdline.clone(),
            vm: {
                // A paused machine's clock is the one it paused with.
                let mut vm = m.vm.save_state()?;
                if let Some(ns) = self.frozen_clock {
                    vm.clock.clock = ns;
                }
                vm
            },
            vcpus: vcpu_states,
            serial: m
                .devices
                .serial
                .as_ref()
                .map(|s| lock(s).save_state())
                .unwrap_or_default(),
            cmos_index: m.devices.cmos.as_ref().map_or(0, |c| lock(c).selected()),
            disks: m.devices.disks.iter().map(|(_, shape, _)| *shape).collect(),
            vsock_cid: m.devices.vsock_cid,
            net_mac: m.devices.net_mac,
            balloon: m.devices.balloon.as_ref().map(|b| lock(b).save_state()),
            virtio: m
                .devices
                .transports
                .iter()
                .map(|t| lock(t).save_state())
                .collect(),
        };
        let files = SnapshotFiles::new(dir);
        let state_bytes = state.write(&files)?;
        let memory = memory_file::save(&m.mem, &files.memory()).map_err(SnapshotError::from)?;
        let mut disks = Vec::new();
        for (index, (_, _, source)) in m.devices.disks.iter().enumerate() {
            let Some(source) = source.as_ref().filter(|_| with_disks) else {
                continue;
            };
            let to = files.disk(index);
            let copy = copy_open_disk(source, &to).map_err(|source| SnapshotError::Disk {
                index,
                to,
                source,
            })?;
            disks.push((index, copy));
        }
        Ok(SnapshotTaken {
            paused: Duration::ZERO,
            total: Duration::ZERO,
            memory,
            state_bytes,
            disks,
        })
    }

    /// Stops whatever runs; returns the vCPU fds for a last look.
    fn tear_down(&mut self) -> Vec<VcpuFd> {
        match std::mem::replace(&mut self.phase, Phase::Gone) {
            Phase::Running {
                mut threads,
                mut devices,
            } => {
                let fds = stop_all(&self.control, &mut threads);
                devices.stop();
                fds
            }
            Phase::Paused { vcpus, .. } => vcpus,
            Phase::Gone => Vec::new(),
        }
    }

    fn threads_all_exited(&self) -> bool {
        match &self.phase {
            Phase::Running { threads, .. } => {
                threads.iter().all(|t| t.state() == ThreadState::Exited)
            }
            _ => false,
        }
    }
}

fn lock<T: ?Sized>(d: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

fn reply<T>(to: Reply<T>, result: Result<T, MachineError>) {
    // The asker may have given up waiting.
    let _ = to.send(result);
}

impl Machine {
    /// Runs the guest until it stops itself, fails, is stopped through a
    /// [`MachineHandle`], or `timeout` passes; handles pause, resume and
    /// snapshot requests meanwhile.
    pub fn run(self, timeout: Option<Duration>) -> Result<RunOutcome, MachineError> {
        self.run_then(timeout, || {})
    }

    /// [`Machine::run`], calling `started` once the vCPU threads are on
    /// their way: what the owner starts there does not hold up the guest.
    pub fn run_then(
        mut self,
        timeout: Option<Duration>,
        started: impl FnOnce(),
    ) -> Result<RunOutcome, MachineError> {
        let (tx, rx): (Sender<RunMessage>, Receiver<RunMessage>) =
            std::mem::replace(&mut self.messages, mpsc::channel());
        let vcpus = std::mem::take(&mut self.vcpus);
        let event_loop = self.event_loop.take().ok_or(MachineError::NotRunning)?;
        // Compat kernels switch the extended FPU state through the VMM.
        let xstate = if self.template == CpuTemplate::Compat {
            XstateSwitch::new(self.mem.clone(), self.vm.xsave_size())
        } else {
            None
        };
        let mut runner = Runner {
            buses: Arc::new(self.buses.clone()),
            xstate,
            control: self.control.clone(),
            machine: self,
            tx,
            phase: Phase::Gone,
            vcpu_count: vcpus.len(),
            frozen_clock: None,
            clock_stops: false,
        };
        runner.phase = Phase::Paused {
            vcpus,
            devices: event_loop,
        };
        runner.resume()?;
        started();
        // A timeout past what an Instant holds is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let report = loop {
            // Paused, there are no threads to look at: only a message or
            // the deadline wakes the owner, so a paused VMM costs no CPU.
            let poll = match runner.phase {
                Phase::Running { .. } => Some(VCPU_POLL),
                _ => None,
            };
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let wait = [poll, left].into_iter().flatten().min();
            let message = match wait {
                Some(wait) => rx.recv_timeout(wait),
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            };
            match message {
                Ok(RunMessage::Exit(report)) => break Ok(report),
                Ok(RunMessage::Stop) => {
                    break Ok(VcpuExitReport {
                        index: 0,
                        reason: StopReason::Stopped,
                        registers: None,
                    })
                }
                Ok(RunMessage::Pause(to)) => reply(to, runner.pause()),
                Ok(RunMessage::Resume(to)) => reply(to, runner.resume()),
                Ok(RunMessage::Snapshot(dir, to)) => reply(to, runner.snapshot(&dir)),
                Ok(RunMessage::Hibernate(dir, to)) => reply(to, runner.hibernate(&dir)),
                Ok(RunMessage::Clock(to)) => reply(to, runner.clock()),
                Ok(RunMessage::ClockStopsWithPauses(stops)) => runner.clock_stops = stops,
                // The runner holds a sender, so the channel never disconnects.
                Err(mpsc::RecvTimeoutError::Disconnected) => break Err(vcpus_gone()),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break Err(StopReason::TimedOut);
                    }
                    if runner.threads_all_exited() {
                        // A report sent just before the last thread ended.
                        break match rx.try_recv() {
                            Ok(RunMessage::Exit(r)) => Ok(r),
                            _ => Err(vcpus_gone()),
                        };
                    }
                }
            }
            if matches!(runner.phase, Phase::Gone) {
                break Err(StopReason::KvmFailure(
                    "a pause or resume failed; the VM cannot go on".into(),
                ));
            }
        };
        let overhead_rss_kib = stats::overhead_rss_kib(&runner.machine.mem);
        let fds = runner.tear_down();
        let (reason, registers) = match report {
            Ok(r) => {
                tracing::debug!(vcpu = r.index, reason = ?r.reason, "VM stopping");
                (r.reason, r.registers)
            }
            // Where the guest was when it ran out of time says what it was stuck on.
            Err(reason) => {
                let all: Vec<String> = fds
                    .iter()
                    .enumerate()
                    .map(|(i, fd)| {
                        format!(
                            "vcpu{i}: {}",
                            registers(fd).unwrap_or_else(|| "unreadable".into())
                        )
                    })
                    .collect();
                (reason, (!all.is_empty()).then(|| all.join("; ")))
            }
        };
        Ok(RunOutcome {
            reason,
            registers,
            first_run_ns: runner.control.first_run_ns(),
            first_run_confined: runner.control.first_run_confined(),
            overhead_rss_kib,
        })
    }
}

fn vcpus_gone() -> StopReason {
    StopReason::KvmFailure("every vCPU thread ended without a report".into())
}
