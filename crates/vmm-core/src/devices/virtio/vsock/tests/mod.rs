//! Device-level tests: a fake driver works the queues in guest memory and
//! real Unix sockets play the host programs. No KVM needed.

mod conn_unit;
mod connect;
mod data;
mod event_loop;
mod malformed;
mod reset;

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::connection::{ConnKey, CONN_BUF_ALLOC};
use super::packet::*;
use super::*;
use crate::memory::create_guest_memory;

pub(super) const GUEST_CID: u64 = 3;
/// Where the three queues' rings live.
const RING_BASE: [u64; 3] = [0x0, 0x10_000, 0x20_000];
/// Buffer regions of the rx and tx drivers.
const RX_BUFS: (u64, u64) = (0x10_0000, 0x50_0000);
const TX_BUFS: (u64, u64) = (0x50_0000, 0x90_0000);
/// The event driver's buffer region.
const EVENT_BUFS: (u64, u64) = (0x90_0000, 0x91_0000);
/// Rx buffer size Linux uses.
pub(super) const RX_BUF_LEN: u32 = 4096;

/// Socket path for a test; unique per process and test.
pub(super) fn sock_path(test: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vsock-{}-{test}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The driver side of one split queue.
pub(super) struct DriverQueue {
    size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
    /// Buffers of each outstanding chain, by head index.
    chains: HashMap<u16, Vec<(u64, u32)>>,
    bufs: (u64, u64),
    buf_next: u64,
}

impl DriverQueue {
    /// Lays out a queue at `base` and returns the device's view of it.
    pub(super) fn new(mem: &GuestMemory, base: u64, size: u16, bufs: (u64, u64)) -> (Self, Queue) {
        let mock = MockSplitQueue::create(mem, GuestAddress(base), size);
        let queue: Queue = mock.create_queue().unwrap();
        let dq = Self {
            size,
            desc: mock.desc_table_addr(),
            avail: mock.avail_addr(),
            used: mock.used_addr(),
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
            chains: HashMap::new(),
            bufs,
            buf_next: bufs.0,
        };
        (dq, queue)
    }

    /// Guest memory for a buffer of `len` bytes (bump allocation that wraps).
    pub(super) fn alloc(&mut self, len: u32) -> u64 {
        let len = u64::from(len).next_multiple_of(64);
        if self.buf_next + len > self.bufs.1 {
            self.buf_next = self.bufs.0;
        }
        let at = self.buf_next;
        self.buf_next += len;
        at
    }

    /// Writes raw descriptors (`next` is filled in for all but the last)
    /// and publishes the chain.
    pub(super) fn add_chain(&mut self, mem: &GuestMemory, descs: &[(u64, u32, u16)]) -> u16 {
        let head = self.next_desc;
        let n = descs.len() as u16;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = (head + i as u16) % self.size;
            let next = (idx + 1) % self.size;
            let flags = if i as u16 + 1 < n {
                flags | VRING_DESC_F_NEXT as u16
            } else {
                flags
            };
            self.write_desc(mem, idx, addr, len, flags, next);
        }
        self.next_desc = (head + n) % self.size;
        self.chains.insert(
            head,
            descs.iter().map(|&(a, l, _)| (a, l)).collect::<Vec<_>>(),
        );
        self.publish(mem, head);
        head
    }

    /// Writes one descriptor as is.
    pub(super) fn write_desc(
        &self,
        mem: &GuestMemory,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let raw = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
        mem.write_obj(raw, self.desc.unchecked_add(16 * u64::from(idx)))
            .unwrap();
    }

    /// Puts `head` in the avail ring.
    pub(super) fn publish(&mut self, mem: &GuestMemory, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        mem.write_obj(head, self.avail.unchecked_add(4 + 2 * slot))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, self.avail.unchecked_add(2))
            .unwrap();
    }

    /// Overwrites the avail index (for malformed-ring tests).
    pub(super) fn set_avail_idx(&mut self, mem: &GuestMemory, idx: u16) {
        self.avail_idx = idx;
        mem.write_obj(idx, self.avail.unchecked_add(2)).unwrap();
    }

    /// The next used element, if the device returned one.
    pub(super) fn pop_used(&mut self, mem: &GuestMemory) -> Option<(u16, u32)> {
        let used_idx: u16 = mem.read_obj(self.used.unchecked_add(2)).unwrap();
        if used_idx == self.used_seen {
            return None;
        }
        let slot = u64::from(self.used_seen % self.size);
        let id: u32 = mem.read_obj(self.used.unchecked_add(4 + 8 * slot)).unwrap();
        let len: u32 = mem.read_obj(self.used.unchecked_add(8 + 8 * slot)).unwrap();
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((id as u16, len))
    }

    /// Chains given to the device and not returned yet.
    pub(super) fn outstanding(&self) -> usize {
        self.avail_idx.wrapping_sub(self.used_seen) as usize
    }
}

