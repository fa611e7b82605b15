//! Putting the kernel, its initrd and its command line into guest memory.
//! An uncompressed ELF `vmlinux` is preferred: a bzImage decompresses itself
//! in guest kernel mode, which an emulating host runs very slowly.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress};

use crate::arch::boot_params::InitrdPlacement;
use crate::layout::{
    CMDLINE_MAX_SIZE, CMDLINE_START, DEFAULT_INITRD_ADDR_LIMIT, HIMEM_START, MMIO_GAP_START,
};
use crate::memory::GuestMemory;

/// Offset of the 64-bit entry point from where a bzImage's protected-mode
/// code is loaded (Linux boot protocol, "64-bit boot protocol").
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
const PAGE_SIZE: u64 = 4096;

/// The kernel image formats we boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed ELF vmlinux.
    Elf,
    /// A compressed bzImage with a 64-bit entry point.
    BzImage,
}

/// Why the kernel, initrd or command line could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel or initrd file could not be opened or read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The ELF loader rejected the image.
    #[error("{} is not a loadable x86_64 vmlinux ELF", path.display())]
    Elf {
        /// The file.
        path: PathBuf,
        /// What the loader said.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// The bzImage loader rejected the image.
    #[error("{} is neither an ELF vmlinux nor a loadable bzImage", path.display())]
    BzImage {
        /// The file.
        path: PathBuf,
        /// What the loader said.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// A bzImage without the 64-bit entry point.
    #[error("{} is a bzImage without a 64-bit entry point (XLF_KERNEL_64); build a 64-bit kernel", path.display())]
    Not64Bit {
        /// The file.
        path: PathBuf,
    },
    /// The initrd does not fit between the kernel and the top of low memory.
    #[error("initrd of {size} bytes does not fit in guest memory above the kernel; give the guest more memory")]
    InitrdTooLarge {
        /// Its size.
        size: u64,
    },
    /// The command line is too long or has characters a kernel cannot take.
    #[error("kernel command line is invalid ({reason}); it must be printable ASCII and under {CMDLINE_MAX_SIZE} bytes")]
    InvalidCmdline {
        /// What is wrong with it.
        reason: String,
    },
    /// Guest memory could not hold what was being written.
    #[error("could not write into guest memory")]
    GuestMemory(#[source] vm_memory::GuestMemoryError),
}

/// A kernel placed in guest memory.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// Its format.
    pub format: KernelFormat,
    /// Guest-physical 64-bit entry point.
    pub entry: u64,
    /// First guest-physical address past the image.
    pub end: u64,
    /// A bzImage's setup header, to be copied into the zero page.
    pub setup_header: Option<setup_header>,
}

/// Opens a kernel or initrd file; a symlink at `path` is refused (ELOOP),
/// as for disks: callers resolve the links they mean to follow.
fn open(path: &Path) -> Result<File, KernelError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| KernelError::Read {
            path: path.to_owned(),
            source,
        })
}

/// Loads an ELF vmlinux or a bzImage, whichever `path` is.
pub fn load_kernel(mem: &GuestMemory, path: &Path) -> Result<LoadedKernel, KernelError> {
    let mut file = open(path)?;
    let mut magic = [0u8; 4];
    let is_elf = file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF";
    let highmem = Some(GuestAddress(HIMEM_START));
    if is_elf {
        let r = Elf::load(mem, None, &mut file, highmem).map_err(|source| KernelError::Elf {
            path: path.to_owned(),
            source,
        })?;
        return Ok(LoadedKernel {
            format: KernelFormat::Elf,
            entry: r.kernel_load.0,
            end: r.kernel_end,
            setup_header: None,
        });
    }
    let r =
        BzImage::load(mem, None, &mut file, highmem).map_err(|source| KernelError::BzImage {
            path: path.to_owned(),
            source,
        })?;
    let hdr = r.setup_header.unwrap_or_default();
    if hdr.xloadflags & linux_loader::loader::bootparam::XLF_KERNEL_64 == 0 {
        return Err(KernelError::Not64Bit {
            path: path.to_owned(),
        });
    }
    Ok(LoadedKernel {
        format: KernelFormat::BzImage,
        entry: r.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
        end: r.kernel_end,
        setup_header: Some(hdr),
    })
}

/// Where an initrd of `size` bytes goes: page-aligned, as high as the kernel
/// allows, above the kernel image.
pub fn initrd_placement(
    size: u64,
    mem_size: u64,
    kernel_end: u64,
    addr_max: Option<u32>,
) -> Result<InitrdPlacement, KernelError> {
    let limit = addr_max
        .filter(|m| *m != 0)
        .map_or(DEFAULT_INITRD_ADDR_LIMIT, |m| u64::from(m) + 1)
        .min(mem_size.min(MMIO_GAP_START));
    let addr = limit
        .checked_sub(size)
        .map(|a| a & !(PAGE_SIZE - 1))
        .filter(|a| *a >= kernel_end.max(HIMEM_START))
        .ok_or(KernelError::InitrdTooLarge { size })?;
    Ok(InitrdPlacement { addr, size })
}

