//! One vCPU's state: saved from a stopped vCPU, checked against the host,
//! and set on a fresh vCPU in the order KVM needs (CPUID before the MSRs it
//! enables, the TSC before its deadline, events last).

use kvm_bindings::KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

use crate::arch::cpuid::{apply_template, CpuTemplate, VcpuTopology};
use crate::vm::HostCpu;

/// IA32_TSC_DEADLINE: restored after IA32_TSC, or the deadline is measured
/// against the wrong clock.
const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// CPUID leaves whose feature bits must all be on the restoring host, with
/// the bits of each register (ebx, ecx, edx) that are not features: leaf 1
/// EBX holds APIC ID and counts; OSXSAVE, the APIC bit and OSPKE follow
/// guest control registers and MSRs.
const FEATURE_LEAVES: [(u32, [u32; 3]); 3] = [
    (1, [u32::MAX, 1 << 27, 1 << 9]),
    (7, [0, 1 << 4, 0]),
    (0x8000_0001, [0, 0, 0]),
];

/// Why a vCPU's state could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum CpuStateError {
    /// A KVM get ioctl failed.
    #[error("could not read {what} of vCPU {index}")]
    Get {
        /// Which state.
        what: &'static str,
        /// The vCPU.
        index: u8,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A KVM set ioctl failed.
    #[error("could not restore {what} of vCPU {index}")]
    Set {
        /// Which state.
        what: &'static str,
        /// The vCPU.
        index: u8,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM took only some of the MSRs.
    #[error("KVM restored only {accepted} of {wanted} MSRs of vCPU {index}")]
    PartialMsrs {
        /// The vCPU.
        index: u8,
        /// How many KVM took.
        accepted: usize,
        /// How many there were.
        wanted: usize,
    },
    /// The host's XSAVE area is larger than the state KVM_GET_XSAVE returns.
    #[error("this host's XSAVE area ({0} bytes) needs KVM_GET_XSAVE2, which snapshots do not support yet")]
    XsaveTooLarge(usize),
    /// The snapshot uses CPU features this host lacks.
    #[error("the snapshot's vCPUs use CPUID leaf {leaf:#x} features {missing:#x} in {register}, which this host does not offer")]
    CpuidFeatures {
        /// The leaf.
        leaf: u32,
        /// eax, ebx, ecx or edx.
        register: &'static str,
        /// Bits the host lacks.
        missing: u32,
    },
    /// The snapshot saved an MSR this host's KVM does not save and restore.
    #[error("the snapshot holds MSR {0:#x}, which this host's KVM cannot restore")]
    UnknownMsr(u32),
    /// More entries than KVM's structures hold.
    #[error("the snapshot's {0} list is larger than KVM accepts")]
    TooLarge(&'static str),
}

/// Everything KVM holds for one vCPU.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// The CPUID the vCPU was given (as set: not every host's
    /// KVM_GET_CPUID2 reports it back unchanged).
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Every MSR KVM lists for save/restore that this vCPU could read.
    pub msrs: Vec<kvm_msr_entry>,
    /// General registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers.
    pub sregs: kvm_sregs,
    /// FPU and extended state.
    pub xsave: kvm_xsave,
    /// Extended control registers (None where KVM lacks KVM_CAP_XCRS).
    pub xcrs: Option<kvm_xcrs>,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// The local APIC.
    pub lapic: kvm_lapic_state,
    /// Running, halted, waiting for SIPI...
    pub mp_state: kvm_mp_state,
    /// Pending exceptions, interrupts, NMIs, SMIs.
    pub events: kvm_vcpu_events,
    /// The guest TSC frequency (None where KVM cannot report it).
    pub tsc_khz: Option<u32>,
}

/// Fails when the host's XSAVE state does not fit `kvm_xsave`.
fn check_xsave(host: &HostCpu) -> Result<(), CpuStateError> {
    if host.xsave_size > std::mem::size_of::<kvm_xsave>() {
        return Err(CpuStateError::XsaveTooLarge(host.xsave_size));
    }
    Ok(())
}

/// Whether `e` is subleaf 0 of `leaf` (the index only counts where KVM
/// flags it significant).
fn is_leaf(e: &kvm_cpuid_entry2, leaf: u32) -> bool {
    e.function == leaf && (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == 0)
}

/// MSRs in restore order: as KVM lists them, the TSC deadline last.
fn restore_order(mut indices: Vec<u32>) -> Vec<u32> {
    if let Some(at) = indices.iter().position(|i| *i == MSR_IA32_TSC_DEADLINE) {
        let deadline = indices.remove(at);
        indices.push(deadline);
    }
    indices
}

/// Reads every listed MSR the vCPU has; KVM stops at the first it cannot
/// read, which is skipped.
fn read_msrs(fd: &VcpuFd, index: u8, list: &[u32]) -> Result<Vec<kvm_msr_entry>, CpuStateError> {
    let mut out = Vec::with_capacity(list.len());
    let mut rest: Vec<u32> = restore_order(list.to_vec());
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| CpuStateError::TooLarge("MSR"))?;
        let read = fd
            .get_msrs(&mut msrs)
            .map_err(|source| CpuStateError::Get {
                what: "MSRs",
                index,
                source,
            })?;
        out.extend_from_slice(&msrs.as_slice()[..read]);
        // Skip the one that failed.
        rest.drain(..(read + 1).min(rest.len()));
    }
    Ok(out)
}

