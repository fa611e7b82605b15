//! Device basics and everything a broken or hostile driver can send.

use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_INDIRECT;

use super::*;
use crate::devices::virtio::vsock::unix_backend::MAX_CONNECTIONS;

#[test]
fn config_features_and_queues() {
    let mut h = VsockHarness::new("config");
    let dev = &mut h.dev;
    assert_eq!(dev.device_type(), TYPE_VSOCK);
    assert_eq!(dev.queue_max_sizes(), &[256, 256, 256]);
    assert_eq!(dev.queue_events().len(), 3);
    assert_eq!(dev.avail_features(), VIRTIO_F_VERSION_1);
    assert_eq!(dev.guest_cid(), GUEST_CID);

    let mut b = [0xffu8; 8];
    dev.read_config(0, &mut b);
    assert_eq!(u64::from_le_bytes(b), GUEST_CID);
    let mut b = [0xffu8; 4];
    dev.read_config(4, &mut b);
    assert_eq!(b, [0; 4]);
    let mut b = [0xffu8; 4];
    dev.read_config(6, &mut b);
    assert_eq!(b, [0; 4]);
    let mut b = [0xffu8; 2];
    dev.read_config(u64::MAX, &mut b);
    assert_eq!(b, [0; 2]);
    dev.write_config(0, &[9; 8]);
    let mut b = [0u8; 1];
    dev.read_config(0, &mut b);
    assert_eq!(b[0], GUEST_CID as u8);
}

#[test]
fn activate_needs_three_queues() {
    let path = sock_path("activate");
    let mut dev = VsockDevice::new(GUEST_CID, path).unwrap();
    let mem = create_guest_memory(16).unwrap();
    let irq = Arc::new(Interrupt::new(
        EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
    ));
    let q = |base| DriverQueue::new(&mem, base, QUEUE_SIZE, (0, 0)).1;
    let err = dev
        .activate(mem.clone(), vec![q(0), q(0x10000)], irq, 0)
        .unwrap_err();
    assert!(matches!(err, ActivateError::QueueCount { got: 2, want: 3 }));
}

/// Sends `hdr` (with its own `len`) and checks it had no effect but the
/// tx chain coming back.
fn assert_dropped(h: &mut VsockHarness, hdr: PacketHeader, payload: &[u8]) {
    let before = h.dev.backend.conn_count();
    h.queue_tx(hdr, payload);
    h.dev.handle_tx();
    h.dev.handle_rx();
    assert!(h.tx.pop_used(&h.mem).is_some(), "tx chain returned");
    assert!(h.recv().is_none(), "no reply to {hdr:?}");
    assert_eq!(h.dev.backend.conn_count(), before);
}

#[test]
fn misaddressed_and_unsupported_packets_are_dropped() {
    let mut h = VsockHarness::new("misaddressed");
    let _l = h.host_listener(5000);
    h.give_rx(4, RX_BUF_LEN);
    let mut p = ghdr(OP_REQUEST, 1025, 5000);
    p.dst_cid = 7;
    assert_dropped(&mut h, p, &[]);
    let mut p = ghdr(OP_REQUEST, 1025, 5000);
    p.src_cid = GUEST_CID + 1;
    assert_dropped(&mut h, p, &[]);
    let mut p = ghdr(OP_REQUEST, 1025, 5000);
    p.type_ = 2; // SEQPACKET
    assert_dropped(&mut h, p, &[]);
    assert_dropped(&mut h, ghdr(42, 1025, 5000), &[]);
    assert_dropped(&mut h, ghdr(0, 1025, 5000), &[]);
    // An RST for nothing is not answered either.
    assert_dropped(&mut h, ghdr(OP_RST, 1025, 5000), &[]);
}

#[test]
fn unknown_op_leaves_a_live_connection_alone() {
    let mut h = VsockHarness::new("unknown-op");
    let listener = h.host_listener(5000);
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RESPONSE);
    let (mut host, _) = listener.accept().unwrap();
    assert_dropped(&mut h, ghdr(99, 1025, 5000), &[]);
    h.send(ghdr(OP_RW, 1025, 5000), b"still");
    let mut b = [0u8; 5];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still");
}

