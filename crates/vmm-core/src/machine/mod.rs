//! A Linux guest assembled from small `attach_*` steps, or restored from a
//! snapshot by the same steps, and run until it reboots, powers off or
//! fails. [`run`] runs it; [`Machine::restore`] builds one from a snapshot.

mod restore;
pub mod run;

pub use restore::{PreparedVm, RestoreConfig};
pub use run::{MachineHandle, RunOutcome};

use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, VcpuFd};
use vmm_sys_util::eventfd::EventFd;

use crate::arch::cpuid::{CpuTemplate, VcpuTopology};
use crate::arch::mptable::{self, MpTableError, MAX_VCPUS};
use crate::arch::{boot_params, write_boot_tables, BootTablesError};
use crate::devices::cmos::{Cmos, CMOS_PORT_BASE, CMOS_PORT_LEN};
use crate::devices::event_loop::{EventLoop, EventLoopError};
use crate::devices::i8042::{I8042, I8042_PORT_BASE, I8042_PORT_LEN};
use crate::devices::serial::{
    ConsoleSink, Serial, SerialRegs, SerialStateError, COM1_PORT_BASE, COM_PORT_LEN,
};
use crate::devices::virtio::balloon::{BalloonDevice, BalloonError, BalloonHandle, BalloonState};
use crate::devices::virtio::blk::{BlockDevice, BlockError};
use crate::devices::virtio::mmio::{self, MmioTransport, TransportStateError};
use crate::devices::virtio::net::backend::{NetBackend, StreamBackend, TapBackend};
use crate::devices::virtio::net::egress::{EgressFilter, FilteredBackend};
use crate::devices::virtio::net::{NetDevice, NetError};
use crate::devices::virtio::vsock::{VsockDevice, VsockError};
use crate::devices::virtio::{Interrupt, VirtioDevice};
use crate::devices::BusError;
use crate::exit::Buses;
use crate::host::cmdline_additions;
use crate::kernel::{self, KernelError, LoadedKernel};
use crate::layout::{
    IOAPIC_PINS, MMIO_DEVICES_START, MMIO_DEVICE_SIZE, SERIAL_IRQ, VIRTIO_IRQ_BASE,
};
use crate::memory::{create_guest_memory, GuestMemory, MemoryError};
use crate::snapshot::cpu::CpuStateError;
use crate::snapshot::{DiskState, SnapshotError};
use crate::vcpu::{configure, VcpuError};
use crate::vm::{Vm, VmError};
use run::RunMessage;

/// The command line every guest starts from: serial console, reboot through
/// the keyboard controller (which ends the VM), no PCI probing.
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=k panic=1 pci=off nomodule";

/// Most virtio devices one guest can have: one IO-APIC pin each.
pub const MAX_VIRTIO_DEVICES: u32 = IOAPIC_PINS - VIRTIO_IRQ_BASE;

/// What to boot and how.
#[derive(Debug)]
pub struct MachineConfig {
    /// ELF vmlinux or bzImage.
    pub kernel: PathBuf,
    /// Optional initrd/initramfs.
    pub initrd: Option<PathBuf>,
    /// Appended to the base command line and the template's additions.
    pub extra_cmdline: Option<String>,
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// CPUID template (and with it the command-line additions).
    pub template: CpuTemplate,
    /// Where the serial console goes.
    pub console: ConsoleSink,
    /// Block devices, in order: the first is /dev/vda.
    pub disks: Vec<DiskConfig>,
    /// A vsock device with the hybrid Unix-socket backend.
    pub vsock: Option<VsockConfig>,
    /// A network device.
    pub net: Option<NetConfig>,
    /// A memory balloon: free page reporting and memory statistics.
    pub balloon: bool,
}

/// A virtio-net device.
#[derive(Debug)]
pub struct NetConfig {
    /// The guest's MAC address.
    pub mac: [u8; 6],
    /// Where its frames go.
    pub backend: NetBackendConfig,
}

/// The host end of a network device.
#[derive(Debug)]
pub enum NetBackendConfig {
    /// The TAP interface of this name (IFF_VNET_HDR).
    Tap(String),
    /// A connected stream socket speaking passt's frame protocol.
    Stream(std::os::unix::net::UnixStream),
    /// Another backend behind an egress filter (shared with whoever
    /// changes its policy and reads its refusals).
    Filtered(Box<NetBackendConfig>, Arc<Mutex<EgressFilter>>),
}

