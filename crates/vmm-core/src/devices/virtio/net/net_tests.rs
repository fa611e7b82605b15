//! Unit tests of the virtio-net device: queues in guest memory driven
//! through mock split queues, a socket pair or a mock as the backend.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Address, Bytes, GuestAddress};

use super::backend::StreamBackend;
use super::*;
use crate::memory::create_guest_memory;

const MAC: [u8; 6] = [0x02, 0, 0, 0xaa, 0xbb, 0xcc];
const BUF_A: u64 = 0x10_0000;
const BUF_B: u64 = 0x20_0000;
/// Past the end of the 64 MiB test memory.
const OUTSIDE: u64 = 0x1000_0000;
const R: bool = false;
const W: bool = true;

/// A buffer as the driver offers it: address, length, device-writable.
type Buf = (u64, u32, bool);

/// One mock queue and the next free descriptor index.
struct MockQueue<'a> {
    vq: MockSplitQueue<'a, GuestMemory>,
    next_desc: u16,
}

impl MockQueue<'_> {
    fn push(&mut self, bufs: &[Buf]) -> u16 {
        let first = self.next_desc;
        let last = first + bufs.len() as u16 - 1;
        let descs: Vec<_> = (first..)
            .zip(bufs)
            .map(|(i, &(addr, len, w))| {
                let w = if w { VRING_DESC_F_WRITE } else { 0 };
                let more = if i < last { VRING_DESC_F_NEXT } else { 0 };
                SplitDescriptor::new(addr, len, (w | more) as u16, i + 1).into()
            })
            .collect();
        self.vq.add_desc_chains(&descs, first).unwrap();
        self.next_desc = last + 1;
        first
    }
}

/// An active device whose backend is one end of a socket pair.
struct Rig<'a> {
    mem: &'a GuestMemory,
    rx: MockQueue<'a>,
    tx: MockQueue<'a>,
    dev: NetDevice,
    irq: Arc<Interrupt>,
}

fn irq() -> Arc<Interrupt> {
    Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap()))
}

impl<'a> Rig<'a> {
    fn new(mem: &'a GuestMemory, backend: Box<dyn NetBackend>) -> Self {
        let rx = MockSplitQueue::create(mem, GuestAddress(0x1_0000), 64);
        let tx = MockSplitQueue::create(mem, GuestAddress(0x3_0000), 64);
        let mut dev = NetDevice::new(MAC, backend).unwrap();
        let irq = irq();
        let queues = vec![rx.create_queue().unwrap(), tx.create_queue().unwrap()];
        dev.activate(mem.clone(), queues, irq.clone(), VIRTIO_F_VERSION_1)
            .unwrap();
        let rx = MockQueue {
            vq: rx,
            next_desc: 0,
        };
        let tx = MockQueue {
            vq: tx,
            next_desc: 0,
        };
        Self {
            mem,
            rx,
            tx,
            dev,
            irq,
        }
    }

    fn with_peer(mem: &'a GuestMemory) -> (Self, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        (Self::new(mem, Box::new(StreamBackend::new(a).unwrap())), b)
    }

    fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    /// A transmit chain: a zero header at BUF_A, the frame at BUF_B.
    fn send(&mut self, frame: &[u8]) -> u16 {
        self.write(BUF_A, &[0; VNET_HDR_LEN]);
        self.write(BUF_B, frame);
        self.tx.push(&[
            (BUF_A, VNET_HDR_LEN as u32, R),
            (BUF_B, frame.len() as u32, R),
        ])
    }

    /// The used ring's index and entry `i` (id, len) of a queue.
    fn used(&self, q: &MockQueue, i: u16) -> (u16, (u32, u32)) {
        let base = q.vq.used_addr();
        let at = base.unchecked_add(4 + 8 * u64::from(i));
        let idx = self.mem.read_obj(base.unchecked_add(2)).unwrap();
        let id = self.mem.read_obj(at).unwrap();
        (idx, (id, self.mem.read_obj(at.unchecked_add(4)).unwrap()))
    }
}

