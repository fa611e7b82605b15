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
    /// The host refused to reserve the address range.
    #[error("could not reserve {mib} MiB of address space for guest memory")]
    Reserve {
        /// Size asked for.
        mib: u64,
        /// What `mmap` said.
        #[source]
        source: std::io::Error,
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

/// Host address space for `mib` MiB of guest RAM, reserved (`PROT_NONE`,
/// nothing backs it) before the memory's contents are known, so that it
/// can be registered with KVM ahead: the costly step of a restore's memory
/// (a slot's set-up, milliseconds on a nested host) then happens in a VMM
/// waiting for its workspace. A snapshot's memory file is later mapped
/// over it in place ([`crate::snapshot::memory_file::map_private_into`]).
#[derive(Debug)]
pub struct ReservedMemory {
    mib: u64,
    /// Each RAM range: its guest address, length and host address.
    ranges: Vec<(GuestAddress, u64, usize)>,
}

impl ReservedMemory {
    /// Reserves the ranges [`ram_ranges`] gives for `mib` MiB.
    pub fn new(mib: u64) -> Result<Self, MemoryError> {
        if !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&mib) {
            return Err(MemoryError::SizeOutOfRange(mib));
        }
        let mut reserved = Self {
            mib,
            ranges: Vec::new(),
        };
        for (start, len) in ram_ranges(mib << 20) {
            // SAFETY: a new anonymous mapping at an address the kernel
            // chooses; it touches no existing memory.
            let addr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if addr == libc::MAP_FAILED {
                let source = std::io::Error::last_os_error();
                return Err(MemoryError::Reserve { mib, source });
            }
            reserved.ranges.push((start, len, addr as usize));
        }
        Ok(reserved)
    }

    /// Its size.
    pub fn mib(&self) -> u64 {
        self.mib
    }

    /// Each range's guest address, length and host address.
    pub fn ranges(&self) -> &[(GuestAddress, u64, usize)] {
        &self.ranges
    }

    /// Hands the ranges to memory mapped over them, which from then on
    /// lives as long as the process (see `map_private_into`).
    pub(crate) fn keep_forever(mut self) {
        self.ranges.clear();
    }
}

impl Drop for ReservedMemory {
    fn drop(&mut self) {
        for &(_, len, addr) in &self.ranges {
            // SAFETY: the range was mapped by `new` and nothing refers to
            // it (a mapping over it would have cleared `ranges`).
            unsafe {
                libc::munmap(addr as *mut libc::c_void, len as usize);
            }
        }
    }
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
    fn a_reservation_has_the_guests_ranges_and_goes_with_its_value() {
        let reserved = ReservedMemory::new(32).unwrap();
        assert_eq!(reserved.mib(), 32);
        let [(start, len, addr)] = reserved.ranges() else {
            panic!("{reserved:?}")
        };
        assert_eq!((*start, *len), (GuestAddress(0), 32 << 20));
        assert_eq!(addr % 4096, 0);
        assert!(matches!(
            ReservedMemory::new(1),
            Err(MemoryError::SizeOutOfRange(1))
        ));
    }

    #[test]
    fn maps_requested_size() {
        let mem = create_guest_memory(32).unwrap();
        assert_eq!(mem.num_regions(), 1);
        assert_eq!(mem.last_addr(), GuestAddress((32 << 20) - 1));
    }
}
