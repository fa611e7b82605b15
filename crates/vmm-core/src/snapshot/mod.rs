//! Snapshots of a whole machine: a directory holding the versioned,
//! checksummed machine state (`vm.state`), guest memory as a sparse file
//! (`memory.raw`) and a copy of each writable disk (`disk-N.raw`, N its
//! index among the machine's disks). [`crate::machine::MachineHandle::snapshot`]
//! writes one from a running machine; [`crate::machine::Machine::restore`]
//! builds a machine from one in a fresh process. docs/snapshots.md
//! describes the format.

pub mod cpu;
pub mod format;
pub mod memory_file;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::arch::cpuid::CpuTemplate;
use crate::devices::serial::SerialRegs;
use crate::devices::virtio::balloon::BalloonState;
use crate::devices::virtio::mmio::TransportState;
use crate::disk_copy::DiskCopy;
use crate::vm::VmState;
use cpu::VcpuState;
use memory_file::SavedMemory;

/// The state file's name in a snapshot directory.
pub const STATE_FILE: &str = "vm.state";
/// The memory file's name in a snapshot directory.
pub const MEMORY_FILE: &str = "memory.raw";

/// The files of one snapshot directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFiles {
    dir: PathBuf,
}

impl SnapshotFiles {
    /// The snapshot in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The machine state.
    pub fn state(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Guest memory.
    pub fn memory(&self) -> PathBuf {
        self.dir.join(MEMORY_FILE)
    }

    /// The copy of the machine's disk `index` (writable disks only).
    pub fn disk(&self, index: usize) -> PathBuf {
        self.dir.join(format!("disk-{index}.raw"))
    }
}

/// A disk as the snapshot's machine had it; a restore must attach a disk of
/// the same shape at the same index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskState {
    /// Whether the guest could write it.
    pub read_only: bool,
    /// Its size in bytes.
    pub len: u64,
}

/// Everything of a machine outside its memory and disks.
#[derive(Debug, Serialize, Deserialize)]
pub struct MachineState {
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// The CPUID template the vCPUs were built with.
    pub template: CpuTemplate,
    /// The command line the guest booted with.
    pub cmdline: String,
    /// Irqchip, PIT, clock.
    pub vm: VmState,
    /// Each vCPU, by index.
    pub vcpus: Vec<VcpuState>,
    /// COM1.
    pub serial: SerialRegs,
    /// The CMOS's selected register.
    pub cmos_index: u8,
    /// The disks, by index.
    pub disks: Vec<DiskState>,
    /// The vsock device's guest CID, if there is one.
    pub vsock_cid: Option<u64>,
    /// The network device's MAC address, if there is one.
    pub net_mac: Option<[u8; 6]>,
    /// The balloon's own state, if there is one.
    pub balloon: Option<BalloonState>,
    /// Each virtio-mmio transport, in attach order (disks, then vsock,
    /// then the network device, then the balloon).
    pub virtio: Vec<TransportState>,
}

/// What a snapshot took and wrote.
#[derive(Clone, Debug)]
pub struct SnapshotTaken {
    /// How long the guest was paused (zero when it already was).
    pub paused: Duration,
    /// From the request to the files written.
    pub total: Duration,
    /// The memory file.
    pub memory: SavedMemory,
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// Each writable disk's copy: its index and how it was made.
    pub disks: Vec<(usize, DiskCopy)>,
}

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The state file could not be read or written.
    #[error("could not {action} {}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The state file is not one this build takes.
    #[error("the snapshot's state file {} is unusable", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: format::FormatError,
    },
    /// Guest memory could not be saved or mapped.
    #[error("guest memory")]
    Memory(#[from] memory_file::MemoryFileError),
    /// A disk could not be copied.
    #[error("could not copy disk {index} to {}", to.display())]
    Disk {
        /// The disk's index.
        index: usize,
        /// The copy.
        to: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl MachineState {
    /// Writes the state file of `files` (a new file).
    pub fn write(&self, files: &SnapshotFiles) -> Result<u64, SnapshotError> {
        let path = files.state();
        let bytes = format::encode(self).map_err(|source| SnapshotError::Format {
            path: path.clone(),
            source,
        })?;
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(&bytes)?;
            file.sync_data()
        };
        write().map_err(|source| SnapshotError::Io {
            action: "write",
            path,
            source,
        })?;
        Ok(bytes.len() as u64)
    }

    /// Reads and checks the state file of `files`.
    pub fn read(files: &SnapshotFiles) -> Result<Self, SnapshotError> {
        let path = files.state();
        let bytes = std::fs::read(&path).map_err(|source| SnapshotError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        format::decode(&bytes).map_err(|source| SnapshotError::Format { path, source })
    }
}
