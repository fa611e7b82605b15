//! Tests of the virtio-mmio transport: registers, feature negotiation,
//! queue setup and activation against a test device.

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
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
            .collect(),
        activations: Vec::new(),
        queues: Vec::new(),
        restored: 0,
        resets: 0,
        config: *b"abcdefgh",
    }));
    let mem = create_guest_memory(16).unwrap();
    let interrupt = Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
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

const ALL_OK: u32 = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;

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
