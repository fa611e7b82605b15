//! The virtio-mmio transport (virtio 1.x, register layout version 2): the
//! device's registers on the MMIO bus, feature negotiation, queue setup and
//! activation on DRIVER_OK. Queue notifications normally bypass this code
//! (KVM ioeventfds signal the device's queue eventfds directly); a
//! QueueNotify write that does reach it is forwarded the same way.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};

use super::{ActivateError, Interrupt, VirtioDevice, INT_CONFIG, VIRTIO_F_VERSION_1};
use crate::devices::bus::{BusDevice, DeviceAction};
use crate::memory::GuestMemory;

/// "virt".
const MAGIC: u32 = u32::from_le_bytes(*b"virt");
const VERSION: u32 = 2;
/// Our PCI-SIG-style vendor ID ("MA" for microagent; any value is allowed).
const VENDOR_ID: u32 = 0x4d41;

/// Register offsets (virtio 1.2, 4.2.2), each named as the spec names it.
#[allow(missing_docs)] // the spec's table is their documentation
pub mod regs {
    pub const MAGIC_VALUE: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

/// Device status bits (virtio 1.2, 2.1), each named as the spec names it.
#[allow(missing_docs)] // the spec's table is their documentation
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// What the driver wrote for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRegs {
    size: u16,
    ready: bool,
    desc: u64,
    driver: u64,
    device: u64,
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

fn set_low(v: &mut u64, low: u32) {
    *v = (*v & !0xffff_ffff) | u64::from(low);
}

fn set_high(v: &mut u64, high: u32) {
    *v = (*v & 0xffff_ffff) | (u64::from(high) << 32);
}

/// One device's virtio-mmio register window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    device_type: u32,
    max_sizes: Vec<u16>,
    avail_features: u64,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    queues: Vec<QueueRegs>,
    status: u32,
    config_generation: u32,
    active: bool,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device_type)
            .field("status", &self.status)
            .field("active", &self.active)
            .finish()
    }
}

fn lock(device: &Mutex<dyn VirtioDevice>) -> std::sync::MutexGuard<'_, dyn VirtioDevice + 'static> {
    device.lock().unwrap_or_else(|p| p.into_inner())
}

