//! Building a machine from a snapshot in a fresh process: the same attach
//! steps as a boot, each device given its saved state, guest memory mapped
//! copy-on-write from the snapshot's memory file. Everything is checked and
//! set before any vCPU runs; an error leaves nothing behind. What does not
//! depend on the snapshot (the VM, its interrupt controllers, the vCPU
//! fds, the device event loop) is a [`PreparedVm`], which can be made
//! before the snapshot is known.

use std::path::PathBuf;

use kvm_ioctls::VcpuFd;

use super::{DiskConfig, Machine, MachineError, NetBackendConfig, NetConfig, VsockConfig};
use crate::arch::cpuid::VcpuTopology;
use crate::devices::event_loop::EventLoop;
use crate::devices::serial::ConsoleSink;
use crate::memory::ReservedMemory;
use crate::snapshot::{memory_file, MachineState, SnapshotFiles};
use crate::vm::{HostCpu, Vm};

/// The part of a restored machine that no snapshot decides: a KVM VM with
/// its interrupt controllers and PIT, the host's CPU figures, `vcpus` vCPU
/// fds and an empty device event loop. Made ahead (a VMM waiting for its
/// workspace), it takes these ioctls off a restore's path.
#[derive(Debug)]
pub struct PreparedVm {
    vm: Vm,
    host: HostCpu,
    vcpus: Vec<VcpuFd>,
    event_loop: EventLoop,
    /// Guest RAM's address range, registered with KVM ahead (after `vm`:
    /// a VM dropped unused goes before its memory's range).
    memory: Option<ReservedMemory>,
}

impl PreparedVm {
    /// A VM with `vcpus` vCPUs, nothing in its memory yet.
    pub fn new(vcpus: u8) -> Result<Self, MachineError> {
        let vm = Vm::new()?;
        // The interrupt controllers before any vCPU (KVM's order).
        vm.create_irqchip_and_pit()?;
        let host = vm.host_cpu()?;
        let vcpus = (0..vcpus)
            .map(|index| vm.create_vcpu(index))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            vm,
            host,
            vcpus,
            event_loop: EventLoop::new()?,
            memory: None,
        })
    }

    /// A VM with `vcpus` vCPUs and `mem_mib` MiB of RAM's address range
    /// registered with KVM, to be filled by a snapshot's memory file. The
    /// memory mapped there lives as long as the process: for a process
    /// that runs this one machine.
    pub fn with_memory(vcpus: u8, mem_mib: u64) -> Result<Self, MachineError> {
        let mut prepared = Self::new(vcpus)?;
        let reserved = ReservedMemory::new(mem_mib)?;
        prepared.vm.register_reserved(&reserved)?;
        prepared.memory = Some(reserved);
        Ok(prepared)
    }

    /// How many vCPUs it has.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    /// Its memory's size, when it has its memory's range.
    pub fn mem_mib(&self) -> Option<u64> {
        self.memory.as_ref().map(ReservedMemory::mib)
    }

    /// Whether a machine of `vcpus` vCPUs and `mem_mib` MiB can go on it.
    fn fits(&self, vcpus: usize, mem_mib: u64) -> bool {
        self.vcpus.len() == vcpus && self.mem_mib().is_none_or(|m| m == mem_mib)
    }
}

/// What to restore, and the host resources the restored machine gets.
#[derive(Debug)]
pub struct RestoreConfig {
    /// The snapshot directory.
    pub snapshot: PathBuf,
    /// Where the serial console goes from now on.
    pub console: ConsoleSink,
    /// The disks, in the snapshot's order and shapes. A writable disk
    /// should be a copy of the snapshot's (see [`SnapshotFiles::disk`]):
    /// the guest's page cache expects its contents. A disk that was empty
    /// (0 bytes) in the snapshot may be given any file: the guest is told
    /// its size changed, as when a disk is resized under it.
    pub disks: Vec<DiskConfig>,
    /// The vsock device's new host socket (its CID is the snapshot's).
    pub vsock_uds: Option<PathBuf>,
    /// Its routes ([`super::VsockConfig::routes`]), which a snapshot does
    /// not keep: they name host sockets of this run.
    pub vsock_routes: std::collections::BTreeMap<u32, PathBuf>,
    /// The network device's new backend (its MAC is the snapshot's).
    pub net: Option<NetBackendConfig>,
}

