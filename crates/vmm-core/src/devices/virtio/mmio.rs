//! The virtio-mmio transport (virtio 1.x, register layout version 2): the
//! device's registers on the MMIO bus, feature negotiation, queue setup and
//! activation on DRIVER_OK. Queue notifications normally bypass this code
//! (KVM ioeventfds signal the device's queue eventfds directly); a
//! QueueNotify write that does reach it is forwarded the same way.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueState, QueueT};

pub use super::mmio_state::{QueueRegs, SavedQueue, TransportState, TransportStateError};
use super::{Interrupt, VirtioDevice, INT_CONFIG, VIRTIO_F_VERSION_1};
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

    /// The device's configuration changed under a driver (a disk filled
    /// at restore): a new generation, and the config interrupt once the
    /// driver is up to take it.
    pub fn config_changed(&mut self) -> std::io::Result<()> {
        self.config_generation = self.config_generation.wrapping_add(1);
        if self.status & status::DRIVER_OK != 0 {
            self.interrupt.trigger(INT_CONFIG)?;
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
mod tests {
    // Tests of the virtio-mmio transport: registers, feature negotiation,
    // queue setup and activation against a test device.

    use super::*;
    use crate::devices::virtio::ActivateError;
    use crate::memory::create_guest_memory;
    use event_manager::{EventOps, Events, MutEventSubscriber};
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::EventFd;

    struct FakeDevice {
        events: Vec<EventFd>,
        activations: Vec<(usize, u64)>,
        queues: Vec<Queue>,
        restored: usize,
        resets: usize,
        config: [u8; 8],
    }

    impl MutEventSubscriber for FakeDevice {
        fn process(&mut self, _: Events, _: &mut EventOps) {}
        fn init(&mut self, _: &mut EventOps) {}
    }

    impl VirtioDevice for FakeDevice {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 16]
        }
        fn queue_events(&self) -> &[EventFd] {
            &self.events
        }
        fn avail_features(&self) -> u64 {
            VIRTIO_F_VERSION_1 | 1 << 3
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            for (i, b) in data.iter_mut().enumerate() {
                *b = self.config.get(offset as usize + i).copied().unwrap_or(0);
            }
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) {
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = self.config.get_mut(offset as usize + i) {
                    *slot = *b;
                }
            }
        }
        fn activate(
            &mut self,
            _: GuestMemory,
            queues: Vec<Queue>,
            _: Arc<Interrupt>,
            features: u64,
        ) -> Result<(), ActivateError> {
            self.activations.push((queues.len(), features));
            self.queues = queues;
            Ok(())
        }
        fn reset(&mut self) {
            self.resets += 1;
        }
        fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
            self.queues.iter().map(Queue::state).collect()
        }
        fn restored(&mut self) {
            self.restored += 1;
        }
    }

    fn setup() -> (MmioTransport, Arc<Mutex<FakeDevice>>) {
        let device = Arc::new(Mutex::new(FakeDevice {
            events: (0..2)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap())
                .collect(),
            activations: Vec::new(),
            queues: Vec::new(),
            restored: 0,
            resets: 0,
            config: *b"abcdefgh",
        }));
        let mem = create_guest_memory(16).unwrap();
        let interrupt = Arc::new(Interrupt::new(
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
        ));
        (MmioTransport::new(device.clone(), mem, interrupt), device)
    }

    fn read(t: &mut MmioTransport, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn write(t: &mut MmioTransport, offset: u64, v: u32) {
        t.write(offset, &v.to_le_bytes());
    }

    /// Drives the driver side of initialization (virtio 1.2, 3.1.1) with queue
    /// `i` at 0x10000 + i * 0x1000.
    fn negotiate(t: &mut MmioTransport, features: u64) {
        write(t, regs::STATUS, status::ACKNOWLEDGE);
        write(t, regs::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        write(t, regs::DRIVER_FEATURES_SEL, 0);
        write(t, regs::DRIVER_FEATURES, features as u32);
        write(t, regs::DRIVER_FEATURES_SEL, 1);
        write(t, regs::DRIVER_FEATURES, (features >> 32) as u32);
        write(
            t,
            regs::STATUS,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
    }

    fn setup_queues(t: &mut MmioTransport) {
        for i in 0..2u32 {
            let base = 0x10000 + u64::from(i) * 0x1000;
            write(t, regs::QUEUE_SEL, i);
            write(t, regs::QUEUE_NUM, 16);
            write(t, regs::QUEUE_DESC_LOW, base as u32);
            write(t, regs::QUEUE_DRIVER_LOW, (base + 0x100) as u32);
            write(t, regs::QUEUE_DEVICE_LOW, (base + 0x200) as u32);
            write(t, regs::QUEUE_READY, 1);
        }
    }

    const ALL_OK: u32 =
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;

    #[test]
    fn identifies_itself() {
        let (mut t, _) = setup();
        assert_eq!(read(&mut t, regs::MAGIC_VALUE), 0x7472_6976);
        assert_eq!(read(&mut t, regs::VERSION), 2);
        assert_eq!(read(&mut t, regs::DEVICE_ID), 42);
        write(&mut t, regs::DEVICE_FEATURES_SEL, 1);
        assert_eq!(
            read(&mut t, regs::DEVICE_FEATURES),
            1,
            "VERSION_1 is bit 32"
        );
        write(&mut t, regs::DEVICE_FEATURES_SEL, 0);
        assert_eq!(read(&mut t, regs::DEVICE_FEATURES), 1 << 3);
        write(&mut t, regs::QUEUE_SEL, 1);
        assert_eq!(read(&mut t, regs::QUEUE_NUM_MAX), 16);
        write(&mut t, regs::QUEUE_SEL, 2);
        assert_eq!(read(&mut t, regs::QUEUE_NUM_MAX), 0, "no third queue");
    }

    #[test]
    fn full_negotiation_activates_with_the_acked_features() {
        let (mut t, dev) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1 | 1 << 3);
        assert_ne!(read(&mut t, regs::STATUS) & status::FEATURES_OK, 0);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        assert!(t.is_active());
        assert_eq!(
            dev.lock().unwrap().activations,
            vec![(2, VIRTIO_F_VERSION_1 | 1 << 3)]
        );
        // Queue registers are frozen once running.
        write(&mut t, regs::QUEUE_SEL, 0);
        write(&mut t, regs::QUEUE_NUM, 4);
        assert_eq!(read(&mut t, regs::QUEUE_NUM), 16);
        assert_eq!(read(&mut t, regs::QUEUE_DESC_LOW), 0x10000);
    }

    #[test]
    fn unsupported_features_are_refused() {
        let (mut t, dev) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1 | 1 << 5);
        assert_eq!(read(&mut t, regs::STATUS) & status::FEATURES_OK, 0);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        assert!(!t.is_active());
        assert!(dev.lock().unwrap().activations.is_empty());
        // A legacy driver (no VERSION_1) is refused too.
        let (mut t, _) = setup();
        negotiate(&mut t, 1 << 3);
        assert_eq!(read(&mut t, regs::STATUS) & status::FEATURES_OK, 0);
    }

    #[test]
    fn unusable_queue_needs_reset_instead_of_activating() {
        let (mut t, dev) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queues(&mut t);
        // Queue 1's rings beyond guest memory.
        write(&mut t, regs::QUEUE_SEL, 1);
        write(&mut t, regs::QUEUE_READY, 0);
        write(&mut t, regs::QUEUE_DESC_HIGH, 0x10);
        write(&mut t, regs::QUEUE_READY, 1);
        write(&mut t, regs::STATUS, ALL_OK);
        assert!(!t.is_active());
        assert_ne!(read(&mut t, regs::STATUS) & status::DEVICE_NEEDS_RESET, 0);
        assert_eq!(read(&mut t, regs::INTERRUPT_STATUS), INT_CONFIG);
        assert!(dev.lock().unwrap().activations.is_empty());
    }

    #[test]
    fn queue_size_larger_than_max_is_unusable() {
        let (mut t, _) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queues(&mut t);
        write(&mut t, regs::QUEUE_SEL, 0);
        write(&mut t, regs::QUEUE_NUM, 1024);
        write(&mut t, regs::STATUS, ALL_OK);
        assert!(!t.is_active());
    }

    #[test]
    fn notify_reset_and_config() {
        let (mut t, dev) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        write(&mut t, regs::QUEUE_NOTIFY, 1);
        assert_eq!(dev.lock().unwrap().events[1].read().unwrap(), 1);
        write(&mut t, regs::QUEUE_NOTIFY, 7); // no such queue: ignored
        let mut cfg = [0u8; 2];
        t.read(regs::CONFIG + 2, &mut cfg);
        assert_eq!(&cfg, b"cd");
        t.write(regs::CONFIG, b"XY");
        t.read(regs::CONFIG, &mut cfg);
        assert_eq!(&cfg, b"XY");
        assert_eq!(read(&mut t, regs::CONFIG_GENERATION), 1);
        write(&mut t, regs::STATUS, 0);
        assert!(!t.is_active());
        assert_eq!(dev.lock().unwrap().resets, 1);
        assert_eq!(read(&mut t, regs::STATUS), 0);
        assert_eq!(read(&mut t, regs::QUEUE_READY), 0);
        // And it can be brought up again.
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        assert!(t.is_active());
        assert_eq!(dev.lock().unwrap().activations.len(), 2);
    }

    #[test]
    fn odd_accesses_are_harmless() {
        let (mut t, _) = setup();
        let mut b = [0xffu8; 2];
        t.read(regs::STATUS, &mut b);
        assert_eq!(b, [0, 0]);
        assert_eq!(t.write(regs::STATUS + 1, &[1, 2, 3, 4]), DeviceAction::None);
        assert_eq!(read(&mut t, regs::STATUS), 0);
        assert_eq!(read(&mut t, 0xf00), 0);
        let _ = GuestAddress(0);
    }

    #[test]
    fn cmdline_declaration() {
        assert_eq!(
            cmdline_device(0xd000_0000, 0x1000, 5),
            "virtio_mmio.device=4K@0xd0000000:5"
        );
    }

    #[test]
    fn state_round_trips_into_a_fresh_transport() {
        let (mut t, dev) = setup();
        negotiate(&mut t, VIRTIO_F_VERSION_1 | 1 << 3);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        dev.lock().unwrap().queues[1].set_next_avail(5);
        t.interrupt.trigger(INT_CONFIG).unwrap();
        let saved = t.save_state();
        assert_eq!(saved.active_queues.len(), 2);
        assert_eq!(saved.active_queues[1].next_avail, 5);

        let (mut fresh, fresh_dev) = setup();
        fresh.restore_state(&saved).unwrap();
        assert!(fresh.is_active());
        assert_eq!(fresh.save_state(), saved);
        let d = fresh_dev.lock().unwrap();
        assert_eq!(d.activations, vec![(2, VIRTIO_F_VERSION_1 | 1 << 3)]);
        assert_eq!(d.restored, 1);
        drop(d);
        assert_eq!(read(&mut fresh, regs::INTERRUPT_STATUS), INT_CONFIG);
        assert_eq!(read(&mut fresh, regs::STATUS), ALL_OK);

        // Another device type, or a queue outside guest memory, is refused.
        let mut other = saved.clone();
        other.device_type = 2;
        assert!(matches!(
            setup().0.restore_state(&other),
            Err(TransportStateError::Mismatch {
                saved: 2,
                present: 42
            })
        ));
        let mut bad = saved;
        bad.active_queues[0].desc_table = 1 << 40;
        assert!(matches!(
            setup().0.restore_state(&bad),
            Err(TransportStateError::Queue(0))
        ));
    }

    #[test]
    fn a_config_change_reaches_only_a_driver_that_is_up() {
        let (mut t, _) = setup();
        t.config_changed().unwrap();
        assert_eq!(read(&mut t, regs::INTERRUPT_STATUS), 0, "no driver yet");
        assert_eq!(read(&mut t, regs::CONFIG_GENERATION), 1);
        negotiate(&mut t, VIRTIO_F_VERSION_1);
        setup_queues(&mut t);
        write(&mut t, regs::STATUS, ALL_OK);
        t.config_changed().unwrap();
        assert_eq!(read(&mut t, regs::INTERRUPT_STATUS), INT_CONFIG);
        assert_eq!(read(&mut t, regs::CONFIG_GENERATION), 2);
    }
}
