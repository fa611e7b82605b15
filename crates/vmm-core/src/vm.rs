//! The KVM VM: the /dev/kvm handle, the VM fd, its memory slots, the
//! in-kernel interrupt controllers and PIT.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_config, kvm_pit_state2, kvm_userspace_memory_region,
    CpuId, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::layout::{KVM_IDENTITY_MAP_START, KVM_TSS_START};
use crate::memory::{GuestMemory, ReservedMemory};

/// KVM API version every supported kernel reports.
const KVM_API_VERSION: i32 = 12;

/// Why a VM could not be created or set up.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm (is KVM enabled, and may this user read and write it?)")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// The kernel speaks another KVM API.
    #[error("KVM API version {0} is not supported (expected {KVM_API_VERSION})")]
    ApiVersion(i32),
    /// A capability the VMM relies on is missing.
    #[error("the host's KVM lacks {0:?}, which microagent needs")]
    MissingCapability(Cap),
    /// KVM_CREATE_VM failed.
    #[error("KVM could not create a VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// KVM_SET_USER_MEMORY_REGION failed.
    #[error("KVM refused guest memory slot {slot}")]
    SetMemory {
        /// The slot.
        slot: u32,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A guest memory region has no host mapping (cannot happen with mmap'd memory).
    #[error("guest memory region at {0:#x} has no host address")]
    HostAddress(u64),
    /// Setting the TSS or identity-map address failed.
    #[error("KVM could not reserve its TSS/identity-map pages")]
    SetTss(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_IRQCHIP failed.
    #[error("KVM could not create the in-kernel interrupt controllers")]
    CreateIrqchip(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_PIT2 failed.
    #[error("KVM could not create the in-kernel PIT")]
    CreatePit(#[source] kvm_ioctls::Error),
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("KVM could not report its supported CPUID")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    /// KVM_IRQFD failed.
    #[error("KVM could not attach an irqfd to GSI {gsi}")]
    Irqfd {
        /// The interrupt line.
        gsi: u32,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Reading or restoring VM-wide state (irqchip, PIT, clock) failed.
    #[error("KVM could not {action} the VM's {what}")]
    State {
        /// "save" or "restore".
        action: &'static str,
        /// Which state.
        what: &'static str,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_GET_MSR_INDEX_LIST failed.
    #[error("KVM could not list the MSRs it saves")]
    MsrList(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_VCPU failed.
    #[error("KVM could not create vCPU {index}")]
    CreateVcpu {
        /// The vCPU.
        index: u8,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
}

/// What the host's KVM offers, read once per save or restore.
#[derive(Debug)]
pub struct HostCpu {
    /// MSRs KVM saves and restores.
    pub msr_indices: Vec<u32>,
    /// KVM_GET_SUPPORTED_CPUID.
    pub supported: CpuId,
    /// Whether KVM_GET/SET_XCRS exist.
    pub has_xcrs: bool,
    /// Size of the guest XSAVE area (KVM_CAP_XSAVE2), 0 when unknown.
    pub xsave_size: usize,
}

/// A VM and the KVM handle it came from.
#[derive(Debug)]
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
}

impl Vm {
    /// Opens /dev/kvm, checks the API and creates an empty VM.
    pub fn new() -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let version = kvm.get_api_version();
        if version != KVM_API_VERSION {
            return Err(VmError::ApiVersion(version));
        }
        for cap in [Cap::UserMemory, Cap::ImmediateExit] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCapability(cap));
            }
        }
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        Ok(Self { kvm, fd })
    }

    /// The VM fd.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// Whether the host's KVM has `cap`.
    pub fn has_capability(&self, cap: Cap) -> bool {
        self.kvm.check_extension(cap)
    }

    /// Gives the guest its RAM, one slot per region.
    pub fn register_memory(&self, mem: &GuestMemory) -> Result<(), VmError> {
        let mut ranges = Vec::new();
        for region in mem.iter() {
            let start = region.start_addr();
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|_| VmError::HostAddress(start.0))?;
            ranges.push((start, region.len(), host as usize));
        }
        // SAFETY: each host range is a live mapping owned by `mem`, which the
        // caller keeps alive for as long as this VM runs (Machine holds both).
        unsafe { self.register_ranges(&ranges) }
    }

    /// Registers a reservation's ranges as the guest's RAM before anything
    /// is mapped into them (see [`ReservedMemory`]).
    pub(crate) fn register_reserved(&self, reserved: &ReservedMemory) -> Result<(), VmError> {
        // SAFETY: the ranges are the reservation's mappings; the VM is
        // dropped before it (PreparedVm's field order) or the memory mapped
        // over them is never unmapped (`map_private_into`).
        unsafe { self.register_ranges(reserved.ranges()) }
    }

    /// # Safety
    /// Each host range must stay mapped while the VM may run.
    unsafe fn register_ranges(&self, ranges: &[(GuestAddress, u64, usize)]) -> Result<(), VmError> {
        for (slot, &(start, len, host)) in ranges.iter().enumerate() {
            let slot = slot as u32;
            let desc = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: start.0,
                memory_size: len,
                userspace_addr: host as u64,
            };
            // SAFETY: the caller keeps the range mapped (this fn's contract).
            unsafe { self.fd.set_user_memory_region(desc) }
                .map_err(|source| VmError::SetMemory { slot, source })?;
        }
        Ok(())
    }

    /// Creates the in-kernel PIC, IO-APIC and LAPICs, and the PIT. Must come
    /// before the vCPUs are created.
    pub fn create_irqchip_and_pit(&self) -> Result<(), VmError> {
        self.fd
            .set_tss_address(KVM_TSS_START as usize)
            .map_err(VmError::SetTss)?;
        self.fd
            .set_identity_map_address(KVM_IDENTITY_MAP_START)
            .map_err(VmError::SetTss)?;
        self.fd.create_irq_chip().map_err(VmError::CreateIrqchip)?;
        // The dummy speaker answers port 0x61 in the kernel, as the PIT's gate.
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd.create_pit2(pit).map_err(VmError::CreatePit)
    }

    /// Routes writes to `evt` into interrupt line `gsi`.
    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(|source| VmError::Irqfd { gsi, source })
    }

    /// KVM_GET_SUPPORTED_CPUID.
    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmError::SupportedCpuid)
    }

    /// Creates vCPU `index` (its APIC ID is the same number).
    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, VmError> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|source| VmError::CreateVcpu { index, source })
    }

    /// What the host's KVM offers for saving and restoring vCPUs.
    pub fn host_cpu(&self) -> Result<HostCpu, VmError> {
        let msr_indices = self
            .kvm
            .get_msr_index_list()
            .map_err(VmError::MsrList)?
            .as_slice()
            .to_vec();
        Ok(HostCpu {
            msr_indices,
            supported: self.supported_cpuid()?,
            has_xcrs: self.kvm.check_extension(Cap::Xcrs),
            xsave_size: self.xsave_size(),
        })
    }

    /// Size of the guest XSAVE area (KVM_CAP_XSAVE2), 0 when unknown.
    pub fn xsave_size(&self) -> usize {
        if self.kvm.check_extension(Cap::Xsave2) {
            usize::try_from(self.fd.check_extension_int(Cap::Xsave2)).unwrap_or(0)
        } else {
            0
        }
    }

    /// Saves the in-kernel PICs, IO-APIC, PIT and clock (vCPUs stopped).
    pub fn save_state(&self) -> Result<VmState, VmError> {
        let err = |what| {
            move |source| VmError::State {
                action: "save",
                what,
                source,
            }
        };
        let chip = |chip_id| {
            let mut c = kvm_irqchip {
                chip_id,
                ..Default::default()
            };
            self.fd.get_irqchip(&mut c).map(|()| c)
        };
        Ok(VmState {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER).map_err(err("master PIC"))?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE).map_err(err("slave PIC"))?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC).map_err(err("IO-APIC"))?,
            pit: self.fd.get_pit2().map_err(err("PIT"))?,
            clock: self.fd.get_clock().map_err(err("clock"))?,
        })
    }

    /// The guest's kvm-clock now, in nanoseconds.
    pub fn clock(&self) -> Result<u64, VmError> {
        self.fd
            .get_clock()
            .map(|c| c.clock)
            .map_err(|source| VmError::State {
                action: "save",
                what: "clock",
                source,
            })
    }

    /// Sets the guest's kvm-clock to `ns`, from where it runs on (a restore,
    /// the end of a pause). The flags describe a host's clock and are not
    /// set.
    pub fn set_clock(&self, ns: u64) -> Result<(), VmError> {
        let clock = kvm_clock_data {
            clock: ns,
            ..Default::default()
        };
        self.fd.set_clock(&clock).map_err(|source| VmError::State {
            action: "restore",
            what: "clock",
            source,
        })
    }

    /// Restores what [`Vm::save_state`] saved, into a VM whose irqchip and
    /// PIT exist.
    pub fn restore_state(&self, state: &VmState) -> Result<(), VmError> {
        let err = |what| {
            move |source| VmError::State {
                action: "restore",
                what,
                source,
            }
        };
        self.fd.set_pit2(&state.pit).map_err(err("PIT"))?;
        // The clock resumes where it was saved.
        self.set_clock(state.clock.clock)?;
        self.fd
            .set_irqchip(&state.pic_master)
            .map_err(err("master PIC"))?;
        self.fd
            .set_irqchip(&state.pic_slave)
            .map_err(err("slave PIC"))?;
        self.fd.set_irqchip(&state.ioapic).map_err(err("IO-APIC"))
    }
}

/// The VM-wide state KVM holds outside the vCPUs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    /// The first 8259 PIC.
    pub pic_master: kvm_irqchip,
    /// The cascaded 8259 PIC.
    pub pic_slave: kvm_irqchip,
    /// The IO-APIC.
    pub ioapic: kvm_irqchip,
    /// The PIT's three channels.
    pub pit: kvm_pit_state2,
    /// The KVM clock.
    pub clock: kvm_clock_data,
}
