//! Guest memory as a sparse file: the regions one after another, pages of
//! zeros left as holes. A restore maps the file MAP_PRIVATE, so it costs the
//! same for any guest size, and every machine restored from one file shares
//! its unmodified pages through the host page cache.
//!
//! A memory file is never written in place: machines restored from it see
//! any change to the file in pages they have not written yet. It is written
//! under a temporary name and renamed.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

use crate::memory::{ram_ranges, GuestMemory, ReservedMemory};

/// Page granularity of holes.
const PAGE: usize = 4096;
/// Most bytes written by one call (runs of data pages are coalesced).
const MAX_RUN: usize = 4 << 20;

/// Why guest memory could not be saved or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MemoryFileError {
    /// Writing the file failed.
    #[error("could not write the memory file {}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Opening the file failed.
    #[error("could not open the memory file {}", path.display())]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The file is not as long as the guest's memory.
    #[error("the memory file is {found} bytes; the snapshot's guest has {expected}")]
    Length {
        /// Bytes in the file.
        found: u64,
        /// Bytes of guest memory.
        expected: u64,
    },
    /// The host refused the mapping.
    #[error("could not map the memory file")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
    /// The host refused to map the file over its reserved range.
    #[error("could not map the memory file over its reserved range")]
    MapInPlace(#[source] io::Error),
    /// Reading the file failed.
    #[error("could not read the memory file {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The regions do not form a valid guest memory.
    #[error("the memory file's regions do not form guest memory")]
    Regions(#[source] vm_memory::GuestRegionCollectionError),
}

/// What [`save`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SavedMemory {
    /// The file's length (the guest's memory size).
    pub len: u64,
    /// Bytes of data written (the rest are holes).
    pub data_bytes: u64,
}

fn is_zero(page: &[u8]) -> bool {
    // Word compares: several GB/s, well ahead of the writes they save.
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets
        // the aligned middle of the slice.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|b| *b == 0) && words.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

/// Writes every region of `mem` into a new file at `path`; an existing
/// file is never overwritten (someone may have it mapped).
pub fn save(mem: &GuestMemory, path: &Path) -> Result<SavedMemory, MemoryFileError> {
    let write_err = |source| MemoryFileError::Write {
        path: path.to_owned(),
        source,
    };
    // Guest RAM: nobody else's to read.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err)?;
    let mut offset = 0u64;
    let mut data_bytes = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|_| write_err(io::Error::other("region without a host mapping")))?;
        // SAFETY: the region is a live mapping of `len` bytes owned by `mem`,
        // which outlives this borrow. The machine is paused, so nothing writes
        // it meanwhile (and a racing write could only change bytes, not
        // validity, for u8).
        let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, len) };
        let mut run: Option<usize> = None;
        for start in (0..len).step_by(PAGE) {
            let end = (start + PAGE).min(len);
            let zero = is_zero(&bytes[start..end]);
            match (run, zero) {
                (None, false) => run = Some(start),
                (Some(from), true) => {
                    file.write_all_at(&bytes[from..start], offset + from as u64)
                        .map_err(write_err)?;
                    data_bytes += (start - from) as u64;
                    run = None;
                }
                (Some(from), false) if start - from >= MAX_RUN => {
                    file.write_all_at(&bytes[from..start], offset + from as u64)
                        .map_err(write_err)?;
                    data_bytes += (start - from) as u64;
                    run = Some(start);
                }
                _ => {}
            }
        }
        if let Some(from) = run {
            file.write_all_at(&bytes[from..], offset + from as u64)
                .map_err(write_err)?;
            data_bytes += (len - from) as u64;
        }
        offset += len as u64;
    }
    file.set_len(offset).map_err(write_err)?;
    // On disk before it is reported saved: a failing disk says so here
    // (EIO, ENOSPC at writeback), not when the snapshot is resumed.
    file.sync_data().map_err(write_err)?;
    Ok(SavedMemory {
        len: offset,
        data_bytes,
    })
}

