//! virtio-blk over a host file: one request queue served with positioned
//! I/O on the event loop thread; writes keep sparse images sparse.
//!
//! Requests are untrusted: chains are walked with `virtio_queue`'s bounds
//! checks, sectors and lengths checked without overflow, and data copied
//! through one 64 KiB buffer, so a bad request costs at most an error status.

use std::cmp::min;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{
    read_config_space, ActivateError, Interrupt, VirtioDevice, INT_USED_RING, TYPE_BLOCK,
    VIRTIO_F_VERSION_1,
};
use crate::memory::GuestMemory;

/// Bytes per virtio-blk sector (fixed by the spec, whatever the host uses).
pub const SECTOR_SIZE: u64 = 512;
/// Size of the single request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Longest device id (GET_ID answer); shorter ids are NUL padded.
pub const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// `struct virtio_blk_outhdr`: type u32, reserved u32, sector u64.
const HEADER_LEN: usize = 16;
/// Largest piece of data held in host memory at once, whatever the guest claims.
const COPY_CHUNK: usize = 64 << 10;
/// Granularity at which all-zero written data becomes a hole.
const HOLE_BLOCK: u64 = 4096;

/// Why a block device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The backing file could not be opened, or its size or inode read.
    #[error("cannot open disk image {} ({mode}): check that it exists and that its permissions allow this", .path.display())]
    Open {
        /// The disk image.
        path: PathBuf,
        /// "read-only" or "read-write".
        mode: &'static str,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The backing file is not made of whole sectors.
    #[error("disk image {} is {len} bytes, not a multiple of 512: resize it to whole sectors (e.g. `truncate -s`)", .path.display())]
    UnalignedSize {
        /// The disk image.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// The queue notification eventfd could not be created.
    #[error("cannot create the virtio-blk queue eventfd: raise the open file limit")]
    EventFd(#[source] io::Error),
}

/// What `activate` hands over, dropped on reset.
struct Active {
    mem: GuestMemory,
    queue: Queue,
    irq: Arc<Interrupt>,
}

/// The backing file and what requests need besides the queue.
struct Disk {
    file: File,
    len: u64,
    read_only: bool,
    id: [u8; ID_BYTES],
    buf: Vec<u8>,
}

/// A virtio-blk device backed by a host file (or block device).
///
/// Offers `VIRTIO_F_VERSION_1`, `VIRTIO_BLK_F_FLUSH` and, when read-only,
/// `VIRTIO_BLK_F_RO`. Its configuration space holds only `capacity`.
pub struct BlockDevice {
    disk: Disk,
    queue_evt: EventFd,
    active: Option<Active>,
}

impl std::fmt::Debug for BlockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockDevice")
            .field("capacity", &self.capacity())
            .field("read_only", &self.disk.read_only)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl BlockDevice {
    /// Opens `path` (read-write unless `read_only`; a symlink is refused:
    /// O_NOFOLLOW) as a disk of `length / 512` sectors; the length must be
    /// a multiple of 512. The GET_ID answer defaults to `"microagent-"` and
    /// nine hex digits hashed from the file's device and inode numbers
    /// (stable for the same file across runs); see [`BlockDevice::with_id`].
    pub fn new(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        let mut options = OpenOptions::new();
        options.read(true).write(!read_only);
        let file = options.custom_flags(libc::O_NOFOLLOW).open(path);
        Self::from_file(file, path, read_only)
    }

    /// [`BlockDevice::new`] of an opened file (a memfd); `path` names it.
    pub fn from_file(file: io::Result<File>, path: &Path, ro: bool) -> Result<Self, BlockError> {
        let read_only = ro;
        let open_err = |source| BlockError::Open {
            path: path.to_owned(),
            mode: if read_only { "read-only" } else { "read-write" },
            source,
        };
        let file = file.map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        // Seeking to the end also sizes block devices, whose metadata says 0.
        let len = (&file).seek(SeekFrom::End(0)).map_err(open_err)?;
        if len % SECTOR_SIZE != 0 {
            return Err(BlockError::UnalignedSize {
                path: path.to_owned(),
                len,
            });
        }
        Ok(Self {
            disk: Disk {
                file,
                len,
                read_only,
                id: derived_id(&meta),
                buf: vec![0; COPY_CHUNK],
            },
            queue_evt: EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC)
                .map_err(BlockError::EventFd)?,
            active: None,
        })
    }

    /// Replaces the GET_ID answer; ids longer than 20 bytes are cut to 20.
    pub fn with_id(mut self, id: String) -> Self {
        self.disk.id = padded_id(id.as_bytes());
        self
    }

    /// Size of the disk in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.disk.len / SECTOR_SIZE
    }

    /// What the event loop does on a queue notification: drains the queue
    /// eventfd, serves every available request (if active), then raises the
    /// used-ring interrupt if anything was returned and the driver wants it.
    pub fn process_queue(&mut self) {
        // Empty (EAGAIN) is fine: a spurious wake-up only costs a scan.
        let _ = self.queue_evt.read();
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mem = &active.mem;
        let mut used_any = false;
        while let Some(chain) = active.queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.disk.execute(mem, chain);
            match active.queue.add_used(mem, head, len) {
                Ok(()) => used_any = true,
                Err(e) => tracing::warn!("virtio-blk: cannot return chain {head}: {e}"),
            }
        }
        // Without a readable used_event we cannot know, so notify.
        if used_any && active.queue.needs_notification(mem).unwrap_or(true) {
            if let Err(e) = active.irq.trigger(INT_USED_RING) {
                tracing::warn!("virtio-blk: cannot raise the interrupt: {e}");
            }
        }
    }
}

