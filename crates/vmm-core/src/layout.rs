//! Every guest-physical address the VMM uses, in one place.
//!
//! The low megabyte follows the x86 Linux boot protocol and the PC layout a
//! 6.1 kernel expects; RAM above 1 MiB is split around a 768 MiB hole below
//! 4 GiB that holds the MMIO devices.

/// Global descriptor table written for the boot vCPU (4 entries of 8 bytes).
pub const BOOT_GDT_START: u64 = 0x500;
/// An empty interrupt descriptor table: the kernel installs its own early.
pub const BOOT_IDT_START: u64 = 0x520;
/// Top of the stack the boot vCPU starts with (grows down, below the zero page).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// The page the boot stack lives in.
pub const BOOT_STACK_PAGE: u64 = 0x8000;
/// The Linux "zero page" (`struct boot_params`) whose address goes in RSI.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Level-4 page map of the identity mapping the kernel is entered with.
pub const PML4_START: u64 = 0x9000;
/// Page-directory-pointer table of that identity mapping.
pub const PDPTE_START: u64 = 0xa000;
/// Page directory of that identity mapping (512 entries of 2 MiB: 1 GiB).
pub const PDE_START: u64 = 0xb000;
/// Kernel command line, NUL-terminated.
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line we hand the kernel, NUL included (the 6.1 x86 limit).
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Extended BIOS data area: start of the reserved area below 640 KiB; the MP
/// table lives here, which is also where the kernel looks for it first.
pub const EBDA_START: u64 = 0x9fc00;
/// The MP floating pointer and configuration table.
pub const MPTABLE_START: u64 = EBDA_START;
/// End of the low RAM that e820 reports as usable (the VGA hole starts here).
pub const LOW_RAM_END: u64 = EBDA_START;
/// Start of high memory: a bzImage's protected-mode code loads here, and no
/// kernel may load below it.
pub const HIMEM_START: u64 = 0x10_0000;
/// Alignment (and default load address) of an ELF vmlinux: the 16 MiB of
/// CONFIG_PHYSICAL_ALIGN/START, told to the kernel in the zero page.
pub const KERNEL_ALIGNMENT: u64 = 0x100_0000;
/// Highest address (exclusive) an initrd may end at when the kernel does not
/// say otherwise (boot protocol default `initrd_addr_max` + 1).
pub const DEFAULT_INITRD_ADDR_LIMIT: u64 = 0x3800_0000;
/// Start of the MMIO hole below 4 GiB: no RAM is mapped from here to 4 GiB.
pub const MMIO_GAP_START: u64 = 0xd000_0000;
/// End of the MMIO hole (4 GiB); RAM beyond the hole continues here.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// First virtio-mmio device window; each device gets [`MMIO_DEVICE_SIZE`].
pub const MMIO_DEVICES_START: u64 = MMIO_GAP_START;
/// Size of one virtio-mmio device window.
pub const MMIO_DEVICE_SIZE: u64 = 0x1000;
/// The IO-APIC's MMIO base (fixed by KVM's in-kernel irqchip).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// Local APIC MMIO base (architectural default).
pub const APIC_START: u64 = 0xfee0_0000;
/// Three pages KVM needs for the TSS on Intel hosts, inside the MMIO hole
/// just below the identity-map page.
pub const KVM_TSS_START: u64 = 0xfffb_c000;
/// One page KVM needs for its real-mode identity map on Intel hosts.
pub const KVM_IDENTITY_MAP_START: u64 = 0xfffb_b000;
/// Where tiny test and probe guests put their code (below the zero page,
/// above the boot GDT/IDT).
pub const PROBE_CODE_START: u64 = 0x1000;
/// Where a tiny guest packaged as an ELF "kernel" ([`crate::tiny::elf_kernel`])
/// is loaded and entered: 16 MiB, above everything the boot writes.
pub const TINY_KERNEL_START: u64 = 0x100_0000;
/// A page of data for tiny guests run as a machine (a counter, say): 1 MiB
/// above their code.
pub const TINY_DATA_START: u64 = TINY_KERNEL_START + 0x10_0000;
/// Where a tiny guest asks KVM to keep its kvm-clock record (32 bytes,
/// which may not cross a page): in its data page, after the counter.
pub const TINY_PVCLOCK_START: u64 = TINY_DATA_START + 0x40;
/// Highest address the boot identity mapping covers (1 GiB).
pub const BOOT_IDENTITY_MAP_END: u64 = 0x4000_0000;

/// Legacy IRQ of COM1.
pub const SERIAL_IRQ: u32 = 4;
/// First IRQ handed to virtio-mmio devices (0-4 and 8 are legacy devices).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// Number of IO-APIC pins of KVM's in-kernel irqchip.
pub const IOAPIC_PINS: u32 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_structures_do_not_overlap() {
        let regions = [
            (BOOT_GDT_START, 4 * 8),
            (BOOT_IDT_START, 8),
            (ZERO_PAGE_START, 0x1000),
            (PML4_START, 0x1000),
            (PDPTE_START, 0x1000),
            (PDE_START, 0x1000),
            (CMDLINE_START, CMDLINE_MAX_SIZE as u64),
            (PROBE_CODE_START, 0x1000),
            (BOOT_STACK_PAGE, 0x1000),
        ];
        for (i, a) in regions.iter().enumerate() {
            assert!(a.0 + a.1 <= LOW_RAM_END, "{a:x?} past low RAM");
            for b in &regions[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
        assert!((BOOT_STACK_PAGE..BOOT_STACK_PAGE + 0x1000).contains(&BOOT_STACK_POINTER));
    }

    #[test]
    fn mmio_hole_holds_the_fixed_devices() {
        for addr in [
            IOAPIC_START,
            APIC_START,
            KVM_TSS_START,
            KVM_IDENTITY_MAP_START,
        ] {
            assert!((MMIO_GAP_START..MMIO_GAP_END).contains(&addr));
        }
        const { assert!(KVM_IDENTITY_MAP_START + 0x1000 <= KVM_TSS_START) };
    }
}
