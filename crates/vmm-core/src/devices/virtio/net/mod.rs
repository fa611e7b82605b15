//! virtio-net: one receive and one transmit queue between the guest and a
//! host [`backend`] (a TAP interface or `passt`), served on the event loop
//! thread.
//!
//! Frames from the guest are untrusted: chains are walked with
//! `virtio_queue`'s bounds checks and each frame is copied through one
//! buffer of [`backend::MAX_FRAME`] bytes, so a bad chain costs at most the
//! frame. Nothing is unbounded: a backend that cannot take a frame leaves
//! the transmit queue waiting; a frame from the host with no receive buffer
//! to go to waits alone, and the backend is not read until the guest posts
//! buffers. No offload is offered, so every header is all zero.

pub mod backend;
pub mod egress;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use self::backend::{NetBackend, MAX_FRAME, VNET_HDR_LEN};
use super::{
    read_config_space, ActivateError, Interrupt, VirtioDevice, INT_USED_RING, VIRTIO_F_VERSION_1,
};
use crate::memory::GuestMemory;

/// Device type of a network device.
pub const TYPE_NET: u32 = 1;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Feature bit: the device has a MAC address in its configuration space.
const VIRTIO_NET_F_MAC: u64 = 1 << 5;
/// The receive queue's index.
const RX: usize = 0;
/// The transmit queue's index.
const TX: usize = 1;

/// Why a network device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A queue notification eventfd could not be created.
    #[error("cannot create the virtio-net queue eventfds")]
    EventFd(#[source] std::io::Error),
}

/// What `activate` hands over, dropped on reset.
struct Active {
    mem: GuestMemory,
    rx: Queue,
    tx: Queue,
    irq: Arc<Interrupt>,
}

/// Frames dropped, by cause, for the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetDrops {
    /// Guest frames that were malformed or too large.
    pub tx_malformed: u64,
    /// Guest frames the backend failed on.
    pub tx_backend: u64,
    /// Host frames that did not fit the guest's buffer.
    pub rx_too_big: u64,
    /// Host frames that came while the driver was not running.
    pub rx_inactive: u64,
}

/// A virtio-net device. Offers `VIRTIO_F_VERSION_1` and
/// `VIRTIO_NET_F_MAC`; its configuration space holds the MAC address.
pub struct NetDevice {
    mac: [u8; 6],
    backend: Box<dyn NetBackend>,
    queue_evts: [EventFd; 2],
    active: Option<Active>,
    /// A host frame (its length in `rx_buf`) waiting for a receive buffer.
    pending_rx: Option<usize>,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    /// The backend refused a frame: the transmit queue waits until it drains.
    tx_blocked: bool,
    /// The backend holds output it could not send yet.
    tx_held: bool,
    /// The backend failed or hung up; no more frames either way.
    backend_gone: bool,
    /// What the event loop watches on the backend's fd.
    watching: Option<EventSet>,
    drops: NetDrops,
}

impl std::fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetDevice")
            .field("mac", &self.mac)
            .field("active", &self.active.is_some())
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

