//! The Intel MultiProcessor Specification 1.4 table: how a kernel without
//! ACPI learns the vCPUs, the IO-APIC and the IRQ routing. Without it a 6.1
//! kernel also scans the BIOS area for seconds (HOST-NOTES).

use vm_memory::{Bytes, GuestAddress};

use crate::layout::{
    APIC_START, EBDA_START, IOAPIC_PINS, IOAPIC_START, LOW_RAM_END, MPTABLE_START,
};
use crate::memory::GuestMemory;

// The table sits outside the RAM the e820 map reports, so the kernel keeps it.
const _: () = assert!(MPTABLE_START >= LOW_RAM_END);

/// Most vCPUs whose entries fit in the EBDA below 640 KiB.
pub const MAX_VCPUS: u8 = 32;

const FLOATING_POINTER_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const PROCESSOR_ENTRY_LEN: usize = 20;
const SMALL_ENTRY_LEN: usize = 8;
const SPEC_REV: u8 = 4;
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;
/// Family 6 signature and FPU + APIC feature flags for processor entries.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

/// Why the MP table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    /// More vCPUs than entries fit.
    #[error("{0} vCPUs do not fit in the MP table (at most {MAX_VCPUS})")]
    TooManyVcpus(u8),
    /// Zero vCPUs.
    #[error("a guest needs at least one vCPU")]
    NoVcpus,
    /// The table did not fit in guest memory.
    #[error("could not write the MP table into guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// The whole table (floating pointer followed by the configuration table)
/// as it is placed at [`MPTABLE_START`].
pub fn build(vcpus: u8) -> Result<Vec<u8>, MpTableError> {
    if vcpus == 0 {
        return Err(MpTableError::NoVcpus);
    }
    if vcpus > MAX_VCPUS {
        return Err(MpTableError::TooManyVcpus(vcpus));
    }
    let ioapic_id = vcpus;
    let config_start = MPTABLE_START + FLOATING_POINTER_LEN as u64;

    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..vcpus {
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOTSTRAP } else { 0 };
        entries.extend_from_slice(&[ENTRY_PROCESSOR, cpu, LAPIC_VERSION, flags]);
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[ENTRY_BUS, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    count += 1;
    for pin in 0..IOAPIC_PINS as u8 {
        // Conforming polarity and trigger (flags 0); ISA IRQ n on pin n.
        entries.extend_from_slice(&[
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            0,
            0,
            0,
            pin,
            ioapic_id,
            pin,
        ]);
        count += 1;
    }
    // LINT0 of every LAPIC is ExtINT, LINT1 is NMI (0xff: all LAPICs).
    entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, INT_TYPE_EXTINT, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, INT_TYPE_NMI, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    debug_assert_eq!(
        entries.len(),
        usize::from(vcpus) * PROCESSOR_ENTRY_LEN
            + usize::from(count - u16::from(vcpus)) * SMALL_ENTRY_LEN
    );
    let table_len = HEADER_LEN + entries.len();
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(b"PCMP");
    header.extend_from_slice(&(table_len as u16).to_le_bytes());
    header.push(SPEC_REV);
    header.push(0); // checksum, below
    header.extend_from_slice(b"MCRAGENT");
    header.extend_from_slice(b"microagent  ");
    header.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    header.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&(APIC_START as u32).to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes()); // extended table length
    header.extend_from_slice(&[0, 0]); // extended checksum, reserved
    debug_assert_eq!(header.len(), HEADER_LEN);

    let mut config = header;
    config.extend_from_slice(&entries);
    config[7] = checksum(&config);

    let mut fp = Vec::with_capacity(FLOATING_POINTER_LEN);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&(config_start as u32).to_le_bytes());
    fp.push(1); // length in 16-byte units
    fp.push(SPEC_REV);
    fp.push(0); // checksum, below
    fp.extend_from_slice(&[0; 5]); // feature bytes: no default config, virtual wire mode
    fp[10] = checksum(&fp);

    let mut table = fp;
    table.extend_from_slice(&config);
    debug_assert!(MPTABLE_START + table.len() as u64 <= EBDA_START + 0x400);
    Ok(table)
}

/// Builds the table for `vcpus` and writes it at [`MPTABLE_START`].
pub fn write(mem: &GuestMemory, vcpus: u8) -> Result<(), MpTableError> {
    let table = build(vcpus)?;
    mem.write_slice(&table, GuestAddress(MPTABLE_START))
        .map_err(MpTableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn checksums_are_valid() {
        for vcpus in [1, 2, 7, MAX_VCPUS] {
            let table = build(vcpus).unwrap();
            assert_eq!(&table[..4], b"_MP_");
            assert_eq!(sum(&table[..16]), 0, "floating pointer checksum");
            let config = &table[16..];
            assert_eq!(&config[..4], b"PCMP");
            let len = u16::from_le_bytes([config[4], config[5]]) as usize;
            assert_eq!(len, config.len());
            assert_eq!(sum(config), 0, "config table checksum");
        }
    }

    #[test]
    fn points_at_its_config_table_and_counts_entries() {
        let table = build(2).unwrap();
        let ptr = u32::from_le_bytes(table[4..8].try_into().unwrap()) as u64;
        assert_eq!(ptr, MPTABLE_START + 16);
        let count = u16::from_le_bytes([table[16 + 34], table[16 + 35]]);
        assert_eq!(count, 2 + 1 + 1 + 24 + 2);
        // The first processor entry is the enabled bootstrap CPU.
        assert_eq!(
            &table[16 + 44..16 + 48],
            &[
                ENTRY_PROCESSOR,
                0,
                LAPIC_VERSION,
                CPU_ENABLED | CPU_BOOTSTRAP
            ]
        );
        assert_eq!(table[16 + 64 + 3], CPU_ENABLED);
    }

    #[test]
    fn fits_in_the_ebda_at_the_maximum() {
        assert!(build(MAX_VCPUS).unwrap().len() <= 0x400);
        assert!(matches!(
            build(MAX_VCPUS + 1),
            Err(MpTableError::TooManyVcpus(_))
        ));
        assert!(matches!(build(0), Err(MpTableError::NoVcpus)));
    }
}
