//! x86_64 specifics: what a vCPU and guest memory must hold before a 64-bit
//! kernel (or a tiny probe guest) is entered.

pub mod boot_params;
pub mod cpuid;
pub mod gdt;
pub mod mptable;
pub mod paging;
pub mod regs;

use crate::memory::GuestMemory;

/// Why the boot-time tables could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BootTablesError {
    /// The identity-map page tables.
    #[error("could not write the boot page tables")]
    Paging(#[from] paging::PagingError),
    /// The GDT/IDT.
    #[error("could not write the boot descriptor tables")]
    Descriptors(#[from] regs::RegsError),
}

/// Writes the page tables and descriptor tables a long-mode boot vCPU uses.
pub fn write_boot_tables(mem: &GuestMemory) -> Result<(), BootTablesError> {
    paging::write_identity_map(mem)?;
    regs::write_descriptor_tables(mem)?;
    Ok(())
}
