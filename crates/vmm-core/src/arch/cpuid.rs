//! CPUID the guest sees: KVM_GET_SUPPORTED_CPUID filtered through a named
//! template, never passed through blindly, plus per-vCPU topology.

use kvm_bindings::kvm_cpuid_entry2;

/// A named CPUID policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuTemplate {
    /// What KVM supports, with topology and the hypervisor bit set.
    Standard,
    /// For hosts whose KVM emulates guest kernel mode: also hides features
    /// the host's instruction emulator cannot execute (CX16, XSAVE and what
    /// needs it, SMAP, POPCNT; see HOST-NOTES).
    Compat,
}

impl CpuTemplate {
    /// The template's stable name.
    pub fn name(self) -> &'static str {
        match self {
            CpuTemplate::Standard => "standard",
            CpuTemplate::Compat => "compat",
        }
    }

    /// Parses a stable name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "standard" => Some(CpuTemplate::Standard),
            "compat" => Some(CpuTemplate::Compat),
            _ => None,
        }
    }
}

impl std::fmt::Display for CpuTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Leaf 1 ECX bits.
mod leaf1_ecx {
    pub const FMA: u32 = 1 << 12;
    pub const CX16: u32 = 1 << 13;
    pub const POPCNT: u32 = 1 << 23;
    pub const XSAVE: u32 = 1 << 26;
    pub const OSXSAVE: u32 = 1 << 27;
    pub const AVX: u32 = 1 << 28;
    pub const F16C: u32 = 1 << 29;
    pub const HYPERVISOR: u32 = 1 << 31;
}
/// Leaf 1 EDX bits.
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaf 7 subleaf 0 EBX bits.
mod leaf7_ebx {
    pub const AVX2: u32 = 1 << 5;
    pub const AVX512F: u32 = 1 << 16;
    pub const AVX512DQ: u32 = 1 << 17;
    pub const SMAP: u32 = 1 << 20;
    pub const AVX512IFMA: u32 = 1 << 21;
    pub const AVX512PF: u32 = 1 << 26;
    pub const AVX512ER: u32 = 1 << 27;
    pub const AVX512CD: u32 = 1 << 28;
    pub const AVX512BW: u32 = 1 << 30;
    pub const AVX512VL: u32 = 1 << 31;
}
/// Leaf 7 subleaf 0 ECX bits.
mod leaf7_ecx {
    pub const PKU: u32 = 1 << 3;
    pub const OSPKE: u32 = 1 << 4;
}
/// KVM paravirtual feature bits (leaf 0x4000_0001 EAX) whose guest side is a
/// hypercall; an emulating host hangs on them (seen with PV IPIs on 2 vCPUs).
mod kvm_features {
    pub const PV_UNHALT: u32 = 1 << 7;
    pub const PV_SEND_IPI: u32 = 1 << 11;
    pub const PV_SCHED_YIELD: u32 = 1 << 13;
}
const KVM_FEATURES_LEAF: u32 = 0x4000_0001;
const COMPAT_KVM_FEATURES_CLEAR: u32 =
    kvm_features::PV_UNHALT | kvm_features::PV_SEND_IPI | kvm_features::PV_SCHED_YIELD;
/// Leaf 0x8000_0001 ECX bits.
const EXT_ECX_ABM: u32 = 1 << 5;

const COMPAT_LEAF1_ECX_CLEAR: u32 = leaf1_ecx::FMA
    | leaf1_ecx::CX16
    | leaf1_ecx::POPCNT
    | leaf1_ecx::XSAVE
    | leaf1_ecx::OSXSAVE
    | leaf1_ecx::AVX
    | leaf1_ecx::F16C;
const COMPAT_LEAF7_EBX_CLEAR: u32 = leaf7_ebx::AVX2
    | leaf7_ebx::AVX512F
    | leaf7_ebx::AVX512DQ
    | leaf7_ebx::SMAP
    | leaf7_ebx::AVX512IFMA
    | leaf7_ebx::AVX512PF
    | leaf7_ebx::AVX512ER
    | leaf7_ebx::AVX512CD
    | leaf7_ebx::AVX512BW
    | leaf7_ebx::AVX512VL;
const COMPAT_LEAF7_ECX_CLEAR: u32 = leaf7_ecx::PKU | leaf7_ecx::OSPKE;

/// XSAVE state components a compat guest's leaf 0xD lists, where the host
/// has them: x87, SSE, AVX (YMM_Hi128), and AVX-512's opmask, ZMM_Hi256
/// and Hi16_ZMM. Guest user mode uses all of these with the host's XCR0;
/// KVM_GET_XSAVE carries only the components listed, and the VMM switches
/// them for the compat kernel (crate::xstate_switch).
const COMPAT_XSTATE_COMPONENTS: u32 = 0b1110_0111;
/// The user state components beyond x87 and SSE of that list.
const COMPAT_EXTENDED_COMPONENTS: [u32; 4] = [2, 5, 6, 7];
/// Bytes of the legacy XSAVE area and the XSAVE header.
const XSAVE_LEGACY_AND_HEADER: u32 = 512 + 64;