impl VcpuState {
    /// Saves vCPU `index`'s state, given the CPUID it was set up with; it
    /// must not be running.
    pub fn save(
        fd: &VcpuFd,
        index: u8,
        cpuid: &[kvm_cpuid_entry2],
        host: &HostCpu,
    ) -> Result<Self, CpuStateError> {
        check_xsave(host)?;
        let get = |what| {
            move |source| CpuStateError::Get {
                what,
                index,
                source,
            }
        };
        let mp_state = fd.get_mp_state().map_err(get("MP state"))?;
        let regs = fd.get_regs().map_err(get("registers"))?;
        let sregs = fd.get_sregs().map_err(get("special registers"))?;
        let xsave = fd.get_xsave().map_err(get("XSAVE state"))?;
        let xcrs = if host.has_xcrs {
            Some(fd.get_xcrs().map_err(get("XCRs"))?)
        } else {
            None
        };
        let debugregs = fd.get_debug_regs().map_err(get("debug registers"))?;
        let lapic = fd.get_lapic().map_err(get("LAPIC"))?;
        let tsc_khz = fd.get_tsc_khz().ok();
        let cpuid = cpuid.to_vec();
        let msrs = read_msrs(fd, index, &host.msr_indices)?;
        let events = fd.get_vcpu_events().map_err(get("events"))?;
        Ok(Self {
            cpuid,
            msrs,
            regs,
            sregs,
            xsave,
            xcrs,
            debugregs,
            lapic,
            mp_state,
            events,
            tsc_khz,
        })
    }

    /// Whether this host can take the state: every feature bit the vCPU was
    /// given is one a vCPU built here with the same `template` gets, every
    /// MSR is one KVM restores. Checked before any vCPU is touched.
    pub fn check_host(
        &self,
        host: &HostCpu,
        template: CpuTemplate,
        topo: VcpuTopology,
    ) -> Result<(), CpuStateError> {
        check_xsave(host)?;
        let mut here = host.supported.as_slice().to_vec();
        apply_template(template, &mut here, topo);
        for &(leaf, not_features) in &FEATURE_LEAVES {
            let Some(saved) = self.cpuid.iter().find(|e| is_leaf(e, leaf)) else {
                continue;
            };
            let offered = here
                .iter()
                .find(|e| is_leaf(e, leaf))
                .copied()
                .unwrap_or_default();
            let registers = [
                ("ebx", saved.ebx, offered.ebx),
                ("ecx", saved.ecx, offered.ecx),
                ("edx", saved.edx, offered.edx),
            ];
            for ((register, s, o), skip) in registers.into_iter().zip(not_features) {
                let missing = s & !o & !skip;
                if missing != 0 {
                    return Err(CpuStateError::CpuidFeatures {
                        leaf,
                        register,
                        missing,
                    });
                }
            }
        }
        if let Some(m) = self
            .msrs
            .iter()
            .find(|m| !host.msr_indices.contains(&m.index))
        {
            return Err(CpuStateError::UnknownMsr(m.index));
        }
        Ok(())
    }