/// Reads one length-prefixed frame from the peer, if a whole one is there.
fn peer_frame(peer: &mut UnixStream) -> Option<Vec<u8>> {
    let mut prefix = [0u8; 4];
    peer.read_exact(&mut prefix).ok()?;
    let mut frame = vec![0; u32::from_be_bytes(prefix) as usize];
    peer.read_exact(&mut frame).ok()?;
    Some(frame)
}

fn framed(frame: &[u8]) -> Vec<u8> {
    [&(frame.len() as u32).to_be_bytes()[..], frame].concat()
}

#[test]
fn guest_frames_reach_the_backend_without_their_header() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, mut peer) = Rig::with_peer(&mem);
    let head = rig.send(b"ethernet frame");
    rig.dev.process_tx();
    assert_eq!(peer_frame(&mut peer).unwrap(), b"ethernet frame");
    assert_eq!(rig.used(&rig.tx, 0), (1, (u32::from(head), 0)));
    assert_eq!(rig.irq.status(), INT_USED_RING);
}

#[test]
fn host_frames_fill_receive_buffers_with_a_header() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, mut peer) = Rig::with_peer(&mem);
    let head = rig.rx.push(&[(BUF_A, 2048, W)]);
    peer.write_all(&framed(b"from the host")).unwrap();
    rig.dev.process_rx();
    let len = VNET_HDR_LEN + 13;
    assert_eq!(rig.used(&rig.rx, 0), (1, (u32::from(head), len as u32)));
    let got = rig.read(BUF_A, len);
    let mut hdr = [0u8; VNET_HDR_LEN];
    hdr[10] = 1;
    assert_eq!(&got[..VNET_HDR_LEN], &hdr);
    assert_eq!(&got[VNET_HDR_LEN..], b"from the host");
}

#[test]
fn a_frame_without_a_buffer_waits_and_the_backend_is_not_read_meanwhile() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, mut peer) = Rig::with_peer(&mem);
    peer.write_all(&framed(b"one")).unwrap();
    peer.write_all(&framed(b"two")).unwrap();
    rig.dev.process_rx();
    assert_eq!(rig.dev.pending_rx, Some(3));
    assert_eq!(rig.dev.wanted_events(), Some(EventSet::empty()));
    rig.rx.push(&[(BUF_A, 2048, W)]);
    rig.rx.push(&[(BUF_B, 2048, W)]);
    rig.dev.process_rx();
    assert_eq!(rig.used(&rig.rx, 1).0, 2);
    assert_eq!(&rig.read(BUF_A + VNET_HDR_LEN as u64, 3), b"one");
    assert_eq!(&rig.read(BUF_B + VNET_HDR_LEN as u64, 3), b"two");
    assert_eq!(rig.dev.wanted_events(), Some(EventSet::IN));
}

#[test]
fn malformed_transmit_chains_are_dropped_and_the_queue_goes_on() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, mut peer) = Rig::with_peer(&mem);
    // Shorter than a header; device-writable only; outside guest memory;
    // a frame over the maximum (its length is checked, not its memory).
    rig.tx.push(&[(BUF_A, 4, R)]);
    rig.tx.push(&[(BUF_A, 64, W)]);
    rig.tx
        .push(&[(BUF_A, VNET_HDR_LEN as u32, R), (OUTSIDE, 64, R)]);
    rig.tx.push(&[
        (BUF_A, VNET_HDR_LEN as u32, R),
        (BUF_B, MAX_FRAME as u32 + 1, R),
    ]);
    rig.send(b"fine");
    rig.dev.process_tx();
    assert_eq!(rig.used(&rig.tx, 0).0, 5, "every chain returned");
    assert_eq!(rig.dev.drops().tx_malformed, 4);
    assert_eq!(peer_frame(&mut peer).unwrap(), b"fine");
    assert!(peer_frame(&mut peer).is_none());
}

#[test]
fn receive_buffers_too_small_or_read_only_get_nothing() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, mut peer) = Rig::with_peer(&mem);
    rig.rx.push(&[(BUF_A, 8, W)]);
    rig.rx.push(&[(BUF_A, 2048, R)]);
    rig.rx.push(&[(OUTSIDE, 2048, W)]);
    for _ in 0..3 {
        peer.write_all(&framed(&[9; 100])).unwrap();
    }
    rig.dev.process_rx();
    assert_eq!(rig.used(&rig.rx, 2), (3, (2, 0)));
    assert_eq!(rig.dev.drops().rx_too_big, 3);
}

