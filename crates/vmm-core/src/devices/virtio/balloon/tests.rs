//! The balloon driven through mock queues: reports dropping pages,
//! statistics held until asked for, and both across a snapshot.

use std::time::Duration;

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Address, Bytes, GuestAddress};

use super::*;
use crate::memory::create_guest_memory;

/// Where each queue's rings live, and the buffers.
const RINGS: [u64; 4] = [0x1_0000, 0x2_0000, 0x3_0000, 0x4_0000];
const STATS_BUF: u64 = 0x10_0000;
const FREED: u64 = 0x20_0000;

fn active_device(
    mem: &GuestMemory,
    saved: Option<BalloonState>,
    queues: Vec<Queue>,
) -> (BalloonDevice, Arc<Interrupt>) {
    let mut dev = BalloonDevice::new(saved).unwrap();
    let irq = Arc::new(Interrupt::new(
        EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
    ));
    let features = VIRTIO_F_VERSION_1 | F_STATS_VQ | F_REPORTING;
    dev.activate(mem.clone(), queues, irq.clone(), features)
        .unwrap();
    (dev, irq)
}

/// An active balloon driven through mock queues.
struct Rig<'a> {
    mem: &'a GuestMemory,
    vqs: Vec<MockSplitQueue<'a, GuestMemory>>,
    dev: BalloonDevice,
    irq: Arc<Interrupt>,
}

impl<'a> Rig<'a> {
    fn new(mem: &'a GuestMemory) -> Self {
        let vqs: Vec<_> = RINGS
            .iter()
            .zip(QUEUE_SIZES)
            .map(|(&at, size)| MockSplitQueue::create(mem, GuestAddress(at), size))
            .collect();
        let queues = vqs.iter().map(|vq| vq.create_queue().unwrap()).collect();
        let dev = active_device(mem, None, queues);
        Self {
            mem,
            vqs,
            irq: dev.1,
            dev: dev.0,
        }
    }

    /// The device as a snapshot saves it (its state through the snapshot
    /// encoding) and a restore makes it again, on the same rings.
    fn snapshot_and_restore(self) -> Self {
        let bytes = postcard::to_stdvec(&self.dev.save_state()).unwrap();
        let state: BalloonState = postcard::from_bytes(&bytes).unwrap();
        let queues = self
            .dev
            .queue_states()
            .into_iter()
            .map(|s| Queue::try_from(s).unwrap())
            .collect();
        let (dev, irq) = active_device(self.mem, Some(state), queues);
        Self { dev, irq, ..self }
    }

    /// Offers one chain of `(addr, len)` buffers on queue `q`, descriptors
    /// from `first`.
    fn push(&mut self, q: usize, first: u16, bufs: &[(u64, u32)], writable: bool) {
        let last = first + bufs.len() as u16 - 1;
        let descs: Vec<_> = (first..)
            .zip(bufs)
            .map(|(i, &(addr, len))| {
                let w = if writable { VRING_DESC_F_WRITE } else { 0 };
                let more = if i < last { VRING_DESC_F_NEXT } else { 0 };
                SplitDescriptor::new(addr, len, (w | more) as u16, i + 1).into()
            })
            .collect();
        self.vqs[q].add_desc_chains(&descs, first).unwrap();
    }

    fn kick(&mut self, q: usize) {
        self.dev.queue_events()[q].write(1).unwrap();
        self.dev.process_queue(q);
    }

    /// The used ring's index of queue `q`.
    fn used_idx(&self, q: usize) -> u16 {
        self.mem
            .read_obj(self.vqs[q].used_addr().unchecked_add(2))
            .unwrap()
    }

    fn write_stats(&self, pairs: &[(u16, u64)]) -> u32 {
        let bytes: Vec<u8> = pairs
            .iter()
            .flat_map(|(t, v)| [&t.to_le_bytes()[..], &v.to_le_bytes()].concat())
            .collect();
        self.mem
            .write_slice(&bytes, GuestAddress(STATS_BUF))
            .unwrap();
        bytes.len() as u32
    }
}