#[test]
fn packets_for_unknown_connections_get_rst() {
    let mut h = VsockHarness::new("unknown-conn");
    h.give_rx(8, RX_BUF_LEN);
    for op in [
        OP_RESPONSE,
        OP_RW,
        OP_SHUTDOWN,
        OP_CREDIT_UPDATE,
        OP_CREDIT_REQUEST,
    ] {
        h.send(ghdr(op, 1111, 2222), b"");
        let (rst, _) = h.recv().unwrap();
        assert_eq!(
            (rst.op, rst.src_cid, rst.src_port, rst.dst_cid, rst.dst_port),
            (OP_RST, HOST_CID, 2222, GUEST_CID, 1111)
        );
    }
}

#[test]
fn unsolicited_rsts_are_bounded() {
    let mut h = VsockHarness::new("rst-flood");
    // No rx buffers: every answer has to wait.
    for i in 0..(2 * MAX_CONNECTIONS as u32) {
        h.queue_tx(ghdr(OP_RW, i, 1), &[]);
        if i % 200 == 199 {
            h.dev.handle_tx();
            while h.tx.pop_used(&h.mem).is_some() {}
        }
    }
    h.dev.handle_tx();
    assert!(h.dev.backend.rst_backlog() <= MAX_CONNECTIONS);
    // They drain once buffers arrive.
    h.give_rx(16, RX_BUF_LEN);
    h.dev.handle_rx();
    assert_eq!(h.recv_all().len(), 16);
}

#[test]
fn bad_lengths_are_dropped() {
    let mut h = VsockHarness::new("bad-len");
    let listener = h.host_listener(5000);
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RESPONSE);
    let (mut host, _) = listener.accept().unwrap();
    host.set_nonblocking(true).unwrap();

    // len claims more than the chain holds.
    let mut p = ghdr(OP_RW, 1025, 5000);
    p.len = 100;
    assert_dropped(&mut h, p, b"short");
    // len beyond the sane maximum, even though the chain holds it.
    let big = vec![1u8; MAX_PKT_PAYLOAD + 1];
    p.len = big.len() as u32;
    assert_dropped(&mut h, p, &big);
    p.len = u32::MAX;
    assert_dropped(&mut h, p, &[]);
    // A chain shorter than a header.
    let at = h.tx.alloc(64);
    h.tx.add_chain(&h.mem, &[(at, 20, 0)]);
    h.dev.handle_tx();
    assert!(h.tx.pop_used(&h.mem).is_some());
    let mut got = Vec::new();
    VsockHarness::host_read_available(&mut host, &mut got);
    assert!(got.is_empty(), "nothing reached the host");
    // Payload longer than len: only len bytes count.
    let mut p = ghdr(OP_RW, 1025, 5000);
    p.len = 2;
    h.queue_tx(p, b"okIGNORED");
    h.dev.handle_tx();
    VsockHarness::host_read_available(&mut host, &mut got);
    assert_eq!(got, b"ok");
}

#[test]
fn header_and_payload_may_span_descriptors() {
    let mut h = VsockHarness::new("split-chain");
    let listener = h.host_listener(5000);
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RESPONSE);
    let (mut host, _) = listener.accept().unwrap();
    let mut p = ghdr(OP_RW, 1025, 5000);
    p.len = 6;
    let mut bytes = p.to_bytes().to_vec();
    bytes.extend_from_slice(b"spread");
    let mut descs = Vec::new();
    for piece in [&bytes[..10], &bytes[10..44], &bytes[44..47], &bytes[47..]] {
        let at = h.tx.alloc(64);
        h.mem.write_slice(piece, GuestAddress(at)).unwrap();
        descs.push((at, piece.len() as u32, 0));
    }
    h.tx.add_chain(&h.mem, &descs);
    h.dev.handle_tx();
    let mut b = [0u8; 6];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"spread");
}