impl NetDevice {
    /// A device with address `mac` whose frames go to `backend`.
    pub fn new(mac: [u8; 6], backend: Box<dyn NetBackend>) -> Result<Self, NetError> {
        let evt = || EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(NetError::EventFd);
        Ok(Self {
            mac,
            backend,
            queue_evts: [evt()?, evt()?],
            active: None,
            pending_rx: None,
            rx_buf: vec![0; MAX_FRAME],
            tx_buf: vec![0; MAX_FRAME],
            tx_blocked: false,
            tx_held: false,
            backend_gone: false,
            watching: None,
            drops: NetDrops::default(),
        })
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Frames dropped so far.
    pub fn drops(&self) -> NetDrops {
        self.drops
    }

    fn backend_failed(&mut self, what: &str, e: &std::io::Error) {
        if !self.backend_gone {
            tracing::warn!("virtio-net: the backend failed while {what}, the link is down: {e}");
        }
        self.backend_gone = true;
        self.pending_rx = None;
    }

    /// Sends every frame the guest queued, until the backend is full.
    pub fn process_tx(&mut self) {
        let _ = self.queue_evts[TX].read();
        let Some(active) = self.active.as_mut() else {
            return;
        };
        if self.tx_blocked {
            return;
        }
        let mem = &active.mem;
        let mut used_any = false;
        // Recorded here and reported after the loop, which borrows the queue.
        let mut failure = None;
        while let Some(chain) = active.tx.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let link_up = !self.backend_gone && failure.is_none();
            match read_frame(mem, &chain, &mut self.tx_buf) {
                Some(len) if link_up => match self.backend.send(&self.tx_buf[..len]) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Offered again once the backend drains.
                        active.tx.go_to_previous_position();
                        self.tx_blocked = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                        self.drops.tx_backend += 1;
                    }
                    Err(e) => {
                        self.drops.tx_backend += 1;
                        failure = Some(e);
                    }
                },
                // A dead link drops what the guest sends, as a cable would.
                Some(_) => self.drops.tx_backend += 1,
                None => self.drops.tx_malformed += 1,
            }
            match active.tx.add_used(mem, head, 0) {
                Ok(()) => used_any = true,
                Err(e) => tracing::warn!("virtio-net: cannot return tx chain {head}: {e}"),
            }
        }
        if used_any {
            notify(active, TX);
        }
        if let Some(e) = failure {
            self.backend_failed("sending", &e);
        }
        if !self.backend_gone {
            match self.backend.flush() {
                Ok(done) => self.tx_held = !done,
                Err(e) => self.backend_failed("sending", &e),
            }
        }
    }

    /// Delivers host frames into the guest's receive buffers until either
    /// runs out.
    pub fn process_rx(&mut self) {
        let _ = self.queue_evts[RX].read();
        loop {
            let len = match self.pending_rx.take() {
                Some(len) => len,
                None if self.backend_gone => return,
                None => match self.backend.recv(&mut self.rx_buf) {
                    Ok(Some(len)) => len,
                    Ok(None) => return,
                    Err(e) => return self.backend_failed("receiving", &e),
                },
            };
            let Some(active) = self.active.as_mut() else {
                self.drops.rx_inactive += 1;
                continue;
            };
            let mem = &active.mem;
            let Some(chain) = active.rx.pop_descriptor_chain(mem) else {
                self.pending_rx = Some(len);
                return;
            };
            let head = chain.head_index();
            let written = write_frame(mem, &chain, &self.rx_buf[..len]).unwrap_or_else(|| {
                self.drops.rx_too_big += 1;
                0
            });
            if let Err(e) = active.rx.add_used(mem, head, written) {
                tracing::warn!("virtio-net: cannot return rx chain {head}: {e}");
            }
            notify(active, RX);
        }
    }

    /// The backend's fd is writable: push held output, then what the
    /// guest queued meanwhile.
    fn backend_writable(&mut self) {
        match self.backend.flush() {
            Ok(true) => {
                self.tx_held = false;
                if std::mem::take(&mut self.tx_blocked) {
                    self.process_tx();
                }
            }
            Ok(false) => {}
            Err(e) => {
                self.backend_failed("sending", &e);
                self.tx_blocked = false;
                self.process_tx();
            }
        }
    }

    /// What the event loop should watch on the backend's fd now: readable
    /// unless a frame waits for a buffer, writable while output is held.
    fn wanted_events(&self) -> Option<EventSet> {
        if self.backend_gone {
            return None;
        }
        let mut set = EventSet::empty();
        if self.pending_rx.is_none() {
            set |= EventSet::IN;
        }
        if self.tx_blocked || self.tx_held {
            set |= EventSet::OUT;
        }
        Some(set)
    }

    fn update_watch(&mut self, ops: &mut EventOps) {
        let wanted = self.wanted_events();
        if wanted == self.watching {
            return;
        }
        let fd = self.backend.fd();
        let result = match (self.watching, wanted) {
            (None, Some(set)) => ops.add(Events::with_data_raw(fd, 0, set)),
            (Some(_), Some(set)) => ops.modify(Events::with_data_raw(fd, 0, set)),
            (Some(_), None) => ops.remove(Events::with_data_raw(fd, 0, EventSet::empty())),
            (None, None) => Ok(()),
        };
        match result {
            Ok(()) => self.watching = wanted,
            Err(e) => tracing::warn!("virtio-net: cannot watch the backend: {e:?}"),
        }
    }
}