/// Queues a tx packet (header and payload in one readable buffer).
pub(super) fn queue_packet(
    mem: &GuestMemory,
    tx: &mut DriverQueue,
    hdr: PacketHeader,
    payload: &[u8],
) {
    let mut bytes = hdr.to_bytes().to_vec();
    bytes.extend_from_slice(payload);
    let at = tx.alloc(bytes.len() as u32);
    mem.write_slice(&bytes, GuestAddress(at)).unwrap();
    tx.add_chain(mem, &[(at, bytes.len() as u32, 0)]);
}

/// Offers `n` rx buffers of `len` bytes.
pub(super) fn add_rx_buffers(mem: &GuestMemory, rx: &mut DriverQueue, n: usize, len: u32) {
    for _ in 0..n {
        let at = rx.alloc(len);
        rx.add_chain(mem, &[(at, len, VRING_DESC_F_WRITE as u16)]);
    }
}

/// The next packet the device put in an rx buffer.
pub(super) fn recv_packet(
    mem: &GuestMemory,
    rx: &mut DriverQueue,
) -> Option<(PacketHeader, Vec<u8>)> {
    let (id, len) = rx.pop_used(mem)?;
    let bufs = rx.chains.remove(&id).expect("used id is a chain head");
    let mut bytes = Vec::new();
    for (addr, blen) in bufs {
        let mut b = vec![0u8; blen as usize];
        mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
        bytes.extend_from_slice(&b);
    }
    bytes.truncate(len as usize);
    if bytes.len() < HDR_SIZE {
        return Some((PacketHeader::default(), bytes));
    }
    let hdr = PacketHeader::from_bytes(bytes[..HDR_SIZE].try_into().unwrap());
    assert_eq!(
        hdr.len as usize,
        bytes.len() - HDR_SIZE,
        "used len matches header"
    );
    Some((hdr, bytes[HDR_SIZE..].to_vec()))
}

/// A guest->host header with the test guest's defaults.
pub(super) fn ghdr(op: u16, src_port: u32, dst_port: u32) -> PacketHeader {
    PacketHeader {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: 0,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: CONN_BUF_ALLOC,
        fwd_cnt: 0,
    }
}

/// An activated device, its driver queues and a host socket directory.
pub(super) struct VsockHarness {
    pub mem: GuestMemory,
    pub dev: VsockDevice,
    pub rx: DriverQueue,
    pub tx: DriverQueue,
    pub ev: DriverQueue,
    pub irq: Arc<Interrupt>,
    pub path: PathBuf,
    extra_paths: Vec<PathBuf>,
}

impl VsockHarness {
    pub(super) fn new(test: &str) -> Self {
        let path = sock_path(test);
        let dev = VsockDevice::new(GUEST_CID, path.clone()).unwrap();
        Self::with_device(dev, path)
    }

    pub(super) fn with_device(mut dev: VsockDevice, path: PathBuf) -> Self {
        let mem = create_guest_memory(16).unwrap();
        let (rx, rxq) = DriverQueue::new(&mem, RING_BASE[0], QUEUE_SIZE, RX_BUFS);
        let (tx, txq) = DriverQueue::new(&mem, RING_BASE[1], QUEUE_SIZE, TX_BUFS);
        let (ev, evq) = DriverQueue::new(&mem, RING_BASE[2], QUEUE_SIZE, EVENT_BUFS);
        let irq = Arc::new(Interrupt::new(
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
        ));
        dev.activate(
            mem.clone(),
            vec![rxq, txq, evq],
            irq.clone(),
            VIRTIO_F_VERSION_1,
        )
        .unwrap();
        Self {
            mem,
            dev,
            rx,
            tx,
            ev,
            irq,
            path,
            extra_paths: Vec::new(),
        }
    }