/// The writable buffers of a well-formed chain, split into data and the
/// final status byte; `None` if the chain loops, is cut short, points
/// outside guest memory or has no writable byte.
fn data_and_status<'m>(
    mem: &'m GuestMemory,
    chain: &DescriptorChain<&GuestMemory>,
) -> Option<(Writer<'m>, Writer<'m>)> {
    // The iterator stops on loops (its ttl), bad indices and unreadable
    // descriptors, so a last descriptor that still points on means one.
    if chain.clone().last().is_none_or(|d| d.has_next()) {
        return None;
    }
    let mut data = chain.clone().writer(mem).ok()?;
    let status = data.split_at(data.available_bytes().checked_sub(1)?).ok()?;
    Some((data, status))
}

impl Disk {
    /// Serves one request and returns the used length (0 if no status could
    /// be written).
    fn execute(&mut self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let head = chain.head_index();
        let Some((mut data, mut status_byte)) = data_and_status(mem, &chain) else {
            tracing::warn!("virtio-blk: chain {head} is malformed or has no status byte, dropped");
            return 0;
        };
        let status = match chain.reader(mem) {
            Ok(mut reader) => self.request(&mut reader, &mut data),
            Err(e) => {
                tracing::warn!("virtio-blk: chain {head} has unusable readable buffers: {e}");
                VIRTIO_BLK_S_IOERR
            }
        };
        // Statuses are 0..=2, so the cast keeps the value.
        if status_byte.write_all(&[status as u8]).is_err() {
            return 0;
        }
        // The whole chain is under 4 GiB (the iterator enforces it).
        u32::try_from(data.bytes_written() + 1).unwrap_or(u32::MAX)
    }

    /// Parses the header and runs the request; returns the status.
    fn request(&mut self, reader: &mut Reader, data: &mut Writer) -> u32 {
        let mut header = [0u8; HEADER_LEN];
        if reader.read_exact(&mut header).is_err() {
            tracing::warn!("virtio-blk: request header shorter than {HEADER_LEN} bytes");
            return VIRTIO_BLK_S_IOERR;
        }
        let [t0, t1, t2, t3, _, _, _, _, sector @ ..] = header;
        let sector = u64::from_le_bytes(sector);
        let result = match u32::from_le_bytes([t0, t1, t2, t3]) {
            VIRTIO_BLK_T_IN => self.read(sector, data),
            VIRTIO_BLK_T_OUT if self.read_only => Err(io::ErrorKind::ReadOnlyFilesystem.into()),
            VIRTIO_BLK_T_OUT => self.write(sector, reader),
            // Nothing reaches the file on a read-only disk, so nothing to sync.
            VIRTIO_BLK_T_FLUSH if self.read_only => Ok(()),
            VIRTIO_BLK_T_FLUSH => self.file.sync_data(),
            VIRTIO_BLK_T_GET_ID => {
                let n = min(data.available_bytes(), ID_BYTES);
                data.write_all(&self.id[..n])
            }
            other => {
                tracing::warn!("virtio-blk: unsupported request type {other}");
                return VIRTIO_BLK_S_UNSUPP;
            }
        };
        match result {
            Ok(()) => VIRTIO_BLK_S_OK,
            Err(e) => {
                tracing::warn!("virtio-blk: request at sector {sector} failed: {e}");
                VIRTIO_BLK_S_IOERR
            }
        }
    }