/// Raises the queue's interrupt when the driver wants one.
fn notify(active: &mut Active, queue: usize) {
    let q = if queue == RX {
        &mut active.rx
    } else {
        &mut active.tx
    };
    // Without a readable used_event we cannot know, so notify.
    if q.needs_notification(&active.mem).unwrap_or(true) {
        if let Err(e) = active.irq.trigger(INT_USED_RING) {
            tracing::warn!("virtio-net: cannot raise the interrupt: {e}");
        }
    }
}

/// The frame of a transmit chain (after its virtio-net header) copied into
/// `buf`; `None` when the chain is malformed, has no header, or holds more
/// than [`MAX_FRAME`] bytes of frame.
fn read_frame(
    mem: &GuestMemory,
    chain: &DescriptorChain<&GuestMemory>,
    buf: &mut [u8],
) -> Option<usize> {
    let mut reader = chain.clone().reader(mem).ok()?;
    let len = reader.available_bytes().checked_sub(VNET_HDR_LEN)?;
    let frame = buf.get_mut(..len)?;
    let mut hdr = [0u8; VNET_HDR_LEN];
    reader.read_exact(&mut hdr).ok()?;
    reader.read_exact(frame).ok()?;
    Some(len)
}

/// Writes an all-zero header (one buffer) and `frame` into a receive
/// chain; the bytes written, or `None` when it does not fit.
fn write_frame(
    mem: &GuestMemory,
    chain: &DescriptorChain<&GuestMemory>,
    frame: &[u8],
) -> Option<u32> {
    let mut writer = chain.clone().writer(mem).ok()?;
    let total = VNET_HDR_LEN + frame.len();
    if writer.available_bytes() < total {
        return None;
    }
    let mut hdr = [0u8; VNET_HDR_LEN];
    // num_buffers (le16 at 10): the frame is in this one chain.
    hdr[10] = 1;
    writer.write_all(&hdr).ok()?;
    writer.write_all(frame).ok()?;
    u32::try_from(total).ok()
}

impl VirtioDevice for NetDevice {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.mac, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is read-only once VIRTIO_F_VERSION_1 is negotiated.
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<Interrupt>,
        _acked_features: u64,
    ) -> Result<(), ActivateError> {
        let got = queues.len();
        let Ok([rx, tx]) = <[Queue; 2]>::try_from(queues) else {
            return Err(ActivateError::QueueCount { got, want: 2 });
        };
        self.active = Some(Active { mem, rx, tx, irq });
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.pending_rx = None;
        self.tx_blocked = false;
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active
            .iter()
            .flat_map(|a| [a.rx.state(), a.tx.state()])
            .collect()
    }
}

impl MutEventSubscriber for NetDevice {
    fn init(&mut self, ops: &mut EventOps) {
        for evt in &self.queue_evts {
            if let Err(e) = ops.add(Events::new(evt, EventSet::IN)) {
                tracing::warn!("virtio-net: cannot watch a queue, the link will hang: {e:?}");
            }
        }
        self.update_watch(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.queue_evts[TX].as_raw_fd() {
            self.process_tx();
            // A filter's answer to what was sent (a reset) waits for no fd.
            if self.backend.has_queued() {
                self.process_rx();
            }
        } else if fd == self.queue_evts[RX].as_raw_fd() {
            self.process_rx();
        } else if fd == self.backend.fd() {
            let set = events.event_set();
            if set.intersects(EventSet::HANG_UP | EventSet::ERROR) && !set.contains(EventSet::IN) {
                self.backend_failed(
                    "waiting",
                    &std::io::Error::from(std::io::ErrorKind::BrokenPipe),
                );
            }
            if set.contains(EventSet::OUT) {
                self.backend_writable();
            }
            if set.contains(EventSet::IN) {
                self.process_rx();
            }
        }
        self.update_watch(ops);
    }
}

#[cfg(test)]
mod tests {
    // Unit tests of the virtio-net device: queues in guest memory driven
    // through mock split queues, a socket pair or a mock as the backend.

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
        Arc::new(Interrupt::new(
            EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
        ))
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
            evt: EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
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
}
