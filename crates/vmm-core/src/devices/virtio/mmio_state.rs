//! The virtio-mmio transport's state as the driver set it and a snapshot
//! holds it: the queue registers, the running queues' positions, and why a
//! saved state does not fit.

use serde::{Deserialize, Serialize};
use virtio_queue::QueueState;

use super::ActivateError;

/// What the driver wrote for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRegs {
    pub(super) size: u16,
    pub(super) ready: bool,
    pub(super) desc: u64,
    pub(super) driver: u64,
    pub(super) device: u64,
}

/// A running queue's position (virtio-queue's `QueueState`, which has no
/// serde form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the same fields as QueueState
pub struct SavedQueue {
    pub max_size: u16,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
}

impl From<QueueState> for SavedQueue {
    fn from(q: QueueState) -> Self {
        Self {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

impl From<SavedQueue> for QueueState {
    fn from(q: SavedQueue) -> Self {
        QueueState {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

/// A transport and its device's queues, as a snapshot holds them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device type (checked on restore).
    pub device_type: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// The queue registers.
    pub queues: Vec<QueueRegs>,
    /// The status register.
    pub status: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// The running queues (empty when the device is not active).
    pub active_queues: Vec<SavedQueue>,
}

/// Why a transport could not take a saved state.
#[derive(Debug, thiserror::Error)]
pub enum TransportStateError {
    /// The snapshot's device is of another type or shape.
    #[error("the snapshot's virtio device (type {saved}) does not match this machine's (type {present})")]
    Mismatch {
        /// The saved device type.
        saved: u32,
        /// This machine's device type.
        present: u32,
    },
    /// A saved queue is not valid in guest memory.
    #[error("saved queue {0} is not valid")]
    Queue(usize),
    /// The device would not start with the saved queues.
    #[error("the device did not accept its saved queues")]
    Activate(#[source] ActivateError),
    /// The interrupt line could not be raised.
    #[error("could not raise the device's interrupt")]
    Interrupt(#[source] std::io::Error),
}