#[test]
fn a_closed_backend_takes_the_link_down_but_returns_every_chain() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, peer) = Rig::with_peer(&mem);
    drop(peer);
    rig.rx.push(&[(BUF_A, 2048, W)]);
    rig.dev.process_rx();
    assert!(rig.dev.backend_gone);
    assert_eq!(rig.dev.wanted_events(), None);
    rig.send(b"into the void");
    rig.dev.process_tx();
    assert_eq!(rig.used(&rig.tx, 0).0, 1);
    assert_eq!(rig.dev.drops().tx_backend, 1);
}

/// A backend that refuses frames until told to take them.
struct Gate {
    open: Arc<Mutex<bool>>,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
    evt: EventFd,
}

impl NetBackend for Gate {
    fn fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if !*self.open.lock().unwrap() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.sent.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
    fn flush(&mut self) -> io::Result<bool> {
        Ok(*self.open.lock().unwrap())
    }
    fn recv(&mut self, _buf: &mut [u8]) -> io::Result<Option<usize>> {
        Ok(None)
    }
}

#[test]
fn a_full_backend_leaves_frames_on_the_queue_until_it_drains() {
    let mem = create_guest_memory(64).unwrap();
    let open = Arc::new(Mutex::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate {
        open: open.clone(),
        sent: sent.clone(),
        evt: EventFd::new(EFD_NONBLOCK).unwrap(),
    };
    let mut rig = Rig::new(&mem, Box::new(gate));
    rig.send(b"first");
    rig.dev.process_tx();
    assert!(rig.dev.tx_blocked);
    assert_eq!(rig.used(&rig.tx, 0).0, 0, "nothing returned while refused");
    assert_eq!(rig.dev.wanted_events(), Some(EventSet::IN | EventSet::OUT));
    *open.lock().unwrap() = true;
    rig.dev.backend_writable();
    assert_eq!(*sent.lock().unwrap(), vec![b"first".to_vec()]);
    assert_eq!(rig.used(&rig.tx, 0).0, 1);
    assert_eq!(rig.dev.wanted_events(), Some(EventSet::IN));
}

#[test]
fn config_space_holds_the_mac_and_features_offer_it() {
    let (a, _b) = UnixStream::pair().unwrap();
    let dev = NetDevice::new(MAC, Box::new(StreamBackend::new(a).unwrap())).unwrap();
    let mut mac = [0u8; 8];
    dev.read_config(0, &mut mac);
    assert_eq!(mac, [0x02, 0, 0, 0xaa, 0xbb, 0xcc, 0, 0]);
    let mut far = [0xffu8; 2];
    dev.read_config(u64::MAX, &mut far);
    assert_eq!(far, [0, 0]);
    assert_eq!(dev.avail_features(), VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC);
    assert_eq!(dev.device_type(), TYPE_NET);
    assert_eq!(dev.queue_max_sizes().len(), 2);
}

#[test]
fn frames_before_activation_are_dropped_not_kept() {
    let (a, mut peer) = UnixStream::pair().unwrap();
    let mut dev = NetDevice::new(MAC, Box::new(StreamBackend::new(a).unwrap())).unwrap();
    peer.write_all(&framed(b"early")).unwrap();
    dev.process_rx();
    dev.process_tx();
    assert_eq!(dev.drops().rx_inactive, 1);
    assert_eq!(dev.pending_rx, None);
}

#[test]
fn a_failed_send_takes_the_link_down_and_drops_what_follows() {
    let mem = create_guest_memory(64).unwrap();
    let (mut rig, peer) = Rig::with_peer(&mem);
    drop(peer);
    rig.send(b"first");
    rig.send(b"second");
    rig.dev.process_tx();
    assert!(rig.dev.backend_gone);
    assert_eq!(rig.used(&rig.tx, 1).0, 2, "both chains come back");
    assert_eq!(rig.dev.drops().tx_backend, 2);
    assert_eq!(rig.dev.wanted_events(), None);
}
