//! Register state of a vCPU entering a 64-bit kernel (or a probe guest):
//! general registers, control and segment registers, FPU, MSRs and LAPIC.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_regs, kvm_sregs, Msrs};
use vm_memory::{Bytes, GuestAddress};

use super::gdt::{BOOT_GDT, CODE_INDEX, DATA_INDEX, TSS_INDEX};
use crate::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PML4_START, ZERO_PAGE_START,
};
use crate::memory::GuestMemory;

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1 always reads as one.
const RFLAGS_FIXED: u64 = 1 << 1;

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const APIC_DELIVERY_MODE_MASK: u32 = 0x700;
const APIC_MODE_EXTINT: u32 = 0x7 << 8;
const APIC_MODE_NMI: u32 = 0x4 << 8;

/// Why the boot register state could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// The GDT or IDT did not fit in guest memory.
    #[error("could not write the boot descriptor tables into guest memory")]
    WriteDescriptorTables(#[source] vm_memory::GuestMemoryError),
    /// The MSR list could not be built.
    #[error("could not build the boot MSR list")]
    BuildMsrs(#[source] vmm_sys_util::fam::Error),
}

/// General registers at the kernel's 64-bit entry point: RSI points at the
/// zero page, as the boot protocol requires.
pub fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rflags: RFLAGS_FIXED,
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    }
}

/// Writes the boot GDT and an empty IDT into guest memory.
pub fn write_descriptor_tables(mem: &GuestMemory) -> Result<(), RegsError> {
    for (i, desc) in BOOT_GDT.iter().enumerate() {
        mem.write_obj(desc.encode(), GuestAddress(BOOT_GDT_START + i as u64 * 8))
            .map_err(RegsError::WriteDescriptorTables)?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(RegsError::WriteDescriptorTables)
}

/// Puts `sregs` (as read from a fresh vCPU) into 64-bit long mode with the
/// boot GDT and the identity mapping loaded.
pub fn set_long_mode_sregs(sregs: &mut kvm_sregs) {
    let gdt_len = (BOOT_GDT.len() * 8) as u16;
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = gdt_len - 1;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;

    let code = BOOT_GDT[CODE_INDEX as usize].to_kvm_segment(CODE_INDEX);
    let data = BOOT_GDT[DATA_INDEX as usize].to_kvm_segment(DATA_INDEX);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = BOOT_GDT[TSS_INDEX as usize].to_kvm_segment(TSS_INDEX);

    sregs.cr3 = PML4_START;
    sregs.cr4 |= CR4_PAE;
    sregs.cr0 |= CR0_PE | CR0_ET | CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
}

/// x87 and SSE control words as after FNINIT / reset.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

/// The MSR values a vCPU starts with.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ]
}

/// The boot MSRs as the FAM wrapper KVM_SET_MSRS takes.
pub fn boot_msrs() -> Result<Msrs, RegsError> {
    Msrs::from_entries(&boot_msr_entries()).map_err(RegsError::BuildMsrs)
}

fn lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i] as u8);
    u32::from_le_bytes(bytes)
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[offset + i] = *b as _;
    }
}

/// Wires LINT0 as ExtINT (the legacy PIC) and LINT1 as NMI, as a PC BIOS does.
pub fn set_lapic_lints(lapic: &mut kvm_lapic_state) {
    let lint0 = lapic_reg(lapic, APIC_LVT_LINT0);
    set_lapic_reg(
        lapic,
        APIC_LVT_LINT0,
        (lint0 & !APIC_DELIVERY_MODE_MASK) | APIC_MODE_EXTINT,
    );
    let lint1 = lapic_reg(lapic, APIC_LVT_LINT1);
    set_lapic_reg(
        lapic,
        APIC_LVT_LINT1,
        (lint1 & !APIC_DELIVERY_MODE_MASK) | APIC_MODE_NMI,
    );
}

/// A one-line summary of the registers that matter when a guest dies.
pub fn describe(regs: &kvm_regs, sregs: &kvm_sregs) -> String {
    format!(
        "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} \
         cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x} cpl={}",
        regs.rip, regs.rsp, regs.rflags, regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi,
        sregs.cr0, sregs.cr2, sregs.cr3, sregs.cr4, sregs.efer, sregs.cs.selector, sregs.cs.dpl
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    #[test]
    fn boot_regs_follow_the_64bit_protocol() {
        let regs = boot_regs(0x100_0000);
        assert_eq!(regs.rip, 0x100_0000);
        assert_eq!(regs.rsi, ZERO_PAGE_START);
        assert_eq!(regs.rflags, 2);
    }

    #[test]
    fn long_mode_sregs() {
        let mut sregs = kvm_sregs::default();
        set_long_mode_sregs(&mut sregs);
        assert_eq!(sregs.cs.selector, 0x10);
        assert_eq!(sregs.ds.selector, 0x18);
        assert_eq!(sregs.ss.selector, 0x18);
        assert_eq!(sregs.cr3, PML4_START);
        assert_ne!(sregs.cr0 & CR0_PG, 0);
        assert_ne!(sregs.cr0 & CR0_PE, 0);
        assert_ne!(sregs.cr4 & CR4_PAE, 0);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(sregs.gdt.limit, 39);
    }

    #[test]
    fn descriptor_tables_land_in_memory() {
        let mem = create_guest_memory(16).unwrap();
        write_descriptor_tables(&mem).unwrap();
        let cs: u64 = mem.read_obj(GuestAddress(BOOT_GDT_START + 16)).unwrap();
        assert_eq!(cs, BOOT_GDT[2].encode());
    }

    #[test]
    fn lints_are_extint_and_nmi() {
        let mut lapic = kvm_lapic_state::default();
        set_lapic_reg(&mut lapic, APIC_LVT_LINT0, 0x0001_0700 | 0x20);
        set_lapic_lints(&mut lapic);
        assert_eq!(
            lapic_reg(&lapic, APIC_LVT_LINT0),
            0x0001_0000 | 0x20 | APIC_MODE_EXTINT
        );
        assert_eq!(
            lapic_reg(&lapic, APIC_LVT_LINT1) & APIC_DELIVERY_MODE_MASK,
            APIC_MODE_NMI
        );
    }

    #[test]
    fn msrs_include_fast_strings() {
        let msrs = boot_msr_entries();
        assert!(msrs
            .iter()
            .any(|m| m.index == MSR_IA32_MISC_ENABLE && m.data == 1));
        assert_eq!(boot_msrs().unwrap().as_slice().len(), msrs.len());
    }
}
