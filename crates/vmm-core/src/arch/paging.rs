//! The identity mapping the boot vCPU starts with: the first GiB in 2 MiB
//! pages, enough for the kernel to reach its own page tables.

use vm_memory::{Bytes, GuestAddress};

use crate::layout::{BOOT_IDENTITY_MAP_END, PDE_START, PDPTE_START, PML4_START};
use crate::memory::GuestMemory;

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const PAGE_SIZE_2M: u64 = 1 << 7;
const HUGE_PAGE: u64 = 2 << 20;

/// Why the page tables could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PagingError {
    /// Guest memory does not cover the page-table pages.
    #[error("page tables do not fit in guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

/// The three tables (PML4, PDPT, PD) of the identity mapping, as 512 entries each.
pub fn identity_map_tables() -> [[u64; 512]; 3] {
    let mut pml4 = [0u64; 512];
    let mut pdpt = [0u64; 512];
    let mut pd = [0u64; 512];
    pml4[0] = PDPTE_START | PRESENT | WRITABLE;
    pdpt[0] = PDE_START | PRESENT | WRITABLE;
    for (i, entry) in pd.iter_mut().enumerate() {
        *entry = (i as u64 * HUGE_PAGE) | PRESENT | WRITABLE | PAGE_SIZE_2M;
    }
    debug_assert_eq!(512 * HUGE_PAGE, BOOT_IDENTITY_MAP_END);
    [pml4, pdpt, pd]
}

/// Writes the identity mapping; CR3 must then point at [`PML4_START`].
pub fn write_identity_map(mem: &GuestMemory) -> Result<(), PagingError> {
    let tables = identity_map_tables();
    for (table, start) in tables.iter().zip([PML4_START, PDPTE_START, PDE_START]) {
        for (i, entry) in table.iter().enumerate() {
            mem.write_obj(*entry, GuestAddress(start + i as u64 * 8))
                .map_err(PagingError::Write)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    /// Walks the tables for `addr` the way the MMU does for a 2 MiB page.
    fn translate(mem: &GuestMemory, addr: u64) -> Option<u64> {
        let pml4e: u64 = mem
            .read_obj(GuestAddress(PML4_START + ((addr >> 39) & 0x1ff) * 8))
            .ok()?;
        if pml4e & PRESENT == 0 {
            return None;
        }
        let pdpte: u64 = mem
            .read_obj(GuestAddress((pml4e & !0xfff) + ((addr >> 30) & 0x1ff) * 8))
            .ok()?;
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pde: u64 = mem
            .read_obj(GuestAddress((pdpte & !0xfff) + ((addr >> 21) & 0x1ff) * 8))
            .ok()?;
        if pde & PRESENT == 0 || pde & PAGE_SIZE_2M == 0 {
            return None;
        }
        Some((pde & !(HUGE_PAGE - 1)) + (addr & (HUGE_PAGE - 1)))
    }

    #[test]
    fn maps_first_gib_onto_itself() {
        let mem = create_guest_memory(16).unwrap();
        write_identity_map(&mem).unwrap();
        for addr in [
            0,
            0x1000,
            0x100_0000,
            0x1234_5678,
            BOOT_IDENTITY_MAP_END - 1,
        ] {
            assert_eq!(translate(&mem, addr), Some(addr));
        }
        assert_eq!(translate(&mem, BOOT_IDENTITY_MAP_END), None);
    }
}