impl Machine {
    /// Builds the machine saved in `cfg.snapshot`; nothing runs yet.
    pub fn restore(cfg: RestoreConfig) -> Result<Self, MachineError> {
        let began = std::time::Instant::now();
        let state = MachineState::read(&SnapshotFiles::new(&cfg.snapshot))?;
        // Its vCPU count within bounds before a vCPU is made for it.
        check_fits(&state, &cfg)?;
        let vcpus = u8::try_from(state.vcpus.len()).map_err(|_| {
            MachineError::SnapshotMismatch(format!("it has {} vCPUs", state.vcpus.len()))
        })?;
        let prepared = PreparedVm::new(vcpus)?;
        Self::restore_state_into(prepared, cfg, state, began)
    }

    /// Builds the machine saved in `cfg.snapshot` on `prepared`; nothing
    /// runs yet. A prepared VM that does not fit the snapshot (another
    /// vCPU count or memory size) is set aside and a fresh one made: a
    /// VMM prepared ahead never makes a restore fail.
    pub fn restore_into(prepared: PreparedVm, cfg: RestoreConfig) -> Result<Self, MachineError> {
        let began = std::time::Instant::now();
        let state = MachineState::read(&SnapshotFiles::new(&cfg.snapshot))?;
        check_fits(&state, &cfg)?;
        let prepared = if prepared.fits(state.vcpus.len(), state.mem_mib) {
            prepared
        } else {
            tracing::info!(
                prepared_vcpus = prepared.vcpu_count(),
                prepared_mem_mib = prepared.mem_mib(),
                "the prepared VM does not fit the snapshot: a fresh one is made"
            );
            drop(prepared);
            PreparedVm::new(state.vcpus.len() as u8)?
        };
        Self::restore_state_into(prepared, cfg, state, began)
    }