/// A SHA-256 digest (hex) of the memory file at `path` that does not
/// depend on how the filesystem laid it out: over each page that is not
/// all zero, its index (u64 LE) then its bytes, in order. Only the file's
/// data extents are read, so it costs what the guest used, not its size.
pub fn digest(path: &Path) -> Result<String, MemoryFileError> {
    use sha2::{Digest, Sha256};
    use std::os::fd::AsRawFd;
    let read_err = |source| MemoryFileError::Read {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(read_err)?;
    let len = file.metadata().map_err(read_err)?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MAX_RUN];
    // Pages below this were hashed (extents rounded to pages may overlap).
    let mut next_page = 0u64;
    let mut at = 0u64;
    let seek = |offset: u64, whence| {
        // SAFETY: lseek on an fd this function owns; no memory is passed.
        let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data (or hole) at or after `offset`.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some(r as u64))
    };
    while at < len {
        let Some(data) = seek(at, libc::SEEK_DATA).map_err(read_err)? else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)
            .map_err(read_err)?
            .unwrap_or(len);
        let first = (data / PAGE as u64).max(next_page);
        let end = hole.div_ceil(PAGE as u64).min(len.div_ceil(PAGE as u64));
        let mut page = first;
        while page < end {
            let n = ((end - page) as usize * PAGE)
                .min(buf.len())
                .min((len - page * PAGE as u64) as usize);
            let chunk = &mut buf[..n];
            file.read_exact_at(chunk, page * PAGE as u64)
                .map_err(read_err)?;
            for p in chunk.chunks(PAGE) {
                if !is_zero(p) {
                    hasher.update(page.to_le_bytes());
                    hasher.update(p);
                }
                page += 1;
            }
        }
        next_page = end;
        at = hole.max(data + 1);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Maps the memory file at `path` copy-on-write as the RAM of a guest of
/// `mem_mib` MiB (laid out as [`crate::memory::create_guest_memory`] lays it).
pub fn map_private(path: &Path, mem_mib: u64) -> Result<GuestMemory, MemoryFileError> {
    let expected = mem_mib << 20;
    let file = open_sized(path, mem_mib)?;
    let file = std::sync::Arc::new(file);
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for (start, len) in ram_ranges(expected) {
        let mapping = MmapRegionBuilder::new(len as usize)
            .with_file_offset(FileOffset::from_arc(file.clone(), offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(MemoryFileError::Map)?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(start.0)).ok_or(
            MemoryFileError::Regions(vm_memory::GuestRegionCollectionError::NoMemoryRegion),
        )?;
        regions.push(region);
        offset += len;
    }
    GuestMemory::from_regions(regions).map_err(MemoryFileError::Regions)
}

/// Maps the memory file at `path` MAP_PRIVATE over `reserved`, in place
/// (its ranges were registered with KVM ahead: see [`ReservedMemory`]).
/// The mapping then lives as long as the process: a VMM process runs one
/// machine, and the memory's users (devices, vCPU threads) need not be
/// counted to know when it may go.
pub fn map_private_into(
    path: &Path,
    reserved: ReservedMemory,
) -> Result<GuestMemory, MemoryFileError> {
    let file = open_sized(path, reserved.mib())?;
    let file = std::sync::Arc::new(file);
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for &(start, len, addr) in reserved.ranges() {
        // SAFETY: MAP_FIXED over the reservation's own range, which nothing
        // else in the process uses; on failure the reservation's Drop
        // unmaps what is left of it.
        let mapped = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_NORESERVE | libc::MAP_FIXED,
                std::os::fd::AsRawFd::as_raw_fd(&*file),
                offset as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(MemoryFileError::MapInPlace(io::Error::last_os_error()));
        }
        // SAFETY: `addr` and `len` are the mapping just made, page-aligned;
        // it is never unmapped (the reservation is kept below).
        let mapping = unsafe {
            MmapRegionBuilder::new(len as usize)
                .with_file_offset(FileOffset::from_arc(file.clone(), offset))
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                .with_raw_mmap_pointer(addr as *mut u8)
        }
        .build()
        .map_err(MemoryFileError::Map)?;
        let region = GuestRegionMmap::new(mapping, start).ok_or(MemoryFileError::Regions(
            vm_memory::GuestRegionCollectionError::NoMemoryRegion,
        ))?;
        regions.push(region);
        offset += len;
    }
    reserved.keep_forever();
    GuestMemory::from_regions(regions).map_err(MemoryFileError::Regions)
}

