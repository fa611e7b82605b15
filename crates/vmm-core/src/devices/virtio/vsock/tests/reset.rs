//! A restore's transport reset: host connections wait until the driver
//! has taken it, so none is reset with the stale ones.

use std::time::Instant;

use super::*;
use crate::devices::virtio::vsock::unix_backend::RESET_GATE;

/// An event buffer the driver offers, as Linux keeps eight posted.
fn give_event_buffer(h: &mut VsockHarness) -> u64 {
    let at = h.ev.alloc(8);
    h.ev.add_chain(&h.mem, &[(at, 8, VRING_DESC_F_WRITE as u16)]);
    at
}

#[test]
fn host_connections_wait_until_the_driver_took_the_reset() {
    let mut h = VsockHarness::new("reset-gate");
    let at = give_event_buffer(&mut h);
    h.dev.restored();
    let (_, len) = h.ev.pop_used(&h.mem).expect("the reset event");
    assert_eq!(len, 4);
    let id: u32 = h.mem.read_obj(GuestAddress(at)).unwrap();
    assert_eq!(id, TRANSPORT_RESET);

    let host = h.host_asks(1024);
    assert!(h.recv().is_none(), "held while the reset is not taken");
    // The driver handled the event and gave its buffer back.
    give_event_buffer(&mut h);
    h.dev.handle_event_queue();
    h.service();
    let (req, _) = h.recv().expect("the REQUEST, once the reset is taken");
    assert_eq!((req.op, req.dst_port), (OP_REQUEST, 1024));
    h.accept_host(&host, &req);
}

#[test]
fn a_driver_that_never_takes_the_reset_holds_nothing_past_the_gate() {
    let mut h = VsockHarness::new("reset-gate-late");
    give_event_buffer(&mut h);
    h.dev.restored();
    assert!(h.dev.backend.holding());
    h.dev.backend.handle_timer(Instant::now());
    assert!(h.dev.backend.holding(), "held before the gate ends");
    h.dev.backend.handle_timer(Instant::now() + RESET_GATE);
    assert!(!h.dev.backend.holding());
    let _host = h.host_asks(1024);
    let (req, _) = h.recv().expect("delivered past the gate");
    assert_eq!(req.op, OP_REQUEST);
}

#[test]
fn a_device_reset_ends_the_hold() {
    let mut h = VsockHarness::new("reset-gate-device-reset");
    give_event_buffer(&mut h);
    h.dev.restored();
    h.dev.reset();
    // The reset event went with the old queues: a new driver is not held.
    assert!(!h.dev.backend.holding());
}

#[test]
fn a_restore_with_no_event_buffer_holds_nothing() {
    let mut h = VsockHarness::new("reset-no-buffer");
    h.dev.restored();
    assert!(!h.dev.backend.holding());
    let (host, req) = h.host_connect(1024);
    h.accept_host(&host, &req);
}
