//! Guest RAM: anonymous host mappings laid out around the MMIO hole.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::layout::{MMIO_GAP_END, MMIO_GAP_START};

/// Guest memory as the rest of the VMM sees it.
pub type GuestMemory = GuestMemoryMmap<()>;

/// Smallest guest we accept: the kernel, its page tables and an initramfs
/// need a few MiB at the very least.
pub const MIN_MEM_MIB: u64 = 16;
/// Largest guest we accept (keeps size arithmetic far from overflow).
pub const MAX_MEM_MIB: u64 = 1 << 20;

/// Why guest memory could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The requested size is outside the accepted range.
    #[error("guest memory of {0} MiB is out of range ({MIN_MEM_MIB}..={MAX_MEM_MIB} MiB)")]
    SizeOutOfRange(u64),
    /// The host refused the mapping.
    #[error("could not map {mib} MiB of guest memory")]
    Map {
        /// Size asked for.
        mib: u64,
        /// What the mapping layer said.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
}

/// The RAM ranges for a guest of `size` bytes: one below the MMIO hole and,
/// for guests larger than that, the rest above 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, u64)> {
    if size <= MMIO_GAP_START {
        vec![(GuestAddress(0), size)]
    } else {
        vec![
            (GuestAddress(0), MMIO_GAP_START),
            (GuestAddress(MMIO_GAP_END), size - MMIO_GAP_START),
        ]
    }
}

/// Maps `mib` MiB of anonymous, private guest memory.
pub fn create_guest_memory(mib: u64) -> Result<GuestMemory, MemoryError> {
    if !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&mib) {
        return Err(MemoryError::SizeOutOfRange(mib));
    }
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(mib << 20)
        .into_iter()
        .map(|(start, len)| (start, len as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|source| MemoryError::Map { mib, source })
}

/// Highest guest-physical address of RAM, plus one.
pub fn ram_end(size: u64) -> u64 {
    ram_ranges(size)
        .last()
        .map(|(start, len)| start.0 + len)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn small_guest_is_one_range() {
        assert_eq!(ram_ranges(64 << 20), vec![(GuestAddress(0), 64 << 20)]);
    }

    #[test]
    fn large_guest_skips_the_mmio_hole() {
        let size = 4u64 << 30;
        let ranges = ram_ranges(size);
        assert_eq!(ranges.len(), 2);
        assert_eq!(ranges[0], (GuestAddress(0), MMIO_GAP_START));
        assert_eq!(ranges[1].0, GuestAddress(MMIO_GAP_END));
        assert_eq!(ranges[0].1 + ranges[1].1, size);
        assert_eq!(ram_end(size), MMIO_GAP_END + size - MMIO_GAP_START);
    }

    #[test]
    fn rejects_sizes_out_of_range() {
        assert!(matches!(
            create_guest_memory(1),
            Err(MemoryError::SizeOutOfRange(1))
        ));
        assert!(matches!(
            create_guest_memory(MAX_MEM_MIB + 1),
            Err(MemoryError::SizeOutOfRange(_))
        ));
    }

    #[test]
    fn maps_requested_size() {
        let mem = create_guest_memory(32).unwrap();
        assert_eq!(mem.num_regions(), 1);
        assert_eq!(mem.last_addr(), GuestAddress((32 << 20) - 1));
    }
}
