//! Unit tests of a single connection's state machine and flow control,
//! over a socket pair.

use std::io::Write;
use std::os::unix::net::UnixStream;

use event_manager::EventSet;

use crate::devices::virtio::vsock::connection::*;
use crate::devices::virtio::vsock::packet::*;

const GUEST: u64 = 3;

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (a, b)
}

fn established(peer_buf_alloc: u32) -> (Connection, UnixStream) {
    let (dev, host) = pair();
    let req = PacketHeader {
        buf_alloc: peer_buf_alloc,
        ..Default::default()
    };
    let key = ConnKey {
        local_port: 5000,
        peer_port: 1025,
    };
    let mut c = Connection::guest_initiated(key, GUEST, dev, 16, &req);
    let mut scratch = [0u8; 64];
    match c.next_rx_packet(&mut scratch) {
        RxOutcome::Packet(h) => assert_eq!(h.op, OP_RESPONSE),
        other => panic!("expected RESPONSE, got {other:?}"),
    }
    (c, host)
}

#[test]
fn headers_address_the_guest_and_carry_credit() {
    let (mut c, _host) = established(4096);
    c.on_credit_request();
    let mut scratch = [0u8; 16];
    let RxOutcome::Packet(h) = c.next_rx_packet(&mut scratch) else {
        panic!("expected a credit update");
    };
    assert_eq!(
        (h.src_cid, h.src_port, h.dst_cid, h.dst_port),
        (HOST_CID, 5000, GUEST, 1025)
    );
    assert_eq!(
        (h.op, h.type_, h.buf_alloc),
        (OP_CREDIT_UPDATE, TYPE_STREAM, CONN_BUF_ALLOC)
    );
    assert!(matches!(c.next_rx_packet(&mut scratch), RxOutcome::Idle));
    assert_ne!(h.op, OP_RST);
}

#[test]
fn reads_no_more_than_the_peer_credit() {
    let (mut c, mut host) = established(10);
    host.write_all(&[7u8; 100]).unwrap();
    c.on_host_event(EventSet::IN).unwrap();
    let mut scratch = [0u8; 64];
    let RxOutcome::Packet(h) = c.next_rx_packet(&mut scratch) else {
        panic!("expected data");
    };
    assert_eq!((h.op, h.len), (OP_RW, 10));
    assert_eq!(c.peer_credit(), 0);
    assert!(!c.has_rx_work());
    // Without credit the socket is not even watched for input.
    assert_eq!(c.desired_interest(), EventSet::empty());
    c.update_peer_credit(&PacketHeader {
        buf_alloc: 10,
        fwd_cnt: 10,
        ..Default::default()
    });
    assert!(c.has_rx_work());
}

#[test]
fn guest_over_credit_is_an_error_and_buffering_is_bounded() {
    let (mut c, _host) = established(0);
    let chunk = vec![1u8; MAX_PKT_PAYLOAD];
    let mut sent = 0usize;
    while sent + chunk.len() <= CONN_BUF_ALLOC as usize {
        c.on_rw(&chunk).unwrap();
        sent += chunk.len();
    }
    assert!(c.buffered() <= CONN_BUF_ALLOC as usize);
    assert!(matches!(
        c.on_rw(&[0u8]),
        Err(ConnError::CreditExceeded { credit: 0, .. })
    ));
}

#[test]
fn host_eof_yields_shutdown_then_nothing() {
    let (mut c, host) = established(4096);
    drop(host);
    c.on_host_event(EventSet::HANG_UP).unwrap();
    let mut scratch = [0u8; 64];
    let RxOutcome::Packet(h) = c.next_rx_packet(&mut scratch) else {
        panic!("expected shutdown");
    };
    assert_eq!((h.op, h.flags), (OP_SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND));
    assert!(c.deadline().is_some());
    assert!(matches!(c.next_rx_packet(&mut scratch), RxOutcome::Idle));
    assert_eq!(c.desired_interest(), EventSet::empty());
}

#[test]
fn shutdown_both_finishes_once_drained() {
    let (mut c, _host) = established(4096);
    c.on_shutdown(SHUTDOWN_RCV).unwrap();
    assert!(!c.finished());
    c.on_shutdown(SHUTDOWN_SEND).unwrap();
    assert!(c.finished());
    assert!(c.on_rw(b"late").is_err());
}

#[test]
fn response_in_wrong_state_is_a_protocol_error() {
    let (mut c, _host) = established(4096);
    assert!(matches!(c.on_response(), Err(ConnError::Protocol { .. })));
}