#[test]
fn hostile_descriptors_are_survived() {
    let mut h = VsockHarness::new("hostile");
    h.give_rx(4, RX_BUF_LEN);
    // Out of guest memory.
    h.tx.add_chain(&h.mem, &[(0xffff_0000_0000, 64, 0)]);
    // Straddling the end of guest memory.
    h.tx.add_chain(&h.mem, &[((16 << 20) - 8, 64, 0)]);
    // A huge length.
    h.tx.add_chain(&h.mem, &[(0x60_0000, u32::MAX, 0)]);
    // Header in a device-writable descriptor (tx must be readable).
    let at = h.tx.alloc(64);
    h.mem
        .write_slice(&ghdr(OP_RW, 1, 2).to_bytes(), GuestAddress(at))
        .unwrap();
    h.tx.add_chain(&h.mem, &[(at, 44, VRING_DESC_F_WRITE as u16)]);
    // A descriptor loop: 0 -> 1 -> 0 ...
    let base = h.tx.next_desc;
    let a = h.tx.alloc(64);
    h.tx.write_desc(&h.mem, base, a, 16, VRING_DESC_F_NEXT as u16, base + 1);
    h.tx.write_desc(&h.mem, base + 1, a, 16, VRING_DESC_F_NEXT as u16, base);
    h.tx.next_desc = base + 2;
    h.tx.publish(&h.mem, base);
    // An indirect table with a bad length.
    let idx = h.tx.next_desc;
    h.tx.write_desc(&h.mem, idx, 0x60_0000, 17, VRING_DESC_F_INDIRECT as u16, 0);
    h.tx.next_desc = idx + 1;
    h.tx.publish(&h.mem, idx);
    // A head index beyond the queue.
    h.tx.publish(&h.mem, QUEUE_SIZE + 5);

    h.dev.handle_tx();
    let mut returned = 0;
    while h.tx.pop_used(&h.mem).is_some() {
        returned += 1;
    }
    assert!(returned >= 6, "{returned} chains returned");
    assert!(h.recv().is_none());

    // The device still works.
    let _l = h.host_listener(5000);
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RESPONSE);
}

#[test]
fn runaway_avail_index_does_not_hang() {
    let mut h = VsockHarness::new("avail-idx");
    h.tx.set_avail_idx(&h.mem, 1000);
    h.dev.handle_tx();
    h.rx.set_avail_idx(&h.mem, 60000);
    h.send(ghdr(OP_RW, 1, 2), b"");
    assert!(h.rx.pop_used(&h.mem).is_none());
}

#[test]
fn unusable_rx_buffers_are_returned_empty() {
    let mut h = VsockHarness::new("bad-rx");
    // Out of memory, too small, and device-readable only.
    h.rx.add_chain(
        &h.mem,
        &[(0xffff_0000_0000, 4096, VRING_DESC_F_WRITE as u16)],
    );
    let at = h.rx.alloc(64);
    h.rx.add_chain(&h.mem, &[(at, 20, VRING_DESC_F_WRITE as u16)]);
    let at = h.rx.alloc(4096);
    h.rx.add_chain(&h.mem, &[(at, 4096, 0)]);
    h.give_rx(1, RX_BUF_LEN);
    h.send(ghdr(OP_RW, 1111, 2222), b"");
    assert_eq!(h.rx.pop_used(&h.mem).map(|(_, l)| l), Some(0));
    assert_eq!(h.rx.pop_used(&h.mem).map(|(_, l)| l), Some(0));
    assert_eq!(h.rx.pop_used(&h.mem).map(|(_, l)| l), Some(0));
    let (id, len) = h.rx.pop_used(&h.mem).unwrap();
    assert_eq!(len as usize, HDR_SIZE);
    let (a, _) = h.rx.chains[&id][0];
    let mut raw = [0u8; HDR_SIZE];
    h.mem.read_slice(&mut raw, GuestAddress(a)).unwrap();
    assert_eq!(PacketHeader::from_bytes(&raw).op, OP_RST);
}

#[test]
fn header_only_rx_buffers_carry_control_packets() {
    let mut h = VsockHarness::new("tiny-rx");
    let at = h.rx.alloc(64);
    h.rx.add_chain(&h.mem, &[(at, HDR_SIZE as u32, VRING_DESC_F_WRITE as u16)]);
    h.send(ghdr(OP_RW, 1111, 2222), b"");
    assert_eq!(h.recv().unwrap().0.op, OP_RST);
}