/// Opens the memory file of a guest of `mem_mib` MiB, checking its length.
fn open_sized(path: &Path, mem_mib: u64) -> Result<File, MemoryFileError> {
    let file = File::open(path).map_err(|source| MemoryFileError::Open {
        path: path.to_owned(),
        source,
    })?;
    let expected = mem_mib << 20;
    let found = file
        .metadata()
        .map_err(|source| MemoryFileError::Open {
            path: path.to_owned(),
            source,
        })?
        .len();
    if found != expected {
        return Err(MemoryFileError::Length { found, expected });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;
    use std::os::unix::fs::MetadataExt;
    use vm_memory::Bytes;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("microagent-mem-{}-{name}", std::process::id()))
    }

    #[test]
    fn zero_pages_are_holes_and_data_round_trips() {
        let mem = create_guest_memory(32).unwrap();
        mem.write_slice(b"first page", GuestAddress(0)).unwrap();
        mem.write_slice(&[7; 3 * PAGE], GuestAddress(5 << 20))
            .unwrap();
        mem.write_slice(b"last", GuestAddress((32 << 20) - 4))
            .unwrap();
        let path = temp("sparse");
        let _ = std::fs::remove_file(&path);
        let saved = save(&mem, &path).unwrap();
        assert_eq!(saved.len, 32 << 20);
        assert_eq!(saved.data_bytes, 5 * PAGE as u64);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 32 << 20);
        assert!(
            meta.blocks() * 512 <= 8 * PAGE as u64,
            "{} blocks",
            meta.blocks()
        );

        let restored = map_private(&path, 32).unwrap();
        let mut buf = [0u8; 10];
        restored.read_slice(&mut buf, GuestAddress(0)).unwrap();
        assert_eq!(&buf, b"first page");
        let mut big = vec![0u8; 3 * PAGE];
        restored
            .read_slice(&mut big, GuestAddress(5 << 20))
            .unwrap();
        assert!(big.iter().all(|b| *b == 7));
        let mut end = [0u8; 4];
        restored
            .read_slice(&mut end, GuestAddress((32 << 20) - 4))
            .unwrap();
        assert_eq!(&end, b"last");

        // Copy-on-write: the guest's writes never reach the file.
        restored.write_slice(b"changed", GuestAddress(0)).unwrap();
        let again = map_private(&path, 32).unwrap();
        again.read_slice(&mut buf, GuestAddress(0)).unwrap();
        assert_eq!(&buf, b"first page");

        // Mapped over a reservation, in place: the same contents at the
        // reserved host addresses; a reservation of another size refused.
        let reserved = crate::memory::ReservedMemory::new(32).unwrap();
        let host = reserved.ranges()[0].2;
        let wrong = crate::memory::ReservedMemory::new(16).unwrap();
        assert!(matches!(
            map_private_into(&path, wrong),
            Err(MemoryFileError::Length { .. })
        ));
        let in_place = map_private_into(&path, reserved).unwrap();
        let region = in_place.find_region(GuestAddress(0)).unwrap();
        assert_eq!(
            region.get_host_address(MemoryRegionAddress(0)).unwrap() as usize,
            host
        );
        in_place.read_slice(&mut buf, GuestAddress(0)).unwrap();
        assert_eq!(&buf, b"first page");
        in_place
            .read_slice(&mut end, GuestAddress((32 << 20) - 4))
            .unwrap();
        assert_eq!(&end, b"last");
        in_place.write_slice(b"changed", GuestAddress(0)).unwrap();
        again.read_slice(&mut buf, GuestAddress(0)).unwrap();
        assert_eq!(&buf, b"first page");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_digest_follows_content_not_layout() {
        let mem = create_guest_memory(16).unwrap();
        mem.write_slice(&[7u8; 100], GuestAddress(0x5000)).unwrap();
        mem.write_slice(&[9u8; 3], GuestAddress(0x80_0000)).unwrap();
        let sparse = temp("digest-sparse");
        let _ = std::fs::remove_file(&sparse);
        save(&mem, &sparse).unwrap();
        // The same bytes written densely (every page allocated).
        let dense = temp("digest-dense");
        let all = std::fs::read(&sparse).unwrap();
        std::fs::write(&dense, &all).unwrap();
        let a = digest(&sparse).unwrap();
        assert_eq!(a, digest(&dense).unwrap());
        // One byte changed, in a page that held data or in a hole.
        for at in [0x5000u64 + 99, 0x30_0000] {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&dense)
                .unwrap();
            f.write_all_at(&[1], at).unwrap();
            assert_ne!(
                a,
                digest(&dense).unwrap(),
                "a change at {at:#x} went unseen"
            );
            std::fs::write(&dense, &all).unwrap();
        }
        std::fs::remove_file(&sparse).unwrap();
        std::fs::remove_file(&dense).unwrap();
    }

    #[test]
    fn a_file_of_the_wrong_length_is_refused() {
        let mem = create_guest_memory(16).unwrap();
        let path = temp("short");
        let _ = std::fs::remove_file(&path);
        save(&mem, &path).unwrap();
        assert!(save(&mem, &path).is_err(), "overwrote an existing file");
        assert!(matches!(
            map_private(&path, 32),
            Err(MemoryFileError::Length { found, expected }) if found == 16 << 20 && expected == 32 << 20
        ));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn zero_check_sees_every_byte() {
        let mut page = vec![0u8; PAGE];
        assert!(is_zero(&page));
        for i in [0, 1, 7, 8, PAGE / 2, PAGE - 1] {
            page[i] = 1;
            assert!(!is_zero(&page), "byte {i}");
            page[i] = 0;
        }
        assert!(is_zero(&page[3..]));
    }
}