    /// Byte offset of `len` bytes at `sector` if they are whole sectors
    /// inside the disk.
    fn range(&self, sector: u64, len: usize) -> io::Result<u64> {
        let len = u64::try_from(len).ok().filter(|l| l % SECTOR_SIZE == 0);
        let offset = sector.checked_mul(SECTOR_SIZE);
        match (offset, len) {
            (Some(o), Some(l)) if o.checked_add(l).is_some_and(|end| end <= self.len) => Ok(o),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "length not whole sectors or beyond the end of the disk",
            )),
        }
    }

    /// IN: fills the writable data buffers from the file.
    fn read(&mut self, sector: u64, data: &mut Writer) -> io::Result<()> {
        let len = data.available_bytes();
        let offset = self.range(sector, len)?;
        let mut done = 0;
        while done < len {
            let buf = &mut self.buf[..min(len - done, COPY_CHUNK)];
            self.file.read_exact_at(buf, offset + done as u64)?;
            data.write_all(buf)?;
            done += buf.len();
        }
        Ok(())
    }

    /// OUT: writes the readable data after the header to the file.
    fn write(&mut self, sector: u64, src: &mut Reader) -> io::Result<()> {
        let len = src.available_bytes();
        let offset = self.range(sector, len)?;
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            // End pieces on a 4 KiB file boundary so no zero block is split.
            let n = min(len - done, COPY_CHUNK - (pos % HOLE_BLOCK) as usize);
            let buf = &mut self.buf[..n];
            src.read_exact(buf)?;
            write_sparse(&self.file, buf, pos)?;
            done += n;
        }
        Ok(())
    }
}

/// Writes `data` at `offset`, punching aligned all-zero 4 KiB blocks
/// instead of writing them so sparse images stay sparse.
fn write_sparse(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let flush = |run: &[u8], at: usize, hole: bool| -> io::Result<()> {
        let pos = offset + at as u64;
        // Filesystems that cannot punch still get the zeros written.
        if run.is_empty() || (hole && punch_hole(file, pos, run.len() as u64).is_ok()) {
            return Ok(());
        }
        file.write_all_at(run, pos)
    };
    let (mut start, mut in_hole, mut pos) = (0, false, 0);
    while pos < data.len() {
        let file_pos = offset + pos as u64;
        let step = (HOLE_BLOCK - file_pos % HOLE_BLOCK) as usize;
        let end = min(pos + step, data.len());
        let hole = end - pos == HOLE_BLOCK as usize && data[pos..end].iter().all(|&b| b == 0);
        if hole != in_hole {
            flush(&data[start..pos], start, in_hole)?;
            (start, in_hole) = (pos, hole);
        }
        pos = end;
    }
    flush(&data[start..], start, in_hole)
}

/// Deallocates `len` bytes at `offset` without changing the file size.
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::ErrorKind::InvalidInput.into());
    };
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate takes only integers; the fd is owned by `file`,
    // which stays open for the call, and no memory is shared with the kernel.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `id` cut to [`ID_BYTES`] and NUL padded.
fn padded_id(id: &[u8]) -> [u8; ID_BYTES] {
    let mut out = [0; ID_BYTES];
    let n = min(id.len(), ID_BYTES);
    out[..n].copy_from_slice(&id[..n]);
    out
}

/// `"microagent-"` + 9 hex digits of an FNV-1a hash of (dev, inode): a
/// stable name that fits the 20 bytes (std's hasher may change between
/// Rust releases, FNV does not).
fn derived_id(meta: &Metadata) -> [u8; ID_BYTES] {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for b in [meta.dev(), meta.ino()].map(u64::to_le_bytes).concat() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    padded_id(format!("microagent-{:09x}", hash & 0xf_ffff_ffff).as_bytes())
}

