//! virtio-balloon (device type 5), used to give memory back rather than to
//! take it: the target stays at 0 pages, so the driver never inflates.
//!
//! - **Free page reporting** (`VIRTIO_BALLOON_F_REPORTING`): the guest hands
//!   over ranges of memory it has freed; the device drops the host's copy
//!   of them (`MADV_DONTNEED` on the private mapping: anonymous memory reads
//!   as zeros again, a restored guest's memory as its snapshot file's
//!   shared pages) and returns the buffers.
//! - **Statistics** (`VIRTIO_BALLOON_F_STATS_VQ`): the driver keeps one
//!   buffer of (tag, value) pairs queued. The device holds it and hands it
//!   back only when someone asks for fresh figures, so an idle guest is
//!   never woken for them; the driver refills it and queues it again.
//!
//! The held statistics buffer is the device's only state beyond its
//! queues; [`BalloonState`] keeps it (and the figures) in snapshots.

pub mod figures;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{read_config_space, ActivateError, Interrupt, VirtioDevice, INT_USED_RING};
use super::{TYPE_BALLOON, VIRTIO_F_VERSION_1};
use crate::memory::GuestMemory;
pub use figures::{BalloonFigures, BalloonHandle, GuestMemoryStats};
use figures::{Shared, MAX_STATS, STAT_LEN};

/// The driver sends memory statistics on a third queue.
pub const F_STATS_VQ: u64 = 1 << 1;
/// The driver reports free pages on the last queue.
pub const F_REPORTING: u64 = 1 << 5;

// Queues 0 and 1 take pages given and taken back (inflate, deflate).
const STATS: usize = 2;
const REPORTING: usize = 3;
/// Queue sizes, by index. Linux needs at least 32 (its report batch) on the
/// reporting queue; the statistics queue only ever holds one buffer.
const QUEUE_SIZES: [u16; 4] = [64, 64, 2, 64];
/// Guest page size: reported ranges are whole pages.
const PAGE: u64 = 4096;

/// Why the balloon could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BalloonError {
    /// An eventfd could not be created.
    #[error("could not create an eventfd")]
    EventFd(#[source] std::io::Error),
}

/// The balloon's state in a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// The statistics buffer the device holds (its chain's head), which
    /// the restored device hands back when asked.
    pub stats_head: Option<u16>,
    /// The figures so far.
    pub figures: BalloonFigures,
}

struct Active {
    mem: GuestMemory,
    queues: Vec<Queue>,
    irq: Arc<Interrupt>,
}

/// The device.
pub struct BalloonDevice {
    queue_events: Vec<EventFd>,
    shared: Arc<Shared>,
    /// The statistics buffer held until fresh figures are wanted.
    stats_head: Option<u16>,
    /// What the driver wrote to `actual` (pages it holds; always 0 here).
    actual_pages: u32,
    active: Option<Active>,
}

impl std::fmt::Debug for BalloonDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalloonDevice")
            .field("stats_head", &self.stats_head)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl BalloonDevice {
    /// A device that starts from `saved` (a restore) or from nothing.
    pub fn new(saved: Option<BalloonState>) -> Result<Self, BalloonError> {
        let event =
            || EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(BalloonError::EventFd);
        let saved = saved.unwrap_or_default();
        Ok(Self {
            queue_events: QUEUE_SIZES
                .iter()
                .map(|_| event())
                .collect::<Result<_, _>>()?,
            shared: Arc::new(Shared::new(event()?, saved.figures)),
            stats_head: saved.stats_head,
            actual_pages: 0,
            active: None,
        })
    }

    /// A handle other threads read the figures through.
    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle {
            shared: self.shared.clone(),
        }
    }

    /// The state a snapshot keeps (the device is quiescent).
    pub fn save_state(&self) -> BalloonState {
        BalloonState {
            stats_head: self.stats_head,
            figures: *self.shared.figures(),
        }
    }

    /// Serves queue `index` after its notification.
    fn process_queue(&mut self, index: usize) {
        let _ = self.queue_events[index].read();
        let Some(Active { mem, queues, irq }) = self.active.as_mut() else {
            return;
        };
        let queue = &mut queues[index];
        let mut used_any = false;
        while let Some(chain) = queue.pop_descriptor_chain(&*mem) {
            let head = chain.head_index();
            match index {
                STATS => {
                    // A driver that queues a second buffer gets the first back.
                    if let Some(old) = self.stats_head.replace(head) {
                        used_any |= give_back(queue, mem, index, old);
                    }
                    let mut buf = [0u8; STAT_LEN * MAX_STATS];
                    let read = chain
                        .reader(mem)
                        .map(|mut r| {
                            let n = r.available_bytes().min(buf.len());
                            r.read_exact(&mut buf[..n]).map(|()| n).unwrap_or(0)
                        })
                        .unwrap_or(0);
                    self.shared
                        .stats_arrived(GuestMemoryStats::parse(&buf[..read]));
                    continue;
                }
                REPORTING => {
                    let bytes: u64 = chain
                        .map(|d| discard(mem, d.addr().0, u64::from(d.len())))
                        .sum();
                    let mut figures = self.shared.figures();
                    figures.reported_bytes += bytes;
                    figures.reports += 1;
                }
                // The target is always 0 pages, so there is nothing to do
                // for pages given or taken back but to return the buffers.
                _ => {}
            }
            used_any |= give_back(queue, mem, index, head);
        }
        if used_any {
            notify(queue, mem, irq);
        }
    }

    /// Hands the held statistics buffer back, asking for fresh figures.
    fn request_stats(&mut self) {
        let _ = self.shared.refresh.read();
        let Some(Active { mem, queues, irq }) = self.active.as_mut() else {
            return;
        };
        if let Some(head) = self.stats_head.take() {
            if give_back(&mut queues[STATS], mem, STATS, head) {
                notify(&mut queues[STATS], mem, irq);
            }
        }
    }
}