impl NetBackendConfig {
    /// Opens the backend.
    fn open(self) -> Result<Box<dyn NetBackend>, MachineError> {
        Ok(match self {
            NetBackendConfig::Tap(name) => {
                Box::new(
                    TapBackend::open(&name).map_err(|source| MachineError::NetBackend {
                        what: format!("TAP `{name}`"),
                        source,
                    })?,
                )
            }
            NetBackendConfig::Stream(sock) => Box::new(StreamBackend::new(sock).map_err(
                |source| MachineError::NetBackend {
                    what: "stream socket".into(),
                    source,
                },
            )?),
            NetBackendConfig::Filtered(inner, filter) => {
                Box::new(FilteredBackend::new(inner.open()?, filter))
            }
        })
    }
}

/// A virtio-blk disk backed by a host file.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The backing file (raw image; its length must be a multiple of 512).
    pub path: PathBuf,
    /// Guest writes fail with an I/O error status.
    pub read_only: bool,
    /// The GET_ID answer (at most 20 bytes), which the guest reads as
    /// `/sys/block/vdX/serial`; `None` derives one from the file.
    pub id: Option<String>,
}

/// A virtio-vsock device.
#[derive(Clone, Debug)]
pub struct VsockConfig {
    /// The guest's context ID (3 or more).
    pub guest_cid: u64,
    /// Host Unix socket: host programs connect here and write `CONNECT <port>\n`;
    /// guest connections to host port P go to `<path>_P`.
    pub uds_path: PathBuf,
    /// Guest connections to these host ports go to these sockets instead
    /// (a workspace's services' relays).
    pub routes: std::collections::BTreeMap<u32, PathBuf>,
}

