//! The Linux zero page (`struct boot_params`): the e820 memory map, the
//! command line and initrd locations, and the loader identification.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{Bytes, GuestAddress};

use crate::layout::{
    CMDLINE_START, HIMEM_START, KERNEL_ALIGNMENT, LOW_RAM_END, MMIO_GAP_END, MMIO_GAP_START,
    ZERO_PAGE_START,
};
use crate::memory::GuestMemory;

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// "HdrS", the setup header signature.
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"HdrS");
/// Boot loader type "undefined" (we are not one of the registered loaders).
const LOADER_TYPE_UNDEFINED: u8 = 0xff;

/// Why the zero page could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BootParamsError {
    /// More RAM ranges than the zero page holds (cannot happen with our layout).
    #[error("too many e820 entries")]
    TooManyE820Entries,
    /// The zero page did not fit in guest memory.
    #[error("could not write the zero page into guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

/// Where an initrd was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdPlacement {
    /// Guest-physical start.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The usable RAM ranges reported to the kernel for a guest of `mem_size` bytes:
/// low memory below the EBDA, then everything from 1 MiB up, around the MMIO hole.
pub fn e820_ram(mem_size: u64) -> Vec<(u64, u64)> {
    let mut ram = vec![(0, LOW_RAM_END)];
    if mem_size <= MMIO_GAP_START {
        ram.push((HIMEM_START, mem_size - HIMEM_START));
    } else {
        ram.push((HIMEM_START, MMIO_GAP_START - HIMEM_START));
        ram.push((MMIO_GAP_END, mem_size - MMIO_GAP_START));
    }
    ram
}

/// Fills a zero page. `setup_header` is a bzImage's own header (None for ELF).
pub fn build(
    mem_size: u64,
    setup_header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<InitrdPlacement>,
) -> Result<boot_params, BootParamsError> {
    let mut params = boot_params::default();
    match setup_header {
        Some(hdr) => params.hdr = hdr,
        None => params.hdr.kernel_alignment = KERNEL_ALIGNMENT as u32,
    }
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = HEADER_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    if let Some(initrd) = initrd {
        params.hdr.ramdisk_image = initrd.addr as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
    }
    let ram = e820_ram(mem_size);
    if ram.len() > params.e820_table.len() {
        return Err(BootParamsError::TooManyE820Entries);
    }
    for (slot, (addr, size)) in params.e820_table.iter_mut().zip(&ram) {
        *slot = boot_e820_entry {
            addr: *addr,
            size: *size,
            r#type: E820_RAM,
        };
    }
    params.e820_entries = ram.len() as u8;
    Ok(params)
}

/// Writes the zero page at [`ZERO_PAGE_START`].
pub fn write(mem: &GuestMemory, params: &boot_params) -> Result<(), BootParamsError> {
    mem.write_obj(*params, GuestAddress(ZERO_PAGE_START))
        .map_err(BootParamsError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_small_guest() {
        assert_eq!(
            e820_ram(64 << 20),
            vec![(0, 0x9fc00), (0x10_0000, (64 << 20) - 0x10_0000)]
        );
    }

    #[test]
    fn e820_large_guest_skips_hole() {
        let size = 5u64 << 30;
        let ram = e820_ram(size);
        assert_eq!(ram.len(), 3);
        assert_eq!(ram[1].0 + ram[1].1, MMIO_GAP_START);
        assert_eq!(ram[2].0, MMIO_GAP_END);
        let total: u64 = ram.iter().map(|r| r.1).sum();
        // Everything but the legacy hole between 640 KiB and 1 MiB is RAM.
        assert_eq!(total, size - (HIMEM_START - LOW_RAM_END));
    }

    #[test]
    fn elf_zero_page() {
        let initrd = InitrdPlacement {
            addr: 0x300_0000,
            size: 4096,
        };
        let p = build(64 << 20, None, 42, Some(initrd)).unwrap();
        assert_eq!({ p.hdr.boot_flag }, 0xaa55);
        assert_eq!({ p.hdr.header }, HEADER_MAGIC);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!({ p.hdr.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ p.hdr.cmdline_size }, 42);
        assert_eq!({ p.hdr.ramdisk_image }, 0x300_0000);
        assert_eq!({ p.hdr.ramdisk_size }, 4096);
        assert_eq!({ p.hdr.kernel_alignment }, KERNEL_ALIGNMENT as u32);
        assert_eq!(p.e820_entries, 2);
        assert_eq!({ p.e820_table[1].addr }, HIMEM_START);
        assert_eq!({ p.e820_table[1].r#type }, E820_RAM);
    }

    #[test]
    fn bzimage_header_is_kept() {
        let hdr = setup_header {
            version: 0x20f,
            xloadflags: 1,
            ..Default::default()
        };
        let p = build(64 << 20, Some(hdr), 10, None).unwrap();
        assert_eq!({ p.hdr.version }, 0x20f);
        assert_eq!({ p.hdr.xloadflags }, 1);
        assert_eq!({ p.hdr.ramdisk_image }, 0);
    }

    #[test]
    fn zero_page_lands_in_memory() {
        let mem = crate::memory::create_guest_memory(16).unwrap();
        let p = build(16 << 20, None, 1, None).unwrap();
        write(&mem, &p).unwrap();
        let back: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap();
        assert_eq!({ back.hdr.header }, HEADER_MAGIC);
    }
}