impl VirtioDevice for BlockDevice {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        std::slice::from_ref(&self.queue_evt)
    }

    fn avail_features(&self) -> u64 {
        let ro = u64::from(self.disk.read_only) << VIRTIO_BLK_F_RO;
        VIRTIO_F_VERSION_1 | (1 << VIRTIO_BLK_F_FLUSH) | ro
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.capacity().to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Nothing in the config space is writable (no writeback feature).
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        mut queues: Vec<Queue>,
        irq: Arc<Interrupt>,
        _acked_features: u64,
    ) -> Result<(), ActivateError> {
        // No negotiated feature changes how requests are served.
        let got = queues.len();
        let (Some(queue), 1) = (queues.pop(), got) else {
            return Err(ActivateError::QueueCount { got, want: 1 });
        };
        self.active = Some(Active { mem, queue, irq });
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active.iter().map(|a| a.queue.state()).collect()
    }
}

impl MutEventSubscriber for BlockDevice {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.queue_evt, EventSet::IN)) {
            tracing::warn!("virtio-blk: cannot watch the queue, the disk will hang: {e:?}");
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.queue_evt.as_raw_fd() {
            self.process_queue();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::split::Descriptor as SplitDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x20_0000;
    const STATUS: u64 = 0x80_0000;
    const R: bool = false;
    const W: bool = true;

    /// A buffer as the driver offers it: address, length, device-writable.
    type Buf = (u64, u32, bool);

    /// Bytes that differ between sectors, so misplaced data shows.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i / 7) as u8 ^ seed).collect()
    }

    /// A backing file in the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        /// All-zero contents become a sparse file.
        fn new(name: &str, contents: &[u8]) -> Self {
            let name = format!("blk-{}-{name}", std::process::id());
            let path = std::env::temp_dir().join(name);
            let file = File::create(&path).unwrap();
            file.set_len(contents.len() as u64).unwrap();
            if contents.iter().any(|&b| b != 0) {
                file.write_all_at(contents, 0).unwrap();
            }
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// An active device over a temp file, driven through a mock queue.
    struct Rig<'a> {
        mem: &'a GuestMemory,
        vq: MockSplitQueue<'a, GuestMemory>,
        dev: BlockDevice,
        irq: Arc<Interrupt>,
        next_desc: u16,
        file: TempFile,
    }