    fn restore_state_into(
        prepared: PreparedVm,
        cfg: RestoreConfig,
        state: MachineState,
        // Where a restore's time goes (issue 59 asks for under 3 ms from
        // launch to a running vCPU), in vmm.log.
        began: std::time::Instant,
    ) -> Result<Self, MachineError> {
        let files = SnapshotFiles::new(&cfg.snapshot);
        if prepared.vcpus.len() != state.vcpus.len() {
            return Err(MachineError::SnapshotMismatch(format!(
                "it has {} vCPUs, the prepared VM {}",
                state.vcpus.len(),
                prepared.vcpus.len()
            )));
        }
        let PreparedVm {
            vm,
            host,
            vcpus,
            event_loop,
            memory,
        } = prepared;
        let in_place = memory.is_some();
        let mem = match memory {
            Some(reserved) => memory_file::map_private_into(&files.memory(), reserved),
            None => memory_file::map_private(&files.memory(), state.mem_mib),
        }
        .map_err(crate::snapshot::SnapshotError::from)?;
        if !in_place {
            vm.register_memory(&mem)?;
        }
        let mapped = began.elapsed();
        let count = state.vcpus.len() as u8;
        for (index, vcpu) in state.vcpus.iter().enumerate() {
            let topo = VcpuTopology {
                index: index as u8,
                count,
            };
            vcpu.check_host(&host, state.template, topo)?;
        }

        let mut machine = Machine::empty_with(
            vm,
            mem,
            state.mem_mib,
            state.template,
            state.cmdline.clone(),
            event_loop,
        );
        machine.attach_legacy_devices(cfg.console, Some((&state.serial, state.cmos_index)))?;
        for disk in &cfg.disks {
            machine.attach_block_device(disk)?;
        }
        if let (Some(cid), Some(uds)) = (state.vsock_cid, &cfg.vsock_uds) {
            machine.attach_vsock(&VsockConfig {
                guest_cid: cid,
                uds_path: uds.clone(),
                routes: cfg.vsock_routes.clone(),
            })?;
        }
        if let (Some(mac), Some(backend)) = (state.net_mac, cfg.net) {
            machine.attach_net(NetConfig { mac, backend })?;
        }
        if let Some(balloon) = state.balloon {
            machine.attach_balloon(Some(balloon))?;
        }
        let devices = began.elapsed();
        machine.vcpus = vcpus;
        machine.vcpu_cpuid = state.vcpus.iter().map(|v| v.cpuid.clone()).collect();
        // The interrupt controllers before the vCPUs' LAPICs, and both
        // before any device raises a line.
        machine.vm.restore_state(&state.vm)?;
        for (index, (vcpu, fd)) in state.vcpus.iter().zip(&machine.vcpus).enumerate() {
            vcpu.restore(fd, index as u8, &host)?;
        }
        // A snapshot of a paused machine (a hibernation after an idle
        // pause) saved a clock that includes the pause, and the stopped
        // mark a pause asked for dies with its VM: asked again here, once
        // the restored kvm-clock MSRs are on.
        crate::vcpu::tell_paused(&machine.vcpus);
        for (transport, saved) in machine.devices.transports.iter().zip(&state.virtio) {
            transport
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .restore_state(saved)?;
        }
        // Disks filled at this restore: the guest reads their new size.
        for (index, saved) in state.disks.iter().enumerate() {
            if saved.len == 0 && machine.devices.disks[index].1.len != 0 {
                machine.devices.transports[index]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .config_changed()
                    .map_err(MachineError::DiskFilled)?;
            }
        }
        tracing::info!(
            state_memory_and_vm_us = mapped.as_micros() as u64,
            irqchip_and_devices_us = devices.as_micros() as u64,
            restored_us = began.elapsed().as_micros() as u64,
            memory_registered_ahead = in_place,
            "machine restored (times since the restore began)"
        );
        Ok(machine)
    }
}

/// The restore's disks and vsock match what the snapshot's machine had.
fn check_fits(state: &MachineState, cfg: &RestoreConfig) -> Result<(), MachineError> {
    let mismatch = |what: String| Err(MachineError::SnapshotMismatch(what));
    if state.vcpus.is_empty() || state.vcpus.len() > usize::from(crate::arch::mptable::MAX_VCPUS) {
        return mismatch(format!("it has {} vCPUs", state.vcpus.len()));
    }
    if cfg.disks.len() != state.disks.len() {
        return mismatch(format!(
            "it has {} disks, {} were given",
            state.disks.len(),
            cfg.disks.len()
        ));
    }
    for (index, (disk, saved)) in cfg.disks.iter().zip(&state.disks).enumerate() {
        let len = std::fs::metadata(&disk.path).map(|m| m.len()).ok();
        let filled = saved.len == 0 && len.is_some();
        if !filled && (disk.read_only != saved.read_only || len != Some(saved.len)) {
            return mismatch(format!(
                "disk {index} was {} bytes{}; {} is {}{}",
                saved.len,
                if saved.read_only { " read-only" } else { "" },
                disk.path.display(),
                len.map_or("unreadable".to_owned(), |l| format!("{l} bytes")),
                if disk.read_only { " read-only" } else { "" },
            ));
        }
    }
    if state.vsock_cid.is_some() != cfg.vsock_uds.is_some() {
        return mismatch("its vsock device and the requested one differ".into());
    }
    if state.net_mac.is_some() != cfg.net.is_some() {
        return mismatch("its network device and the requested one differ".into());
    }
    let transports = state.disks.len()
        + usize::from(state.vsock_cid.is_some())
        + usize::from(state.net_mac.is_some())
        + usize::from(state.balloon.is_some());
    if state.virtio.len() != transports {
        return mismatch(format!(
            "it saved {} virtio devices for {transports}",
            state.virtio.len()
        ));
    }
    Ok(())
}
