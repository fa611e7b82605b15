//! Data transfer, flow control and shutdown.

use std::io::Write;
use std::time::{Duration, Instant};

use super::*;

/// A guest-initiated connection from guest port 1025 to host port 5000;
/// returns the host program's end (non-blocking).
fn connected(h: &mut VsockHarness, guest_buf_alloc: u32) -> UnixStream {
    let listener = h.host_listener(5000);
    let mut req = ghdr(OP_REQUEST, 1025, 5000);
    req.buf_alloc = guest_buf_alloc;
    h.give_rx(4, RX_BUF_LEN);
    h.send(req, &[]);
    assert_eq!(h.recv().unwrap().0.op, OP_RESPONSE);
    let (host, _) = listener.accept().unwrap();
    host.set_nonblocking(true).unwrap();
    host
}

const KEY: ConnKey = ConnKey {
    local_port: 5000,
    peer_port: 1025,
};

/// Compares big buffers without printing them.
fn assert_same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "length");
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing byte");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn data_flows_both_ways_byte_exact() {
    let mut h = VsockHarness::new("data-both");
    let mut host = connected(&mut h, 1 << 20);

    // Guest -> host: more than one packet and more than the socket holds,
    // so part of it waits in the device and drains as the host reads.
    let out = pattern(600 * 1024, 1);
    let mut got = Vec::new();
    let mut fwd_seen = 0u32;
    for chunk in out.chunks(MAX_PKT_PAYLOAD) {
        h.send(ghdr(OP_RW, 1025, 5000), chunk);
        for _ in 0..50 {
            VsockHarness::host_read_available(&mut host, &mut got);
            h.service();
            for (hdr, _) in h.recv_all() {
                assert_eq!(hdr.op, OP_CREDIT_UPDATE);
                fwd_seen = hdr.fwd_cnt;
            }
            h.give_rx(4usize.saturating_sub(h.rx.outstanding()), RX_BUF_LEN);
            if h.dev.backend.conn(KEY).unwrap().buffered() == 0 {
                break;
            }
        }
    }
    while got.len() < out.len() {
        assert!(VsockHarness::host_read_available(&mut host, &mut got));
        h.service();
    }
    assert_same(got.as_slice(), out.as_slice());
    assert!(fwd_seen > 0, "credit came back while sending");

    // Host -> guest: many rx buffers' worth, and more than the guest's
    // 256 KiB buffer, so it has to return credit as it consumes.
    let back = pattern(700 * 1024, 2);
    let mut received = Vec::new();
    let mut written = 0;
    for _ in 0..10_000 {
        if received.len() >= back.len() {
            break;
        }
        if written < back.len() {
            match host.write(&back[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        h.give_rx(16usize.saturating_sub(h.rx.outstanding()), RX_BUF_LEN);
        h.service();
        let before = received.len();
        for (hdr, payload) in h.recv_all() {
            assert_eq!(hdr.op, OP_RW);
            assert!(hdr.len as usize <= RX_BUF_LEN as usize - HDR_SIZE);
            received.extend(payload);
        }
        if received.len() > before {
            let mut upd = ghdr(OP_CREDIT_UPDATE, 1025, 5000);
            upd.fwd_cnt = received.len() as u32;
            h.send(upd, &[]);
        }
    }
    assert_same(received.as_slice(), back.as_slice());
}

#[test]
fn device_never_sends_more_than_the_guest_credit() {
    let mut h = VsockHarness::new("credit-out");
    let mut host = connected(&mut h, 1000);
    host.write_all(&pattern(5000, 3)).unwrap();
    h.give_rx(16, RX_BUF_LEN);
    h.service();
    h.service();
    let total: usize = h.recv_all().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(total, 1000);
    // Out of credit the socket is not even watched for input.
    let conn = h.dev.backend.conn(KEY).unwrap();
    assert_eq!(conn.peer_credit(), 0);
    assert!(!conn.desired_interest().contains(EventSet::IN));

    // Consuming 600 bytes gives exactly 600 more.
    let mut upd = ghdr(OP_CREDIT_UPDATE, 1025, 5000);
    upd.buf_alloc = 1000;
    upd.fwd_cnt = 600;
    h.send(upd, &[]);
    h.service();
    let more: usize = h.recv_all().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(more, 600);
    // A bigger buffer lets the rest through.
    upd.buf_alloc = 1 << 20;
    h.send(upd, &[]);
    h.service();
    let rest: usize = h.recv_all().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(rest, 5000 - 1600);
}

#[test]
fn host_data_waits_for_rx_buffers() {
    let mut h = VsockHarness::new("no-rx");
    let mut host = connected(&mut h, 1 << 20);
    assert_eq!(h.rx.outstanding(), 3);
    // Use up the remaining buffers with small data packets.
    for i in 0..3u8 {
        host.write_all(&[i]).unwrap();
        h.service();
    }
    assert_eq!(h.recv_all().len(), 3);
    host.write_all(b"waiting").unwrap();
    h.service();
    assert!(h.recv().is_none());
    // Known readable but no buffer: not polled, waiting in the rx queue.
    let conn = h.dev.backend.conn(KEY).unwrap();
    assert!(conn.in_rx_ready);
    assert!(!conn.desired_interest().contains(EventSet::IN));
    // The guest adds buffers (its rx kick is what calls handle_rx).
    h.give_rx(1, RX_BUF_LEN);
    h.dev.handle_rx();
    let (hdr, payload) = h.recv().unwrap();
    assert_eq!((hdr.op, payload.as_slice()), (OP_RW, &b"waiting"[..]));
}

#[test]
fn guest_exceeding_credit_is_reset() {
    let mut h = VsockHarness::new("credit-in");
    let host = connected(&mut h, 1 << 20);
    // Use up the rx buffers, so no credit update can reach the guest: its
    // credit stays exactly CONN_BUF_ALLOC.
    let left = h.rx.outstanding();
    for _ in 0..left {
        h.send(ghdr(OP_CREDIT_REQUEST, 1025, 5000), &[]);
    }
    assert_eq!(h.recv_all().len(), left);
    assert_eq!(h.rx.outstanding(), 0);
    let chunk = vec![7u8; MAX_PKT_PAYLOAD];
    for _ in 0..(CONN_BUF_ALLOC as usize / MAX_PKT_PAYLOAD) {
        h.send(ghdr(OP_RW, 1025, 5000), &chunk);
    }
    assert!(h.dev.backend.conn(KEY).is_some(), "within credit");
    assert!(h.dev.backend.conn(KEY).unwrap().buffered() <= CONN_BUF_ALLOC as usize);
    h.send(ghdr(OP_RW, 1025, 5000), b"x");
    assert!(h.dev.backend.conn(KEY).is_none(), "over credit: reset");
    h.give_rx(1, RX_BUF_LEN);
    h.dev.handle_rx();
    assert_eq!(h.recv().unwrap().0.op, OP_RST);
    assert!(host_sees_close(&host));
}

#[test]
fn credit_update_after_host_consumes() {
    let mut h = VsockHarness::new("credit-update");
    let mut host = connected(&mut h, 1 << 20);
    // The guest keeps to its credit; moving four times the device's buffer
    // only completes if credit updates follow the host reading.
    let data = pattern(4 * CONN_BUF_ALLOC as usize, 4);
    let (mut sent, mut fwd_seen, mut updates) = (0usize, 0u32, 0);
    let mut got = Vec::new();
    for _ in 0..10_000 {
        let credit = CONN_BUF_ALLOC - (sent as u32 - fwd_seen);
        let n = (credit as usize)
            .min(MAX_PKT_PAYLOAD)
            .min(data.len() - sent);
        if n > 0 {
            h.send(ghdr(OP_RW, 1025, 5000), &data[sent..sent + n]);
            sent += n;
        }
        VsockHarness::host_read_available(&mut host, &mut got);
        h.give_rx(4usize.saturating_sub(h.rx.outstanding()), RX_BUF_LEN);
        h.service();
        for (p, _) in h.recv_all() {
            assert_eq!(p.op, OP_CREDIT_UPDATE);
            assert!(p.fwd_cnt > fwd_seen, "fwd_cnt only grows");
            assert!(p.fwd_cnt - fwd_seen >= CONN_BUF_ALLOC / 2, "no chatter");
            fwd_seen = p.fwd_cnt;
            updates += 1;
        }
        if got.len() == data.len() {
            break;
        }
    }
    assert_same(got.as_slice(), data.as_slice());
    assert!(updates >= 4, "{updates} updates");
}

#[test]
fn credit_request_is_answered() {
    let mut h = VsockHarness::new("credit-request");
    let _host = connected(&mut h, 1 << 20);
    h.send(ghdr(OP_RW, 1025, 5000), b"abc");
    h.send(ghdr(OP_CREDIT_REQUEST, 1025, 5000), &[]);
    let (p, _) = h.recv().unwrap();
    assert_eq!(
        (p.op, p.buf_alloc, p.fwd_cnt),
        (OP_CREDIT_UPDATE, CONN_BUF_ALLOC, 3)
    );
    // Repeated requests while no buffer is free still owe just one answer.
    while h.rx.outstanding() > 0 {
        h.send(ghdr(OP_CREDIT_REQUEST, 1025, 5000), &[]);
        h.recv();
    }
    for _ in 0..100 {
        h.send(ghdr(OP_CREDIT_REQUEST, 1025, 5000), &[]);
    }
    h.give_rx(8, RX_BUF_LEN);
    h.dev.handle_rx();
    assert_eq!(h.recv_all().len(), 1);
}

#[test]
fn host_eof_sends_shutdown() {
    let mut h = VsockHarness::new("host-eof");
    let mut host = connected(&mut h, 1 << 20);
    host.write_all(b"last words").unwrap();
    host.shutdown(std::net::Shutdown::Write).unwrap();
    h.service();
    h.service();
    let pkts = h.recv_all();
    assert_eq!(pkts[0].0.op, OP_RW);
    assert_eq!(pkts[0].1, b"last words");
    let (sd, _) = &pkts[1];
    assert_eq!(
        (sd.op, sd.flags),
        (OP_SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND)
    );
    // The guest resets in reply; the connection is gone.
    h.send(ghdr(OP_RST, 1025, 5000), &[]);
    assert!(h.dev.backend.conn(KEY).is_none());
    assert!(h.recv().is_none());
}

#[test]
fn host_close_without_guest_reply_is_cleaned_up() {
    let mut h = VsockHarness::new("eof-timeout");
    let host = connected(&mut h, 1 << 20);
    drop(host);
    h.service();
    assert_eq!(h.recv().unwrap().0.op, OP_SHUTDOWN);
    h.dev
        .backend
        .handle_timer(Instant::now() + Duration::from_secs(10));
    assert!(h.dev.backend.conn(KEY).is_none());
    h.dev.handle_rx();
    assert_eq!(h.recv().unwrap().0.op, OP_RST);
}

#[test]
fn guest_rst_closes_the_host_socket() {
    let mut h = VsockHarness::new("guest-rst");
    let host = connected(&mut h, 1 << 20);
    h.send(ghdr(OP_RST, 1025, 5000), &[]);
    assert!(host_sees_close(&host));
    assert!(h.dev.backend.conn(KEY).is_none());
    assert!(h.recv().is_none(), "RST is not answered");
}

#[test]
fn guest_shutdown_flushes_then_closes_and_answers_rst() {
    let mut h = VsockHarness::new("guest-shutdown");
    let mut host = connected(&mut h, 1 << 20);
    // Leave data buffered in the device: more than the socket takes.
    let data = pattern(CONN_BUF_ALLOC as usize, 5);
    for chunk in data.chunks(MAX_PKT_PAYLOAD) {
        h.send(ghdr(OP_RW, 1025, 5000), chunk);
    }
    h.recv_all();
    let mut sd = ghdr(OP_SHUTDOWN, 1025, 5000);
    sd.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    h.send(sd, &[]);
    let buffered = h.dev.backend.conn(KEY).map_or(0, |c| c.buffered());
    if buffered > 0 {
        assert!(h.recv().is_none(), "no RST before the data is out");
    }
    let mut got = Vec::new();
    let mut open = true;
    for _ in 0..100 {
        open = VsockHarness::host_read_available(&mut host, &mut got);
        h.service();
        if !open {
            break;
        }
    }
    assert!(!open, "host sees EOF after the data");
    assert_same(got.as_slice(), data.as_slice());
    let pkts = h.recv_all();
    assert_eq!(pkts.last().unwrap().0.op, OP_RST);
    assert!(h.dev.backend.conn(KEY).is_none());
}

#[test]
fn guest_shutdown_send_only_half_closes() {
    let mut h = VsockHarness::new("half-close");
    let mut host = connected(&mut h, 1 << 20);
    h.send(ghdr(OP_RW, 1025, 5000), b"req");
    let mut sd = ghdr(OP_SHUTDOWN, 1025, 5000);
    sd.flags = SHUTDOWN_SEND;
    h.send(sd, &[]);
    let mut got = Vec::new();
    assert!(
        !VsockHarness::host_read_available(&mut host, &mut got),
        "EOF"
    );
    assert_eq!(got, b"req");
    // The other direction still works.
    host.write_all(b"reply").unwrap();
    h.service();
    let (p, payload) = h.recv().unwrap();
    assert_eq!((p.op, payload.as_slice()), (OP_RW, &b"reply"[..]));
}
