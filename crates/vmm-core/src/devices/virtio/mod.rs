//! virtio devices behind the virtio-mmio transport.
//!
//! A device is shared between two threads: vCPU threads reach it through
//! [`mmio::MmioTransport`] (register accesses, activation on DRIVER_OK), and
//! the device event loop thread calls it as an `event_manager`
//! subscriber when its queue eventfds (ioeventfds written by KVM on a queue
//! notification) or its backend fds become ready. All queue processing runs
//! on the event loop thread, never on a vCPU thread.

pub mod balloon;
pub mod blk;
pub mod fuzz;
pub mod mmio;
mod mmio_state;
pub mod net;
pub mod vsock;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use event_manager::MutEventSubscriber;
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use crate::memory::GuestMemory;

/// Feature bit every modern (virtio 1.x) device offers.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// Device type of a block device.
pub const TYPE_BLOCK: u32 = 2;
/// Device type of a memory balloon.
pub const TYPE_BALLOON: u32 = 5;
/// Device type of a socket (vsock) device.
pub const TYPE_VSOCK: u32 = 19;

/// Interrupt status bit: a used ring was updated.
pub const INT_USED_RING: u32 = 1;
/// Interrupt status bit: the configuration space changed.
pub const INT_CONFIG: u32 = 2;

/// A device's interrupt line and its virtio-mmio InterruptStatus register.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    irq: EventFd,
}

impl Interrupt {
    /// An interrupt raised by writing `irq` (an irqfd KVM routes to a GSI).
    pub fn new(irq: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            irq,
        }
    }

    /// Restores the status register (after a snapshot), raising the line if
    /// anything is pending so the driver looks.
    pub fn restore_status(&self, bits: u32) -> std::io::Result<()> {
        self.status.store(bits, Ordering::Release);
        if bits != 0 {
            self.irq.write(1)?;
        }
        Ok(())
    }

    /// Sets `bits` in the status register and raises the line.
    pub fn trigger(&self, bits: u32) -> std::io::Result<()> {
        self.status.fetch_or(bits, Ordering::AcqRel);
        self.irq.write(1)
    }

    /// The InterruptStatus register.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::Acquire)
    }

    /// InterruptACK: clears `bits`.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::AcqRel);
    }

    /// The eventfd behind the line (tests read it).
    pub fn irq(&self) -> &EventFd {
        &self.irq
    }
}

/// Reads `data.len()` bytes of a configuration space held in `space` from
/// `offset`; bytes beyond it read as 0 (as the transport promises).
pub fn read_config_space(space: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in (0u64..).zip(data) {
        let at = offset.checked_add(i).and_then(|a| usize::try_from(a).ok());
        *byte = at.and_then(|a| space.get(a)).map_or(0, |b| *b);
    }
}

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up a different number of queues than the device has.
    #[error("the driver set up {got} queues, the device needs {want}")]
    QueueCount {
        /// Queues given.
        got: usize,
        /// Queues needed.
        want: usize,
    },
    /// A backend could not be prepared.
    #[error("the device backend could not start")]
    Backend(#[source] std::io::Error),
}

/// A virtio device as the transport and the event loop see it.
pub trait VirtioDevice: MutEventSubscriber + Send {
    /// Device type (`TYPE_BLOCK`, `TYPE_VSOCK`, ...).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// One eventfd per queue, signalled (via KVM ioeventfd) when the driver
    /// notifies that queue. The device registers them with the event loop
    /// in `init` and must drain them when they fire, active or not.
    fn queue_events(&self) -> &[EventFd];
    /// Features offered (must include [`VIRTIO_F_VERSION_1`]).
    fn avail_features(&self) -> u64;
    /// Reads device configuration space at `offset`; out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device configuration space (ignored where read-only).
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: start processing `queues` (validated by the
    /// transport, in index order) in `mem`, raising `interrupt`.
    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
        acked_features: u64,
    ) -> Result<(), ActivateError>;
    /// The driver reset the device: drop queues and per-activation state.
    fn reset(&mut self);
    /// The state of every queue while active (for a snapshot; the device
    /// is quiescent), in index order; empty when inactive.
    fn queue_states(&self) -> Vec<virtio_queue::QueueState>;
    /// Called once after a restored activation, before the guest runs:
    /// whatever the device must tell the driver about the restore.
    fn restored(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_status_and_ack() {
        let int = Interrupt::new(EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap());
        int.trigger(INT_USED_RING).unwrap();
        int.trigger(INT_CONFIG).unwrap();
        assert_eq!(int.status(), INT_USED_RING | INT_CONFIG);
        assert_eq!(int.irq().read().unwrap(), 2);
        int.ack(INT_USED_RING);
        assert_eq!(int.status(), INT_CONFIG);
    }
}