#[test]
fn reported_pages_are_dropped_and_counted() {
    let mem = create_guest_memory(16).unwrap();
    let mut rig = Rig::new(&mem);
    mem.write_slice(&[0xab; 8192], GuestAddress(FREED)).unwrap();
    // Two pages, plus a range that is not whole pages (ignored).
    rig.push(REPORTING, 0, &[(FREED, 8192), (FREED + 100, 4096)], true);
    rig.kick(REPORTING);
    assert_eq!(rig.used_idx(REPORTING), 1, "the buffer came back");
    assert_eq!(rig.irq.irq().read().unwrap(), 1);
    let mut back = [0xffu8; 8192];
    mem.read_slice(&mut back, GuestAddress(FREED)).unwrap();
    assert!(back.iter().all(|&b| b == 0), "the host's copy was dropped");
    let figures = rig.dev.handle().figures();
    assert_eq!((figures.reported_bytes, figures.reports), (8192, 1));
}

#[test]
fn a_range_outside_guest_memory_is_ignored() {
    let mem = create_guest_memory(16).unwrap();
    let mut rig = Rig::new(&mem);
    rig.push(REPORTING, 0, &[(64 << 20, 4096)], true);
    rig.kick(REPORTING);
    assert_eq!(rig.used_idx(REPORTING), 1);
    assert_eq!(rig.dev.handle().figures().reported_bytes, 0);
}

#[test]
fn statistics_are_held_until_asked_for() {
    let mem = create_guest_memory(16).unwrap();
    let mut rig = Rig::new(&mem);
    let len = rig.write_stats(&[(4, 1000), (5, 4000)]);
    rig.push(STATS, 0, &[(STATS_BUF, len)], false);
    rig.kick(STATS);
    assert_eq!(rig.used_idx(STATS), 0, "held, not returned");
    let figures = rig.dev.handle().figures();
    assert_eq!(figures.stats_updates, 1);
    assert_eq!(figures.stats.unwrap().total_bytes, Some(4000));
    // A request hands it back so the driver refills it.
    rig.dev.shared.refresh.write(1).unwrap();
    rig.dev.request_stats();
    assert_eq!(rig.used_idx(STATS), 1);
    assert_eq!(rig.dev.stats_head, None);
}

#[test]
fn the_held_buffer_survives_a_snapshot() {
    let mem = create_guest_memory(16).unwrap();
    let mut rig = Rig::new(&mem);
    let len = rig.write_stats(&[(4, 7)]);
    rig.push(STATS, 0, &[(STATS_BUF, len)], false);
    rig.kick(STATS);
    rig.push(REPORTING, 0, &[(FREED, 4096)], true);
    rig.kick(REPORTING);
    assert_eq!(rig.dev.save_state().stats_head, Some(0));
    let mut restored = rig.snapshot_and_restore();
    let figures = restored.dev.handle().figures();
    assert_eq!((figures.reported_bytes, figures.stats_updates), (4096, 1));
    restored.dev.shared.refresh.write(1).unwrap();
    restored.dev.request_stats();
    assert_eq!(restored.used_idx(STATS), 1);
    let len = restored.write_stats(&[(4, 8)]);
    restored.push(STATS, 1, &[(STATS_BUF, len)], false);
    restored.kick(STATS);
    let got = restored.dev.handle().fresh_figures(Duration::ZERO);
    assert_eq!(got.stats.unwrap().free_bytes, Some(8));
}

#[test]
fn a_driver_without_the_features_is_refused() {
    let mem = create_guest_memory(16).unwrap();
    let vq = MockSplitQueue::create(&mem, GuestAddress(RINGS[0]), 64);
    let mut dev = BalloonDevice::new(None).unwrap();
    let irq = Arc::new(Interrupt::new(
        EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
    ));
    let queues = vec![vq.create_queue().unwrap(), vq.create_queue().unwrap()];
    assert!(dev
        .activate(mem.clone(), queues, irq, VIRTIO_F_VERSION_1)
        .is_err());
}