    /// A host listener at `<path>_<port>` for guest-initiated connections.
    pub(super) fn host_listener(&mut self, port: u32) -> UnixListener {
        let mut p = self.path.clone().into_os_string();
        p.push(format!("_{port}"));
        let p = PathBuf::from(p);
        let _ = std::fs::remove_file(&p);
        let l = UnixListener::bind(&p).unwrap();
        self.extra_paths.push(p);
        l
    }

    /// Queues a tx packet (header and payload in one readable buffer).
    pub(super) fn queue_tx(&mut self, hdr: PacketHeader, payload: &[u8]) {
        queue_packet(&self.mem, &mut self.tx, hdr, payload);
    }

    /// Sends one packet (`len` set from the payload) and lets the device act.
    pub(super) fn send(&mut self, mut hdr: PacketHeader, payload: &[u8]) {
        hdr.len = payload.len() as u32;
        self.queue_tx(hdr, payload);
        self.dev.handle_tx();
        self.dev.handle_rx();
    }

    /// Offers `n` rx buffers of `len` bytes.
    pub(super) fn give_rx(&mut self, n: usize, len: u32) {
        add_rx_buffers(&self.mem, &mut self.rx, n, len);
    }

    /// The next packet the device put in an rx buffer.
    pub(super) fn recv(&mut self) -> Option<(PacketHeader, Vec<u8>)> {
        recv_packet(&self.mem, &mut self.rx)
    }

    /// Every packet the device has delivered so far.
    pub(super) fn recv_all(&mut self) -> Vec<(PacketHeader, Vec<u8>)> {
        std::iter::from_fn(|| self.recv()).collect()
    }

    /// One round of everything the event loop would do.
    pub(super) fn service(&mut self) {
        self.dev.backend.handle_listener();
        self.dev.backend.poll_all();
        self.dev.handle_tx();
        self.dev.handle_rx();
    }

    /// Host program connects and asks for guest `port`; returns its socket
    /// and the REQUEST the guest received.
    pub(super) fn host_connect(&mut self, port: u32) -> (UnixStream, PacketHeader) {
        let host = self.host_asks(port);
        let (req, _) = self.recv().expect("REQUEST delivered to the guest");
        assert_eq!(req.op, OP_REQUEST);
        (host, req)
    }

    /// Host program connects and asks for guest `port` (rx buffers
    /// offered, the device serviced); its socket.
    pub(super) fn host_asks(&mut self, port: u32) -> UnixStream {
        let host = UnixStream::connect(&self.path).unwrap();
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::io::Write::write_all(&mut &host, format!("CONNECT {port}\n").as_bytes()).unwrap();
        if self.rx.outstanding() == 0 {
            self.give_rx(8, RX_BUF_LEN);
        }
        self.service();
        self.service();
        host
    }

    /// Completes a host-initiated connect: guest answers, host reads OK.
    pub(super) fn accept_host(&mut self, host: &UnixStream, req: &PacketHeader) -> ConnKey {
        self.send(ghdr(OP_RESPONSE, req.dst_port, req.src_port), &[]);
        let line = read_line(host);
        assert_eq!(line, format!("OK {}\n", req.src_port));
        ConnKey {
            local_port: req.src_port,
            peer_port: req.dst_port,
        }
    }

    /// Guest connects from `guest_port` to host `port`; returns the reply.
    pub(super) fn guest_connect(&mut self, guest_port: u32, port: u32) -> PacketHeader {
        if self.rx.outstanding() == 0 {
            self.give_rx(8, RX_BUF_LEN);
        }
        self.send(ghdr(OP_REQUEST, guest_port, port), &[]);
        self.recv().expect("a reply to the REQUEST").0
    }

    /// Reads from a non-blocking host socket what is there now.
    pub(super) fn host_read_available(host: &mut UnixStream, out: &mut Vec<u8>) -> bool {
        let mut buf = [0u8; 16384];
        loop {
            match host.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) => panic!("host read: {e}"),
            }
        }
    }
}

impl Drop for VsockHarness {
    fn drop(&mut self) {
        for p in &self.extra_paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Reads one `\n`-terminated line byte by byte (blocking, with timeout).
pub(super) fn read_line(mut s: &UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match s.read(&mut b) {
            Ok(1) => line.push(b[0]),
            other => panic!("reading line {line:?}: {other:?}"),
        }
    }
    String::from_utf8(line).unwrap()
}

/// Whether the peer of `s` closed (EOF or reset) within a second.
pub(super) fn host_sees_close(mut s: &UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}