/// Why a machine could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// vCPU count out of range.
    #[error("{0} vCPUs requested; between 1 and {MAX_VCPUS} are supported")]
    VcpuCount(u8),
    /// Guest memory.
    #[error("guest memory")]
    Memory(#[from] MemoryError),
    /// VM setup.
    #[error("VM setup")]
    Vm(#[from] VmError),
    /// Kernel, initrd or command line.
    #[error("loading the kernel")]
    Kernel(#[from] KernelError),
    /// Boot tables.
    #[error("boot tables")]
    BootTables(#[from] BootTablesError),
    /// MP table.
    #[error("MP table")]
    MpTable(#[from] MpTableError),
    /// Zero page.
    #[error("zero page")]
    BootParams(#[from] boot_params::BootParamsError),
    /// A device could not be placed.
    #[error("device placement")]
    Bus(#[from] BusError),
    /// An eventfd could not be made.
    #[error("could not create an eventfd")]
    EventFd(#[source] std::io::Error),
    /// vCPU setup.
    #[error("vCPU setup")]
    Vcpu(#[from] VcpuError),
    /// The device event loop.
    #[error("device event loop")]
    EventLoop(#[from] EventLoopError),
    /// A disk could not be opened.
    #[error("disk {}", path.display())]
    Disk {
        /// The backing file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: BlockError,
    },
    /// The vsock device could not be set up.
    #[error("vsock device")]
    Vsock(#[from] VsockError),
    /// The network device could not be set up.
    #[error("network device")]
    Net(#[from] NetError),
    /// The balloon could not be set up.
    #[error("balloon device")]
    Balloon(#[from] BalloonError),
    /// The network backend could not be opened.
    #[error("network backend {what}")]
    NetBackend {
        /// Which backend.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// More virtio devices than interrupt lines.
    #[error("too many virtio devices (at most {MAX_VIRTIO_DEVICES})")]
    TooManyDevices,
    /// KVM refused an ioeventfd for a queue notification address.
    #[error("KVM could not attach a queue notification eventfd")]
    IoEvent(#[source] kvm_ioctls::Error),
    /// A snapshot could not be written or read.
    #[error("snapshot")]
    Snapshot(#[from] SnapshotError),
    /// A vCPU's state could not be saved or restored.
    #[error("vCPU state")]
    CpuState(#[from] CpuStateError),
    /// A virtio device's saved state does not fit.
    #[error("virtio device state")]
    TransportState(#[from] TransportStateError),
    /// The serial port's saved state does not fit.
    #[error("serial port state")]
    SerialState(#[from] SerialStateError),
    /// The machine to restore into differs from the snapshot's.
    #[error("the snapshot does not fit this machine: {0}")]
    SnapshotMismatch(String),
    /// The guest could not be told of a disk filled at restore.
    #[error("cannot signal the guest that a disk was attached")]
    DiskFilled(#[source] std::io::Error),
    /// The run has ended; the handle has nothing to act on.
    #[error("the machine is not running")]
    NotRunning,
    /// A vCPU thread ended while the machine was being paused.
    #[error("vCPU threads were lost while pausing")]
    VcpusLost,
    /// A writable disk could not be synced for hibernation.
    #[error("syncing disk {index}")]
    DiskSync {
        /// The disk's index.
        index: usize,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The devices a snapshot saves, by type.
#[derive(Debug, Default)]
struct Devices {
    serial: Option<Arc<Mutex<Serial>>>,
    cmos: Option<Arc<Mutex<Cmos>>>,
    /// In attach order: disks, then vsock, then the network device, then
    /// the balloon.
    transports: Vec<Arc<Mutex<MmioTransport>>>,
    /// Each disk's configuration, shape and, when writable, its file
    /// opened again for snapshot copies.
    disks: Vec<(DiskConfig, DiskState, Option<std::fs::File>)>,
    vsock_cid: Option<u64>,
    /// Host programs arriving at the vsock device's socket.
    vsock_arrivals: Option<Arc<crate::devices::virtio::vsock::HostArrivals>>,
    net_mac: Option<[u8; 6]>,
    balloon: Option<Arc<Mutex<BalloonDevice>>>,
}

/// A guest ready to run.
#[derive(Debug)]
pub struct Machine {
    vm: Vm,
    mem: GuestMemory,
    mem_size: u64,
    template: CpuTemplate,
    buses: Buses,
    vcpus: Vec<VcpuFd>,
    /// The CPUID each vCPU was set up with, by index.
    vcpu_cpuid: Vec<Vec<kvm_bindings::kvm_cpuid_entry2>>,
    /// Base and template arguments, then device declarations as devices are
    /// attached; the user's arguments are appended last (after any `--`
    /// everything goes to init, so devices must come before them).
    cmdline: String,
    user_cmdline: Option<String>,
    kernel: Option<LoadedKernel>,
    /// The devices' loop; [`Machine::run`] takes it (a run consumes the
    /// machine, so attach steps always find it).
    event_loop: Option<EventLoop>,
    virtio_devices: u32,
    devices: Devices,
    /// Shared with the vCPU threads and every [`MachineHandle`].
    control: Arc<crate::vcpu::RunControl>,
    /// vCPU reports and [`MachineHandle`] requests, handled by the run.
    messages: (mpsc::Sender<RunMessage>, mpsc::Receiver<RunMessage>),
}

/// The full command line for `template` and the user's additions.
pub fn compose_cmdline(template: CpuTemplate, extra: Option<&str>) -> String {
    [
        BASE_CMDLINE,
        cmdline_additions(template),
        extra.unwrap_or(""),
    ]
    .iter()
    .map(|s| s.trim())
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>()
    .join(" ")
}

impl Machine {
    /// Builds the whole guest from `cfg`; nothing runs yet.
    pub fn build(cfg: MachineConfig) -> Result<Self, MachineError> {
        if cfg.vcpus == 0 || cfg.vcpus > MAX_VCPUS {
            return Err(MachineError::VcpuCount(cfg.vcpus));
        }
        // Checked whole up front so bad user input fails before any setup.
        kernel::validate_cmdline(&compose_cmdline(cfg.template, cfg.extra_cmdline.as_deref()))?;
        let cmdline = compose_cmdline(cfg.template, None);
        let mem = create_guest_memory(cfg.mem_mib)?;
        let vm = Vm::new()?;
        vm.register_memory(&mem)?;
        vm.create_irqchip_and_pit()?;
        let mut machine = Machine::empty(vm, mem, cfg.mem_mib, cfg.template, cmdline)?;
        machine.user_cmdline = cfg.extra_cmdline.clone().filter(|c| !c.trim().is_empty());
        machine.attach_legacy_devices(cfg.console, None)?;
        for disk in &cfg.disks {
            machine.attach_block_device(disk)?;
        }
        if let Some(vsock) = &cfg.vsock {
            machine.attach_vsock(vsock)?;
        }
        if let Some(net) = cfg.net {
            machine.attach_net(net)?;
        }
        if cfg.balloon {
            machine.attach_balloon(None)?;
        }
        machine.attach_kernel(&cfg.kernel, cfg.initrd.as_deref())?;
        machine.attach_vcpus(cfg.vcpus, cfg.template)?;
        Ok(machine)
    }

    /// A machine with memory and an irqchip, and nothing attached yet.
    fn empty(
        vm: Vm,
        mem: GuestMemory,
        mem_mib: u64,
        template: CpuTemplate,
        cmdline: String,
    ) -> Result<Self, MachineError> {
        Ok(Self::empty_with(
            vm,
            mem,
            mem_mib,
            template,
            cmdline,
            EventLoop::new()?,
        ))
    }

    /// [`Machine::empty`] with a device event loop made before.
    fn empty_with(
        vm: Vm,
        mem: GuestMemory,
        mem_mib: u64,
        template: CpuTemplate,
        cmdline: String,
        event_loop: EventLoop,
    ) -> Self {
        Machine {
            vm,
            mem,
            mem_size: mem_mib << 20,
            template,
            buses: Buses::default(),
            vcpus: Vec::new(),
            vcpu_cpuid: Vec::new(),
            cmdline,
            user_cmdline: None,
            kernel: None,
            event_loop: Some(event_loop),
            virtio_devices: 0,
            devices: Devices::default(),
            control: Arc::default(),
            messages: mpsc::channel(),
        }
    }

    /// A handle that stops, pauses, resumes or snapshots the machine's run
    /// from another thread.
    pub fn handle(&self) -> MachineHandle {
        MachineHandle::new(self.messages.0.clone(), self.control.clone())
    }

    /// The command line the guest gets.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// The balloon's figures, when the machine has one.
    pub fn balloon(&self) -> Option<BalloonHandle> {
        self.devices
            .balloon
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).handle())
    }

    /// Host programs arriving at the vsock device's socket, when the
    /// machine has one: what wakes a machine paused because it was idle.
    pub fn vsock_arrivals(&self) -> Option<Arc<crate::devices::virtio::vsock::HostArrivals>> {
        self.devices.vsock_arrivals.clone()
    }

    /// The loaded kernel.
    pub fn kernel(&self) -> Option<&LoadedKernel> {
        self.kernel.as_ref()
    }

    /// COM1, the i8042 and the CMOS, fresh or in a saved state.
    fn attach_legacy_devices(
        &mut self,
        console: ConsoleSink,
        saved: Option<(&SerialRegs, u8)>,
    ) -> Result<(), MachineError> {
        let irq =
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(MachineError::EventFd)?;
        self.vm.register_irqfd(&irq, SERIAL_IRQ)?;
        let (serial, mut cmos) = match saved {
            Some((regs, _)) => (Serial::from_state(regs, irq, console)?, Cmos::default()),
            None => (Serial::new(irq, console), Cmos::default()),
        };
        if let Some((_, index)) = saved {
            cmos.select(index);
        }
        let serial = Arc::new(Mutex::new(serial));
        let cmos = Arc::new(Mutex::new(cmos));
        self.buses
            .pio
            .insert(COM1_PORT_BASE, COM_PORT_LEN, serial.clone())?;
        self.buses
            .pio
            .insert(I8042_PORT_BASE, I8042_PORT_LEN, Arc::new(Mutex::new(I8042)))?;
        self.buses
            .pio
            .insert(CMOS_PORT_BASE, CMOS_PORT_LEN, cmos.clone())?;
        self.devices.serial = Some(serial);
        self.devices.cmos = Some(cmos);
        Ok(())
    }

    fn attach_block_device(&mut self, disk: &DiskConfig) -> Result<(), MachineError> {
        let failed = |source| MachineError::Disk {
            path: disk.path.clone(),
            source,
        };
        let mut device = BlockDevice::new(&disk.path, disk.read_only).map_err(failed)?;
        if let Some(id) = &disk.id {
            device = device.with_id(id.clone());
        }
        let shape = DiskState {
            read_only: disk.read_only,
            len: device.capacity() * 512,
        };
        // Snapshots copy writable disks later, from inside a private root
        // where the path may not be visible.
        let copy_source = if disk.read_only {
            None
        } else {
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&disk.path);
            Some(opened.map_err(|source| {
                failed(BlockError::Open {
                    path: disk.path.clone(),
                    mode: "read-only",
                    source,
                })
            })?)
        };
        self.attach_virtio_device(Arc::new(Mutex::new(device)))?;
        self.devices.disks.push((disk.clone(), shape, copy_source));
        Ok(())
    }

    fn attach_vsock(&mut self, cfg: &VsockConfig) -> Result<(), MachineError> {
        let device =
            VsockDevice::new(cfg.guest_cid, cfg.uds_path.clone())?.with_routes(cfg.routes.clone());
        let arrivals = device
            .host_arrivals()
            .map_err(|e| MachineError::Vsock(VsockError::ListenerAgain(e)))?;
        self.devices.vsock_arrivals = Some(Arc::new(arrivals));
        self.attach_virtio_device(Arc::new(Mutex::new(device)))?;
        self.devices.vsock_cid = Some(cfg.guest_cid);
        Ok(())
    }

    fn attach_net(&mut self, cfg: NetConfig) -> Result<(), MachineError> {
        let device = NetDevice::new(cfg.mac, cfg.backend.open()?)?;
        self.attach_virtio_device(Arc::new(Mutex::new(device)))?;
        self.devices.net_mac = Some(cfg.mac);
        Ok(())
    }

    fn attach_balloon(&mut self, saved: Option<BalloonState>) -> Result<(), MachineError> {
        let device = Arc::new(Mutex::new(BalloonDevice::new(saved)?));
        self.attach_virtio_device(device.clone())?;
        self.devices.balloon = Some(device);
        Ok(())
    }

    /// Places a virtio device: an MMIO window and an IRQ, an irqfd for its
    /// interrupt, an ioeventfd per queue, its registers on the MMIO bus, its
    /// fds on the event loop, and its declaration on the command line.
    fn attach_virtio_device<D: VirtioDevice + 'static>(
        &mut self,
        device: Arc<Mutex<D>>,
    ) -> Result<(), MachineError> {
        let index = self.virtio_devices;
        if index >= MAX_VIRTIO_DEVICES {
            return Err(MachineError::TooManyDevices);
        }
        let base = MMIO_DEVICES_START + u64::from(index) * MMIO_DEVICE_SIZE;
        let irq = VIRTIO_IRQ_BASE + index;
        let irq_evt =
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(MachineError::EventFd)?;
        self.vm.register_irqfd(&irq_evt, irq)?;
        {
            let d = device.lock().unwrap_or_else(|p| p.into_inner());
            for (queue, evt) in d.queue_events().iter().enumerate() {
                let addr = IoEventAddress::Mmio(base + mmio::regs::QUEUE_NOTIFY);
                self.vm
                    .fd()
                    .register_ioevent(evt, &addr, queue as u32)
                    .map_err(MachineError::IoEvent)?;
            }
        }
        let interrupt = Arc::new(Interrupt::new(irq_evt));
        let transport = Arc::new(Mutex::new(MmioTransport::new(
            device.clone(),
            self.mem.clone(),
            interrupt,
        )));
        self.buses
            .mmio
            .insert(base, MMIO_DEVICE_SIZE, transport.clone())?;
        self.devices.transports.push(transport);
        if let Some(event_loop) = self.event_loop.as_mut() {
            event_loop.add(device);
        }
        self.cmdline.push(' ');
        self.cmdline
            .push_str(&mmio::cmdline_device(base, MMIO_DEVICE_SIZE, irq));
        self.virtio_devices += 1;
        Ok(())
    }

    fn attach_kernel(
        &mut self,
        kernel: &std::path::Path,
        initrd: Option<&std::path::Path>,
    ) -> Result<(), MachineError> {
        let loaded = kernel::load_kernel(&self.mem, kernel)?;
        let initrd = initrd
            .map(|path| kernel::load_initrd(&self.mem, path, self.mem_size, &loaded))
            .transpose()?;
        if let Some(user) = self.user_cmdline.take() {
            self.cmdline.push(' ');
            self.cmdline.push_str(user.trim());
        }
        let len = kernel::write_cmdline(&self.mem, &self.cmdline)?;
        let params = boot_params::build(self.mem_size, loaded.setup_header, len + 1, initrd)?;
        boot_params::write(&self.mem, &params)?;
        write_boot_tables(&self.mem)?;
        self.kernel = Some(loaded);
        Ok(())
    }

    fn attach_vcpus(&mut self, count: u8, template: CpuTemplate) -> Result<(), MachineError> {
        mptable::write(&self.mem, count)?;
        let supported = self.vm.supported_cpuid()?;
        let entry = self.kernel.map(|k| k.entry);
        for index in 0..count {
            let fd = self.vm.create_vcpu(index)?;
            let boot_entry = if index == 0 { entry } else { None };
            let cpuid = configure(
                &fd,
                &supported,
                template,
                VcpuTopology { index, count },
                boot_entry,
                true,
            )?;
            self.vcpus.push(fd);
            self.vcpu_cpuid.push(cpuid.as_slice().to_vec());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_composition() {
        assert_eq!(compose_cmdline(CpuTemplate::Standard, None), BASE_CMDLINE);
        let c = compose_cmdline(CpuTemplate::Compat, Some("  init=/init quiet "));
        assert!(c.starts_with(BASE_CMDLINE));
        assert!(c.contains(" noxsave "));
        assert!(c.ends_with(" init=/init quiet"));
        assert!(!c.contains("  "));
    }
}