    /// Sets the whole state on fresh vCPU `index` (checked with
    /// [`VcpuState::check_host`] first).
    pub fn restore(&self, fd: &VcpuFd, index: u8, host: &HostCpu) -> Result<(), CpuStateError> {
        check_xsave(host)?;
        let set = |what| {
            move |source| CpuStateError::Set {
                what,
                index,
                source,
            }
        };
        let cpuid =
            CpuId::from_entries(&self.cpuid).map_err(|_| CpuStateError::TooLarge("CPUID"))?;
        fd.set_cpuid2(&cpuid).map_err(set("CPUID"))?;
        if let Some(khz) = self.tsc_khz {
            if fd.get_tsc_khz().ok() != Some(khz) {
                fd.set_tsc_khz(khz).map_err(set("TSC frequency"))?;
            }
        }
        fd.set_mp_state(self.mp_state).map_err(set("MP state"))?;
        fd.set_regs(&self.regs).map_err(set("registers"))?;
        fd.set_sregs(&self.sregs)
            .map_err(set("special registers"))?;
        // SAFETY: check_xsave made sure the host's XSAVE area fits the
        // kvm_xsave we pass, so the kernel reads only within it.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(set("XSAVE state"))?;
        if let Some(xcrs) = &self.xcrs {
            fd.set_xcrs(xcrs).map_err(set("XCRs"))?;
        }
        fd.set_debug_regs(&self.debugregs)
            .map_err(set("debug registers"))?;
        fd.set_lapic(&self.lapic).map_err(set("LAPIC"))?;
        let msrs = Msrs::from_entries(&self.msrs).map_err(|_| CpuStateError::TooLarge("MSR"))?;
        let accepted = fd.set_msrs(&msrs).map_err(set("MSRs"))?;
        if accepted != self.msrs.len() {
            return Err(CpuStateError::PartialMsrs {
                index,
                accepted,
                wanted: self.msrs.len(),
            });
        }
        fd.set_vcpu_events(&self.events).map_err(set("events"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(msrs: &[u32], leaf1_ecx: u32) -> HostCpu {
        HostCpu {
            msr_indices: msrs.to_vec(),
            supported: CpuId::from_entries(&[kvm_cpuid_entry2 {
                function: 1,
                ecx: leaf1_ecx,
                ..Default::default()
            }])
            .unwrap(),
            has_xcrs: true,
            xsave_size: 0,
        }
    }

    fn state(msrs: &[u32], leaf1_ecx: u32) -> VcpuState {
        VcpuState {
            cpuid: vec![kvm_cpuid_entry2 {
                function: 1,
                ecx: leaf1_ecx,
                ebx: 0xff00_0000,
                ..Default::default()
            }],
            msrs: msrs
                .iter()
                .map(|&index| kvm_msr_entry {
                    index,
                    ..Default::default()
                })
                .collect(),
            regs: Default::default(),
            sregs: Default::default(),
            xsave: Default::default(),
            xcrs: None,
            debugregs: Default::default(),
            lapic: Default::default(),
            mp_state: Default::default(),
            events: Default::default(),
            tsc_khz: None,
        }
    }

    #[test]
    fn tsc_deadline_is_restored_last() {
        assert_eq!(
            restore_order(vec![0x10, MSR_IA32_TSC_DEADLINE, 0x174]),
            vec![0x10, 0x174, MSR_IA32_TSC_DEADLINE]
        );
    }

    #[test]
    fn host_checks_features_and_msrs() {
        let check = |s: VcpuState, h: HostCpu| {
            s.check_host(
                &h,
                CpuTemplate::Standard,
                VcpuTopology { index: 0, count: 1 },
            )
        };
        assert!(check(state(&[0x10], 0b101), host(&[0x10, 0x11], 0b111)).is_ok());
        assert!(matches!(
            check(state(&[0x10], 0b101), host(&[0x10], 0b001)),
            Err(CpuStateError::CpuidFeatures {
                leaf: 1,
                register: "ecx",
                missing: 0b100
            })
        ));
        // OSXSAVE follows the guest's CR4: never a reason to refuse.
        assert!(check(state(&[0x10], 1 << 27), host(&[0x10], 0)).is_ok());
        assert!(matches!(
            check(state(&[0x10, 0x99], 0), host(&[0x10], 0)),
            Err(CpuStateError::UnknownMsr(0x99))
        ));
        let mut big = host(&[], 0);
        big.xsave_size = 8192;
        assert!(matches!(
            check(state(&[], 0), big),
            Err(CpuStateError::XsaveTooLarge(8192))
        ));
    }

    #[test]
    fn state_round_trips_through_the_format() {
        let mut s = state(&[0x10, 0x11], 3);
        s.regs.rip = 0xdead;
        s.lapic.regs[0x20] = 5;
        let file = super::super::format::encode(&s).unwrap();
        let back: VcpuState = super::super::format::decode(&file).unwrap();
        assert_eq!(back.regs.rip, 0xdead);
        assert_eq!(back.lapic.regs[0x20], 5);
        assert_eq!(back.msrs.len(), 2);
        assert_eq!(back.cpuid[0].ecx, 3);
    }
}