    impl<'a> Rig<'a> {
        fn new(mem: &'a GuestMemory, name: &str, image: &[u8], ro: bool) -> Self {
            let file = TempFile::new(name, image);
            let mut dev = BlockDevice::new(&file.0, ro).unwrap();
            let vq = MockSplitQueue::create(mem, GuestAddress(0x1_0000), 64);
            let irq = Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap()));
            let queues = vec![vq.create_queue().unwrap()];
            dev.activate(mem.clone(), queues, irq.clone(), 0).unwrap();
            let next_desc = 0;
            Self {
                mem,
                vq,
                dev,
                irq,
                next_desc,
                file,
            }
        }

        /// Offers a chain; returns its head.
        fn push(&mut self, bufs: &[Buf]) -> u16 {
            let first = self.next_desc;
            let last = first + bufs.len() as u16 - 1;
            let mut descs = Vec::new();
            for (i, &(addr, len, w)) in (first..).zip(bufs) {
                let w = if w { VRING_DESC_F_WRITE } else { 0 };
                let more = if i < last { VRING_DESC_F_NEXT } else { 0 };
                let desc = SplitDescriptor::new(addr, len, (w | more) as u16, i + 1);
                descs.push(desc.into());
            }
            self.vq.add_desc_chains(&descs, first).unwrap();
            self.next_desc = last + 1;
            first
        }

        /// Header at `HDR`, optional data at `DATA`, status at `STATUS`.
        fn request(&mut self, kind: u32, sector: u64, data: Option<(u32, bool)>) -> u16 {
            self.header(HDR, kind, sector);
            let mut bufs = vec![(HDR, HEADER_LEN as u32, R)];
            bufs.extend(data.map(|(len, w)| (DATA, len, w)));
            bufs.push((STATUS, 1, W));
            self.push(&bufs)
        }

        /// Writes a request header; also poisons the status byte.
        fn header(&self, addr: u64, kind: u32, sector: u64) {
            let h = [&kind.to_le_bytes()[..], &[0; 4], &sector.to_le_bytes()];
            self.write(addr, &h.concat());
            self.write(STATUS, &[0xff]);
        }

        /// Notifies the device the way KVM's ioeventfd would.
        fn kick(&mut self) {
            self.dev.queue_events()[0].write(1).unwrap();
            self.dev.process_queue();
            assert!(self.dev.queue_events()[0].read().is_err(), "drained");
        }

        /// The used ring's index and its entry `i` as (id, len).
        fn used(&self, i: u16) -> (u16, (u32, u32)) {
            let base = self.vq.used_addr();
            let at = base.unchecked_add(4 + 8 * u64::from(i));
            let idx = self.mem.read_obj(base.unchecked_add(2)).unwrap();
            let id = self.mem.read_obj(at).unwrap();
            (idx, (id, self.mem.read_obj(at.unchecked_add(4)).unwrap()))
        }

        fn read(&self, addr: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0; len];
            self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
            v
        }

        fn write(&self, addr: u64, data: &[u8]) {
            self.mem.write_slice(data, GuestAddress(addr)).unwrap();
        }

        /// Kicks, then checks chain `head` came back with used length `len`,
        /// `status` if one was written (else the poison) and an interrupt.
        fn expect(&mut self, head: u16, len: u32, status: u32) {
            let before = self.used(0).0;
            self.kick();
            let (idx, elem) = self.used(before);
            assert_eq!((idx, elem), (before + 1, (u32::from(head), len)));
            let want = if len > 0 { status as u8 } else { 0xff };
            assert_eq!(self.read(STATUS, 1), [want]);
            assert_eq!(self.irq.irq().read().unwrap(), 1);
            assert_eq!(self.irq.status(), INT_USED_RING);
        }
    }

    #[test]
    fn reads_sectors_into_guest_memory() {
        let image = pattern(8 * 512, 0x5a);
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "read", &image, false);
        // Three sectors from sector 2, over two data buffers.
        rig.header(HDR, VIRTIO_BLK_T_IN, 2);
        let (d1, d2, st) = ((DATA, 1024, W), (DATA + 0x1_0000, 512, W), (STATUS, 1, W));
        let head = rig.push(&[(HDR, 16, R), d1, d2, st]);
        rig.expect(head, 1536 + 1, VIRTIO_BLK_S_OK);
        assert_eq!(rig.read(DATA, 1024), image[1024..2048]);
        assert_eq!(rig.read(d2.0, 512), image[2048..2560]);
    }

    #[test]
    fn writes_guest_data_to_the_file_in_bounded_pieces() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "write", &[0x11; 512 * 512], false);
        // 200 KiB at sector 3: several copy buffers, not 4 KiB aligned,
        // starting in the header's descriptor.
        let data = pattern(200 << 10, 0xc3);
        rig.write(HDR + 16, &data[..512]);
        rig.write(DATA, &data[512..]);
        rig.header(HDR, VIRTIO_BLK_T_OUT, 3);
        let rest = (data.len() - 512) as u32;
        let head = rig.push(&[(HDR, 16 + 512, R), (DATA, rest, R), (STATUS, 1, W)]);
        rig.expect(head, 1, VIRTIO_BLK_S_OK);
        let mut want = vec![0x11; 512 * 512];
        want[3 * 512..3 * 512 + data.len()].copy_from_slice(&data);
        assert!(std::fs::read(&rig.file.0).unwrap() == want);
    }

    #[test]
    fn flush_is_ok_and_unknown_types_unsupported() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "flush", &[0; 4096], false);
        let head = rig.request(VIRTIO_BLK_T_FLUSH, 0, None);
        rig.expect(head, 1, VIRTIO_BLK_S_OK);
        let head = rig.request(11, 0, Some((512, R)));
        rig.expect(head, 1, VIRTIO_BLK_S_UNSUPP);
    }

    #[test]
    fn get_id_answers_derived_or_configured_id() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "getid", &[0; 4096], false);
        let head = rig.request(VIRTIO_BLK_T_GET_ID, 0, Some((20, W)));
        rig.expect(head, 21, VIRTIO_BLK_S_OK);
        let id = rig.read(DATA, 20);
        assert!(id.starts_with(b"microagent-"), "{id:?}");
        assert!(id[11..].iter().all(u8::is_ascii_hexdigit), "{id:?}");
        // Same file, same id; a given id replaces it, cut to 20 bytes.
        let dev = || BlockDevice::new(&rig.file.0, true).unwrap();
        assert_eq!(dev().disk.id[..], id);
        assert_eq!(dev().with_id("x".repeat(30)).disk.id, [b'x'; 20]);
        rig.dev.disk = dev().with_id("disk0".into()).disk;
        // A 32-byte buffer still gets only the 20 id bytes.
        rig.write(DATA, &[0xee; 32]);
        let head = rig.request(VIRTIO_BLK_T_GET_ID, 0, Some((32, W)));
        rig.expect(head, 21, VIRTIO_BLK_S_OK);
        let want = [&b"disk0"[..], &[0; 15], &[0xee; 12]].concat();
        assert_eq!(rig.read(DATA, 32), want);
    }

    #[test]
    fn out_of_range_or_unaligned_requests_are_ioerr() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "range", &[7; 8 * 512], false);
        let cases = [
            ("past the end", VIRTIO_BLK_T_IN, 7, 1024),
            ("overflowing offset", VIRTIO_BLK_T_IN, u64::MAX >> 8, 1024),
            ("write past the end", VIRTIO_BLK_T_OUT, 7, 1024),
            ("unaligned read", VIRTIO_BLK_T_IN, 0, 1000),
            ("unaligned write", VIRTIO_BLK_T_OUT, 0, 513),
        ];
        for (what, kind, sector, len) in cases {
            rig.write(DATA, &[0xee; 1024]);
            let head = rig.request(kind, sector, Some((len, kind == VIRTIO_BLK_T_IN)));
            rig.expect(head, 1, VIRTIO_BLK_S_IOERR);
            assert_eq!(rig.read(DATA, 1024), [0xee; 1024], "{what}");
        }
        assert_eq!(std::fs::read(&rig.file.0).unwrap(), [7; 8 * 512]);
    }

    #[test]
    fn read_only_device_refuses_writes() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "ro", &[7; 8 * 512], true);
        assert_ne!(rig.dev.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
        rig.write(DATA, &[1; 512]);
        let head = rig.request(VIRTIO_BLK_T_OUT, 0, Some((512, R)));
        rig.expect(head, 1, VIRTIO_BLK_S_IOERR);
        assert_eq!(std::fs::read(&rig.file.0).unwrap(), [7; 8 * 512]);
    }

    #[test]
    fn zero_blocks_become_holes() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "sparse", &[0; 64 << 10], false);
        let path = rig.file.0.clone();
        let blocks = || std::fs::metadata(&path).unwrap().blocks();
        // Two allocated 4 KiB blocks at 4 KiB...
        rig.write(DATA, &[0xab; 8192]);
        let head = rig.request(VIRTIO_BLK_T_OUT, 8, Some((8192, R)));
        rig.expect(head, 1, VIRTIO_BLK_S_OK);
        let allocated = blocks();
        assert!(allocated >= 16, "{allocated} blocks");
        // ...then zeros over the second one give its space back.
        rig.write(DATA + 4096, &[0; 4096]);
        let head = rig.request(VIRTIO_BLK_T_OUT, 8, Some((8192, R)));
        rig.expect(head, 1, VIRTIO_BLK_S_OK);
        assert!(blocks() <= allocated - 8, "{} blocks", blocks());
        let disk = std::fs::read(&rig.file.0).unwrap();
        assert_eq!(disk.len(), 64 << 10, "size kept");
        assert!(disk[4096..8192].iter().all(|&b| b == 0xab));
        assert!(disk[8192..].iter().all(|&b| b == 0));
    }

    #[test]
    fn serves_several_requests_per_notification() {
        let image = pattern(16 * 512, 0x33);
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "several", &image, false);
        let at = |i: u16| (HDR + 64 * u64::from(i), DATA + 4096 * u64::from(i));
        for i in 0..3 {
            let (hdr, data) = at(i);
            rig.header(hdr, VIRTIO_BLK_T_IN, u64::from(i) * 4);
            rig.push(&[(hdr, 16, R), (data, 512, W), (hdr + 16, 1, W)]);
        }
        rig.kick();
        assert_eq!(rig.irq.irq().read().unwrap(), 1, "one interrupt");
        for i in 0..3 {
            let (hdr, data) = at(i);
            assert_eq!(rig.used(i), (3, (u32::from(i) * 3, 513)));
            assert_eq!(rig.read(hdr + 16, 1), [VIRTIO_BLK_S_OK as u8]);
            let sector = usize::from(i) * 4 * 512;
            assert_eq!(rig.read(data, 512), image[sector..sector + 512]);
        }
    }

    #[test]
    fn malformed_chains_get_an_error_or_nothing() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "malformed", &[3; 4096], false);
        rig.write(DATA, &[9; 4096]);
        let (h, st) = ((HDR, 16, R), (STATUS, 1, W));
        // Lengths the guest cannot back, keeping the chain total at u32::MAX.
        let (far, huge) = (64 << 20, u32::MAX - 17);
        // (what, chain, used length: 0 = dropped, 1 = IOERR status)
        let cases: [(&str, &[Buf], u32); 8] = [
            ("descriptor loop", &[h, (DATA, 512, W)], 0),
            ("readable beyond guest memory", &[h, (far, 512, R), st], 1),
            ("writable beyond guest memory", &[h, (far, 512, W), st], 0),
            ("huge readable length", &[h, (DATA, huge, R), st], 1),
            ("huge writable length", &[h, (DATA, huge, W), st], 0),
            ("short header", &[(HDR, 12, R), (DATA, 512, R), st], 1),
            ("all readable, no status", &[h, (DATA, 512, R)], 0),
            ("all writable", &[(DATA, 512, W), st], 1),
        ];
        for (what, bufs, len) in cases {
            rig.header(HDR, VIRTIO_BLK_T_OUT, 0);
            let head = rig.push(bufs);
            if what == "descriptor loop" {
                // The data buffer points back at the header: 0 -> 1 -> 0 ...
                let flags = (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16;
                let desc = SplitDescriptor::new(DATA, 512, flags, head);
                rig.vq.desc_table().store(head + 1, desc.into()).unwrap();
            }
            rig.expect(head, len, VIRTIO_BLK_S_IOERR);
        }
        let disk = std::fs::read(&rig.file.0).unwrap();
        assert_eq!(disk, [3; 4096], "nothing written");
    }

    #[test]
    fn inactive_or_reset_device_only_drains_its_eventfd() {
        let mem = create_guest_memory(16).unwrap();
        let mut rig = Rig::new(&mem, "inactive", &[0; 4096], false);
        rig.dev.reset();
        rig.request(VIRTIO_BLK_T_FLUSH, 0, None);
        rig.kick();
        assert_eq!(rig.used(0).0, 0);
        assert!(rig.irq.irq().read().is_err(), "no interrupt");
        let err = rig.dev.activate(mem.clone(), vec![], rig.irq.clone(), 0);
        let want = ActivateError::QueueCount { got: 0, want: 1 };
        assert_eq!(format!("{err:?}"), format!("Err({want:?})"));
    }

    #[test]
    fn config_space_holds_capacity_and_features() {
        let file = TempFile::new("config", &[0; 3 * 512]);
        let mut dev = BlockDevice::new(&file.0, false).unwrap();
        assert_eq!((dev.device_type(), dev.capacity()), (TYPE_BLOCK, 3));
        assert_eq!(dev.queue_max_sizes(), [QUEUE_SIZE]);
        assert_eq!(dev.avail_features(), VIRTIO_F_VERSION_1 | 1 << 9);
        dev.write_config(0, &[0xff; 8]);
        let (mut cap, mut tail, mut far) = ([0xee; 8], [0xee; 4], [0xee; 4]);
        dev.read_config(0, &mut cap);
        dev.read_config(6, &mut tail);
        dev.read_config(u64::MAX, &mut far);
        assert_eq!((u64::from_le_bytes(cap), tail, far), (3, [0; 4], [0; 4]));
    }

    #[test]
    fn new_rejects_bad_images() {
        let file = TempFile::new("odd", &[0; 1000]);
        let err = BlockDevice::new(&file.0, false).unwrap_err();
        assert!(err.to_string().contains("multiple of 512"), "{err}");
        assert!(matches!(err, BlockError::UnalignedSize { len: 1000, .. }));
        let err = BlockDevice::new(&file.0.with_extension("x"), true).unwrap_err();
        assert!(matches!(err, BlockError::Open { .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }
}