/// Where the vCPU sits in the guest's topology.
#[derive(Clone, Copy, Debug)]
pub struct VcpuTopology {
    /// This vCPU's index, which is also its APIC ID.
    pub index: u8,
    /// Number of vCPUs in the guest (one core each, one socket).
    pub count: u8,
}

/// The standard-format XSAVE size of the components a compat guest lists:
/// the end of the last one the host describes (sub-leaf EAX size, EBX
/// offset), at least the legacy area and header.
fn compat_xsave_size(entries: &[kvm_cpuid_entry2]) -> u32 {
    let host_components = entries
        .iter()
        .find(|e| e.function == 0xd && e.index == 0)
        .map_or(0, |e| e.eax);
    entries
        .iter()
        .filter(|e| {
            e.function == 0xd
                && COMPAT_EXTENDED_COMPONENTS.contains(&e.index)
                && host_components & (1 << e.index) != 0
        })
        .map(|e| e.ebx.saturating_add(e.eax))
        .fold(XSAVE_LEGACY_AND_HEADER, u32::max)
}

/// Bits needed to number `count` items (x2APIC ID shift).
fn id_bits(count: u8) -> u32 {
    (u32::from(count).max(1))
        .next_power_of_two()
        .trailing_zeros()
}

/// Filters `entries` (from KVM_GET_SUPPORTED_CPUID) for one vCPU.
pub fn apply_template(template: CpuTemplate, entries: &mut [kvm_cpuid_entry2], topo: VcpuTopology) {
    let apic_id = u32::from(topo.index);
    let compat_xsave_size = compat_xsave_size(entries);
    for e in entries.iter_mut() {
        match (e.function, e.index) {
            (0x1, _) => {
                e.ecx |= leaf1_ecx::HYPERVISOR;
                // EBX[31:24] initial APIC ID, EBX[23:16] logical processors per package.
                e.ebx = (e.ebx & 0x0000_ffff) | (apic_id << 24) | (u32::from(topo.count) << 16);
                if topo.count > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                } else {
                    e.edx &= !LEAF1_EDX_HTT;
                }
                if template == CpuTemplate::Compat {
                    e.ecx &= !COMPAT_LEAF1_ECX_CLEAR;
                }
            }
            (0x4, _) => {
                // EAX[31:26]: cores per package minus one.
                e.eax = (e.eax & 0x03ff_ffff) | ((u32::from(topo.count).max(1) - 1) << 26);
            }
            (0x7, 0) if template == CpuTemplate::Compat => {
                e.ebx &= !COMPAT_LEAF7_EBX_CLEAR;
                e.ecx &= !COMPAT_LEAF7_ECX_CLEAR;
            }
            (0xb, sub) | (0x1f, sub) => {
                // Extended topology: level 0 SMT (one thread per core), level 1 core.
                e.edx = apic_id;
                match sub {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = id_bits(topo.count);
                        e.ebx = u32::from(topo.count);
                        e.ecx = 1 | (2 << 8);
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = sub;
                    }
                }
            }
            // The compat kernel never uses XSAVE (`noxsave`), but KVM
            // reports only the state components listed here in KVM_GET_XSAVE,
            // and the extended user state must be there (crate::xstate_switch).
            (0xd, 0) if template == CpuTemplate::Compat => {
                e.eax &= COMPAT_XSTATE_COMPONENTS;
                e.ebx = compat_xsave_size;
                e.ecx = compat_xsave_size;
                e.edx = 0;
            }
            (0xd, sub)
                if template == CpuTemplate::Compat && COMPAT_EXTENDED_COMPONENTS.contains(&sub) => {
            }
            (0xd, _) if template == CpuTemplate::Compat => {
                e.eax = 0;
                e.ebx = 0;
                e.ecx = 0;
                e.edx = 0;
            }
            (KVM_FEATURES_LEAF, _) if template == CpuTemplate::Compat => {
                e.eax &= !COMPAT_KVM_FEATURES_CLEAR;
            }
            (0x8000_0001, _) if template == CpuTemplate::Compat => {
                // ABM/LZCNT travel with POPCNT in the kernel's feature checks.
                e.ecx &= !EXT_ECX_ABM;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: u32::MAX,
            ebx: u32::MAX,
            ecx: u32::MAX,
            edx: u32::MAX,
            ..Default::default()
        }
    }

    fn supported() -> Vec<kvm_cpuid_entry2> {
        vec![
            leaf(0x1, 0),
            leaf(0x4, 0),
            leaf(0x7, 0),
            leaf(0xb, 0),
            leaf(0xb, 1),
            leaf(0xb, 2),
            leaf(0xd, 0),
            leaf(0xd, 1),
            leaf(0xd, 2),
            leaf(0xd, 5),
            leaf(0xd, 6),
            leaf(0xd, 7),
            leaf(0xd, 9),
            leaf(0x8000_0001, 0),
            leaf(0x4000_0001, 0),
        ]
    }

    fn find(entries: &[kvm_cpuid_entry2], function: u32, index: u32) -> kvm_cpuid_entry2 {
        *entries
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    #[test]
    fn standard_keeps_features_and_sets_topology() {
        let mut entries = supported();
        apply_template(
            CpuTemplate::Standard,
            &mut entries,
            VcpuTopology { index: 2, count: 4 },
        );
        let l1 = find(&entries, 1, 0);
        assert_eq!(l1.ebx >> 24, 2);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_ne!(l1.ecx & leaf1_ecx::CX16, 0);
        assert_ne!(l1.ecx & leaf1_ecx::HYPERVISOR, 0);
        assert_eq!(find(&entries, 0xb, 1).eax, 2);
        assert_eq!(find(&entries, 0xb, 1).edx, 2);
        assert_eq!(find(&entries, 0xd, 0).eax, u32::MAX);
        assert_eq!(
            find(&entries, KVM_FEATURES_LEAF, 0).eax,
            u32::MAX,
            "KVM leaves are kept"
        );
    }

    /// Leaf 0xD as an AVX-512 AMD host describes it: x87, SSE, AVX, the
    /// three AVX-512 components and PKRU, each (size, offset).
    fn with_avx512_xsave(entries: &mut [kvm_cpuid_entry2]) {
        for e in entries.iter_mut().filter(|e| e.function == 0xd) {
            let (eax, ebx) = match e.index {
                0 => (0x2e7, 2440),
                2 => (256, 576),
                5 => (64, 832),
                6 => (512, 896),
                7 => (1024, 1408),
                9 => (8, 2432),
                _ => continue,
            };
            (e.eax, e.ebx) = (eax, ebx);
        }
    }

    #[test]
    fn compat_hides_what_the_emulator_cannot_run() {
        let mut entries = supported();
        with_avx512_xsave(&mut entries);
        apply_template(
            CpuTemplate::Compat,
            &mut entries,
            VcpuTopology { index: 0, count: 1 },
        );
        let l1 = find(&entries, 1, 0);
        for bit in [
            leaf1_ecx::CX16,
            leaf1_ecx::XSAVE,
            leaf1_ecx::OSXSAVE,
            leaf1_ecx::POPCNT,
            leaf1_ecx::AVX,
        ] {
            assert_eq!(l1.ecx & bit, 0, "bit {bit:#x} still set");
        }
        assert_eq!(l1.edx & LEAF1_EDX_HTT, 0);
        let l7 = find(&entries, 7, 0);
        assert_eq!(l7.ebx & leaf7_ebx::SMAP, 0);
        assert_eq!(l7.ebx & leaf7_ebx::AVX2, 0);
        assert_ne!(l7.ebx & (1 << 0), 0, "unrelated features stay");
        assert_eq!(find(&entries, 0xd, 1).eax, 0, "no XSAVEOPT/XSAVEC/XSAVES");
        // The user state guest processes use stays listed (PKRU does not),
        // so KVM_GET_XSAVE carries what the VMM switches for the compat
        // kernel; the size ends with Hi16_ZMM.
        let xsave = find(&entries, 0xd, 0);
        assert_eq!(
            (xsave.eax, xsave.ebx, xsave.ecx, xsave.edx),
            (0xe7, 2432, 2432, 0)
        );
        for sub in [2, 5, 6, 7] {
            assert_ne!(find(&entries, 0xd, sub).eax, 0, "layout of {sub} kept");
        }
        assert_eq!(find(&entries, 0xd, 9).eax, 0, "PKRU layout gone");
        assert_eq!(find(&entries, 0x8000_0001, 0).ecx & EXT_ECX_ABM, 0);
        let kvm = find(&entries, KVM_FEATURES_LEAF, 0);
        assert_eq!(
            kvm.eax & kvm_features::PV_SEND_IPI,
            0,
            "no hypercall-based IPIs"
        );
        assert_ne!(kvm.eax & 1, 0, "kvm-clock stays");
    }

    #[test]
    fn topology_id_bits() {
        assert_eq!(id_bits(1), 0);
        assert_eq!(id_bits(2), 1);
        assert_eq!(id_bits(3), 2);
        assert_eq!(id_bits(32), 5);
    }

    #[test]
    fn template_names_round_trip() {
        for t in [CpuTemplate::Standard, CpuTemplate::Compat] {
            assert_eq!(CpuTemplate::from_name(t.name()), Some(t));
        }
        assert_eq!(CpuTemplate::from_name("fast"), None);
    }
}