/// Returns chain `head` on `queue` (number `index`); false if it could not be.
fn give_back(queue: &mut Queue, mem: &GuestMemory, index: usize, head: u16) -> bool {
    match queue.add_used(mem, head, 0) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("balloon: cannot return chain {head} on queue {index}: {e}");
            false
        }
    }
}

fn notify(queue: &mut Queue, mem: &GuestMemory, irq: &Interrupt) {
    if queue.needs_notification(mem).unwrap_or(true) {
        if let Err(e) = irq.trigger(INT_USED_RING) {
            tracing::warn!("balloon: cannot raise the interrupt: {e}");
        }
    }
}

/// Drops the host's copy of the whole pages in `[addr, addr + len)`;
/// returns the bytes dropped (0 for a range that is not whole pages inside
/// one region of guest memory, which the driver never sends).
fn discard(mem: &GuestMemory, addr: u64, len: u64) -> u64 {
    if len == 0 || !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
        return 0;
    }
    let Ok(len_usize) = usize::try_from(len) else {
        return 0;
    };
    let Ok(slice) = mem.get_slice(GuestAddress(addr), len_usize) else {
        return 0;
    };
    // SAFETY: the range is whole pages inside one mapping of guest memory
    // (get_slice checked it); MADV_DONTNEED on a private mapping only makes
    // the guest see zeros (anonymous) or the file's bytes (a snapshot) in
    // pages it has freed and reported, which it does not read before
    // writing again.
    let rc = unsafe {
        libc::madvise(
            slice.ptr_guard_mut().as_ptr().cast(),
            len_usize,
            libc::MADV_DONTNEED,
        )
    };
    if rc != 0 {
        tracing::warn!(
            "balloon: cannot drop {len} bytes at {addr:#x}: {}",
            std::io::Error::last_os_error()
        );
        return 0;
    }
    len
}

impl VirtioDevice for BalloonDevice {
    fn device_type(&self) -> u32 {
        TYPE_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | F_STATS_VQ | F_REPORTING
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // num_pages (the target: 0), then actual.
        let mut space = [0u8; 8];
        space[4..].copy_from_slice(&self.actual_pages.to_le_bytes());
        read_config_space(&space, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if let (4, Ok(bytes)) = (offset, <[u8; 4]>::try_from(data)) {
            self.actual_pages = u32::from_le_bytes(bytes);
        }
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<Interrupt>,
        acked_features: u64,
    ) -> Result<(), ActivateError> {
        // The queue numbering assumes both features; a driver without them
        // sets up fewer queues and is refused here.
        let want = QUEUE_SIZES.len();
        if queues.len() != want
            || acked_features & (F_STATS_VQ | F_REPORTING) != F_STATS_VQ | F_REPORTING
        {
            return Err(ActivateError::QueueCount {
                got: queues.len(),
                want,
            });
        }
        self.active = Some(Active { mem, queues, irq });
        // Linux queues its first statistics buffer and kicks before it
        // sets DRIVER_OK, when the kick found no active device: look again
        // (on the event loop thread, where queues are served).
        self.queue_events[STATS]
            .write(1)
            .map_err(ActivateError::Backend)?;
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.stats_head = None;
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active
            .iter()
            .flat_map(|a| a.queues.iter().map(|q| q.state()))
            .collect()
    }
}

impl MutEventSubscriber for BalloonDevice {
    fn init(&mut self, ops: &mut EventOps) {
        let fds = self.queue_events.iter().chain([&self.shared.refresh]);
        for fd in fds {
            if let Err(e) = ops.add(Events::new(fd, EventSet::IN)) {
                tracing::warn!("balloon: cannot watch an eventfd: {e:?}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.shared.refresh.as_raw_fd() {
            self.request_stats();
        } else if let Some(index) = self.queue_events.iter().position(|e| e.as_raw_fd() == fd) {
            self.process_queue(index);
        }
    }
}