impl MmioTransport {
    /// A transport for `device`, whose queues live in `mem` and whose
    /// interrupts go through `interrupt`.
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
    ) -> Self {
        let (device_type, max_sizes, avail_features) = {
            let d = lock(&device);
            (
                d.device_type(),
                d.queue_max_sizes().to_vec(),
                d.avail_features() | VIRTIO_F_VERSION_1,
            )
        };
        let queues = vec![QueueRegs::default(); max_sizes.len()];
        Self {
            device,
            mem,
            interrupt,
            device_type,
            max_sizes,
            avail_features,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            queues,
            status: 0,
            config_generation: 0,
            active: false,
        }
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the device was activated (DRIVER_OK accepted).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The transport's and its device's state; the device must be quiescent
    /// (vCPUs and the event loop stopped).
    pub fn save_state(&self) -> TransportState {
        let active_queues = if self.active {
            lock(&self.device)
                .queue_states()
                .into_iter()
                .map(SavedQueue::from)
                .collect()
        } else {
            Vec::new()
        };
        TransportState {
            device_type: self.device_type,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            queue_sel: self.queue_sel,
            queues: self.queues.clone(),
            status: self.status,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.status(),
            active_queues,
        }
    }

    /// Takes `state` into this fresh transport, activating its device with
    /// the saved queues when it was active.
    pub fn restore_state(&mut self, state: &TransportState) -> Result<(), TransportStateError> {
        if state.device_type != self.device_type || state.queues.len() != self.queues.len() {
            return Err(TransportStateError::Mismatch {
                saved: state.device_type,
                present: self.device_type,
            });
        }
        let mut queues = Vec::with_capacity(state.active_queues.len());
        for (i, saved) in state.active_queues.iter().enumerate() {
            match Queue::try_from(QueueState::from(*saved)) {
                Ok(q) if q.is_valid(&self.mem) => queues.push(q),
                _ => return Err(TransportStateError::Queue(i)),
            }
        }
        self.device_features_sel = state.device_features_sel;
        self.driver_features_sel = state.driver_features_sel;
        self.acked_features = state.acked_features;
        self.queue_sel = state.queue_sel;
        self.queues.clone_from(&state.queues);
        self.status = state.status;
        self.config_generation = state.config_generation;
        self.interrupt
            .restore_status(state.interrupt_status)
            .map_err(TransportStateError::Interrupt)?;
        if !queues.is_empty() {
            let mut device = lock(&self.device);
            device
                .activate(
                    self.mem.clone(),
                    queues,
                    self.interrupt.clone(),
                    self.acked_features,
                )
                .map_err(TransportStateError::Activate)?;
            device.restored();
            self.active = true;
        }
        Ok(())
    }

    fn selected(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let q = self.queues.get(self.queue_sel as usize);
        match offset {
            regs::MAGIC_VALUE => MAGIC,
            regs::VERSION => VERSION,
            regs::DEVICE_ID => self.device_type,
            regs::VENDOR_ID => VENDOR_ID,
            regs::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.avail_features as u32,
                1 => (self.avail_features >> 32) as u32,
                _ => 0,
            },
            regs::QUEUE_NUM_MAX => self
                .max_sizes
                .get(self.queue_sel as usize)
                .map_or(0, |m| u32::from(*m)),
            regs::QUEUE_NUM => q.map_or(0, |q| u32::from(q.size)),
            regs::QUEUE_READY => q.map_or(0, |q| u32::from(q.ready)),
            regs::INTERRUPT_STATUS => self.interrupt.status(),
            regs::STATUS => self.status,
            regs::QUEUE_DESC_LOW => q.map_or(0, |q| q.desc as u32),
            regs::QUEUE_DESC_HIGH => q.map_or(0, |q| (q.desc >> 32) as u32),
            regs::QUEUE_DRIVER_LOW => q.map_or(0, |q| q.driver as u32),
            regs::QUEUE_DRIVER_HIGH => q.map_or(0, |q| (q.driver >> 32) as u32),
            regs::QUEUE_DEVICE_LOW => q.map_or(0, |q| q.device as u32),
            regs::QUEUE_DEVICE_HIGH => q.map_or(0, |q| (q.device >> 32) as u32),
            regs::CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        // Queue and feature registers are frozen once the device runs.
        let setup = !self.active && self.status & status::DRIVER_OK == 0;
        match offset {
            regs::DEVICE_FEATURES_SEL => self.device_features_sel = value,
            regs::DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            regs::DRIVER_FEATURES if setup && self.status & status::FEATURES_OK == 0 => {
                match self.driver_features_sel {
                    0 => set_low(&mut self.acked_features, value),
                    1 => set_high(&mut self.acked_features, value),
                    _ => {}
                }
            }
            regs::QUEUE_SEL => self.queue_sel = value,
            regs::QUEUE_NUM if setup => {
                if let Some(q) = self.selected() {
                    q.size = value as u16;
                }
            }
            regs::QUEUE_READY if setup => {
                if let Some(q) = self.selected() {
                    q.ready = value == 1;
                }
            }
            regs::QUEUE_DESC_LOW if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_low(&mut q.desc, value)),
            regs::QUEUE_DESC_HIGH if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_high(&mut q.desc, value)),
            regs::QUEUE_DRIVER_LOW if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_low(&mut q.driver, value)),
            regs::QUEUE_DRIVER_HIGH if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_high(&mut q.driver, value)),
            regs::QUEUE_DEVICE_LOW if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_low(&mut q.device, value)),
            regs::QUEUE_DEVICE_HIGH if setup => self
                .selected()
                .into_iter()
                .for_each(|q| set_high(&mut q.device, value)),
            regs::QUEUE_NOTIFY => {
                let d = lock(&self.device);
                if let Some(evt) = d.queue_events().get(value as usize) {
                    if let Err(e) = evt.write(1) {
                        tracing::warn!("queue notify: {e}");
                    }
                }
            }
            regs::INTERRUPT_ACK => self.interrupt.ack(value),
            regs::STATUS => self.write_status(value),
            _ => tracing::debug!(offset, value, "ignored virtio-mmio register write"),
        }
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let mut value = value;
        let newly = value & !self.status;
        if newly & status::FEATURES_OK != 0 {
            let unknown = self.acked_features & !self.avail_features;
            if unknown != 0 || self.acked_features & VIRTIO_F_VERSION_1 == 0 {
                tracing::warn!(
                    acked = self.acked_features,
                    "driver acked unsupported features"
                );
                value &= !status::FEATURES_OK;
            }
        }
        self.status = value;
        if newly & status::DRIVER_OK != 0 && value & status::FEATURES_OK != 0 && !self.active {
            self.activate();
        }
    }

    fn activate(&mut self) {
        let mut queues = Vec::with_capacity(self.queues.len());
        for (i, (regs, max)) in self.queues.iter().zip(&self.max_sizes).enumerate() {
            let queue = Queue::new(*max).map(|mut q| {
                q.set_size(regs.size);
                q.set_desc_table_address(Some(regs.desc as u32), Some((regs.desc >> 32) as u32));
                q.set_avail_ring_address(
                    Some(regs.driver as u32),
                    Some((regs.driver >> 32) as u32),
                );
                q.set_used_ring_address(Some(regs.device as u32), Some((regs.device >> 32) as u32));
                q.set_ready(regs.ready);
                q
            });
            match queue {
                // set_size ignores sizes it rejects, so compare to what the driver wrote.
                Ok(q) if regs.ready && q.size() == regs.size && q.is_valid(&self.mem) => {
                    queues.push(q)
                }
                _ => {
                    tracing::warn!(queue = i, "driver set DRIVER_OK with an unusable queue");
                    self.needs_reset();
                    return;
                }
            }
        }
        let result = lock(&self.device).activate(
            self.mem.clone(),
            queues,
            self.interrupt.clone(),
            self.acked_features,
        );
        match result {
            Ok(()) => self.active = true,
            Err(e) => {
                tracing::error!("virtio device {} failed to activate: {e}", self.device_type);
                self.needs_reset();
            }
        }
    }

    fn needs_reset(&mut self) {
        self.status |= status::DEVICE_NEEDS_RESET;
        if let Err(e) = self.interrupt.trigger(INT_CONFIG) {
            tracing::warn!("could not raise the config interrupt: {e}");
        }
    }

    fn reset(&mut self) {
        if self.active {
            lock(&self.device).reset();
        }
        self.active = false;
        self.status = 0;
        self.acked_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.queues.fill(QueueRegs::default());
        let pending = self.interrupt.status();
        self.interrupt.ack(pending);
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= regs::CONFIG {
            lock(&self.device).read_config(offset - regs::CONFIG, data);
        } else if data.len() == 4 && offset.is_multiple_of(4) {
            data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
        } else {
            tracing::debug!(
                offset,
                len = data.len(),
                "unaligned virtio-mmio register read"
            );
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction {
        if offset >= regs::CONFIG {
            lock(&self.device).write_config(offset - regs::CONFIG, data);
            self.config_generation = self.config_generation.wrapping_add(1);
        } else if let (Ok(bytes), true) = (<[u8; 4]>::try_from(data), offset.is_multiple_of(4)) {
            self.write_reg(offset, u32::from_le_bytes(bytes));
        } else {
            tracing::debug!(
                offset,
                len = data.len(),
                "unaligned virtio-mmio register write"
            );
        }
        DeviceAction::None
    }
}

/// The kernel command-line argument that declares a device window.
pub fn cmdline_device(base: u64, size: u64, irq: u32) -> String {
    format!("virtio_mmio.device={}K@{base:#x}:{irq}", size / 1024)
}

#[cfg(test)]
#[path = "mmio_tests.rs"]
mod tests;