/// Copies the initrd at `path` into guest memory.
pub fn load_initrd(
    mem: &GuestMemory,
    path: &Path,
    mem_size: u64,
    kernel: &LoadedKernel,
) -> Result<InitrdPlacement, KernelError> {
    let mut file = open(path)?;
    let size = file
        .metadata()
        .map_err(|source| KernelError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    let addr_max = kernel.setup_header.map(|h| h.initrd_addr_max);
    let placement = initrd_placement(size, mem_size, kernel.end, addr_max)?;
    mem.read_exact_volatile_from(GuestAddress(placement.addr), &mut file, size as usize)
        .map_err(KernelError::GuestMemory)?;
    Ok(placement)
}

/// Checks a command line the way the kernel will read it.
pub fn validate_cmdline(cmdline: &str) -> Result<(), KernelError> {
    let reason = if cmdline.len() >= CMDLINE_MAX_SIZE {
        Some(format!("{} bytes long", cmdline.len()))
    } else {
        cmdline
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' '))
            .map(|c| format!("contains {c:?}"))
    };
    match reason {
        Some(reason) => Err(KernelError::InvalidCmdline { reason }),
        None => Ok(()),
    }
}

/// Writes the NUL-terminated command line at [`CMDLINE_START`]; returns its length.
pub fn write_cmdline(mem: &GuestMemory, cmdline: &str) -> Result<usize, KernelError> {
    validate_cmdline(cmdline)?;
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_START))
        .map_err(KernelError::GuestMemory)?;
    Ok(cmdline.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;
    use std::io::Write;

    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("vmm-core-{}-{name}", std::process::id()));
        File::create(&path).unwrap().write_all(bytes).unwrap();
        path
    }

    /// A minimal bzImage: one setup sector after the boot sector, then a
    /// protected-mode payload.
    fn fake_bzimage(xloadflags: u16) -> Vec<u8> {
        let mut img = vec![0u8; 2 * 512 + 4096];
        img[0x1f1] = 1; // setup_sects
        img[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes()); // version 2.15
        img[0x211] = 0x01; // loadflags: LOADED_HIGH
        img[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
        img[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
        img[1024..1028].copy_from_slice(b"CODE");
        img
    }

    #[test]
    fn loads_a_bzimage_with_64bit_entry() {
        let mem = create_guest_memory(32).unwrap();
        let path = temp_file("bz", &fake_bzimage(1));
        let k = load_kernel(&mem, &path).unwrap();
        assert_eq!(k.format, KernelFormat::BzImage);
        assert_eq!(k.entry, HIMEM_START + 0x200);
        let mut code = [0u8; 4];
        mem.read_slice(&mut code, GuestAddress(HIMEM_START))
            .unwrap();
        assert_eq!(&code, b"CODE");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn rejects_a_32bit_bzimage_and_garbage() {
        let mem = create_guest_memory(32).unwrap();
        let path = temp_file("bz32", &fake_bzimage(0));
        assert!(matches!(
            load_kernel(&mem, &path),
            Err(KernelError::Not64Bit { .. })
        ));
        let junk = temp_file("junk", &[0x55; 8192]);
        assert!(matches!(
            load_kernel(&mem, &junk),
            Err(KernelError::BzImage { .. })
        ));
        let bad_elf = temp_file("badelf", b"\x7fELF\x01\x01\x01");
        assert!(matches!(
            load_kernel(&mem, &bad_elf),
            Err(KernelError::Elf { .. })
        ));
        let missing = Path::new("/nonexistent/vmlinux");
        assert!(matches!(
            load_kernel(&mem, missing),
            Err(KernelError::Read { .. })
        ));
        for p in [path, junk, bad_elf] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn initrd_goes_high_and_aligned() {
        let p = initrd_placement(10_000, 64 << 20, 0x200_0000, None).unwrap();
        assert_eq!(p.addr % PAGE_SIZE, 0);
        assert!(p.addr + p.size <= 64 << 20);
        assert!(p.addr >= (64 << 20) - 3 * PAGE_SIZE);
        // The kernel's own limit wins when lower.
        let p = initrd_placement(4096, 2 << 30, 0x200_0000, Some(0x0fff_ffff)).unwrap();
        assert_eq!(p.addr, 0x1000_0000 - 4096);
        // Large guests still keep the initrd below the MMIO hole and the default limit.
        let p = initrd_placement(4096, 8 << 30, 0x200_0000, None).unwrap();
        assert!(p.addr + p.size <= DEFAULT_INITRD_ADDR_LIMIT);
    }

    #[test]
    fn initrd_must_not_overlap_the_kernel() {
        let err = initrd_placement(60 << 20, 64 << 20, 0x200_0000, None).unwrap_err();
        assert!(matches!(err, KernelError::InitrdTooLarge { .. }));
    }

    #[test]
    fn cmdline_validation() {
        let mem = create_guest_memory(16).unwrap();
        assert_eq!(write_cmdline(&mem, "console=ttyS0 panic=1").unwrap(), 21);
        let mut buf = [0u8; 22];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_START))
            .unwrap();
        assert_eq!(&buf, b"console=ttyS0 panic=1\0");
        assert!(validate_cmdline("a\nb").is_err());
        assert!(validate_cmdline("a\0b").is_err());
        assert!(validate_cmdline("é").is_err());
        assert!(validate_cmdline(&"x".repeat(CMDLINE_MAX_SIZE)).is_err());
    }
}
