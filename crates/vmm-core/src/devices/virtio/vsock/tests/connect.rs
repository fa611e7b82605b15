//! Connection setup and teardown in both directions.

use std::io::Write;
use std::time::{Duration, Instant};

use super::*;
use crate::devices::virtio::vsock::unix_backend::{CONNECT_TIMEOUT, LOCAL_PORT_BASE};

#[test]
fn host_initiated_connect_gets_ok_with_local_port() {
    let mut h = VsockHarness::new("host-connect");
    let (host, req) = h.host_connect(1234);
    assert_eq!((req.src_cid, req.dst_cid), (HOST_CID, GUEST_CID));
    assert_eq!(req.dst_port, 1234);
    assert_eq!(req.src_port, LOCAL_PORT_BASE);
    assert_eq!((req.type_, req.len), (TYPE_STREAM, 0));
    assert_eq!(req.buf_alloc, CONN_BUF_ALLOC);
    let key = h.accept_host(&host, &req);
    assert!(h.dev.backend.conn(key).is_some());
    // The guest was interrupted for the used rx buffer.
    assert_ne!(h.irq.status() & INT_USED_RING, 0);

    // A second host program gets the next local port.
    let (_host2, req2) = h.host_connect(1234);
    assert_eq!(req2.src_port, LOCAL_PORT_BASE + 1);
}

#[test]
fn guest_rst_refuses_host_connect() {
    let mut h = VsockHarness::new("host-refused");
    let (host, req) = h.host_connect(99);
    h.send(ghdr(OP_RST, req.dst_port, req.src_port), &[]);
    assert!(host_sees_close(&host));
    assert_eq!(h.dev.backend.conn_count(), 0);
    // RST is never answered.
    assert!(h.recv().is_none());
}

#[test]
fn host_connect_times_out_without_answer() {
    let mut h = VsockHarness::new("host-timeout");
    let (host, req) = h.host_connect(7);
    h.dev
        .backend
        .handle_timer(Instant::now() + CONNECT_TIMEOUT / 4);
    assert_eq!(
        h.dev.backend.conn_count(),
        1,
        "not before {CONNECT_TIMEOUT:?}"
    );
    h.dev
        .backend
        .handle_timer(Instant::now() + CONNECT_TIMEOUT + Duration::from_secs(1));
    assert!(host_sees_close(&host));
    assert_eq!(h.dev.backend.conn_count(), 0);
    // The guest is told to forget the request.
    h.dev.handle_rx();
    let (rst, _) = h.recv().unwrap();
    assert_eq!(
        (rst.op, rst.src_port, rst.dst_port),
        (OP_RST, req.src_port, 7)
    );
    // A late answer is refused.
    h.send(ghdr(OP_RESPONSE, 7, req.src_port), &[]);
    assert_eq!(h.recv().unwrap().0.op, OP_RST);
}

#[test]
fn bad_or_missing_connect_line_closes_host() {
    let mut h = VsockHarness::new("bad-line");
    let bad = UnixStream::connect(&h.path).unwrap();
    (&bad).write_all(b"CONNECT nope\n").unwrap();
    let long = UnixStream::connect(&h.path).unwrap();
    (&long).write_all(&[b'9'; 40]).unwrap();
    let silent = UnixStream::connect(&h.path).unwrap();
    h.give_rx(4, RX_BUF_LEN);
    h.service();
    assert!(host_sees_close(&bad));
    assert!(host_sees_close(&long));
    assert_eq!(h.dev.backend.pending_count(), 1);
    h.dev
        .backend
        .handle_timer(Instant::now() + Duration::from_secs(10));
    assert!(host_sees_close(&silent));
    assert_eq!(h.dev.backend.pending_count(), 0);
    assert!(h.recv().is_none(), "the guest heard nothing");
}

#[test]
fn guest_connect_to_listening_socket_gets_response() {
    let mut h = VsockHarness::new("guest-connect");
    let listener = h.host_listener(5000);
    let reply = h.guest_connect(1025, 5000);
    assert_eq!(reply.op, OP_RESPONSE);
    assert_eq!(
        (reply.src_cid, reply.src_port, reply.dst_cid, reply.dst_port),
        (HOST_CID, 5000, GUEST_CID, 1025)
    );
    let (mut host, _) = listener.accept().unwrap();
    // Data flows right away.
    h.send(ghdr(OP_RW, 1025, 5000), b"ping");
    let mut buf = [0u8; 4];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn a_routed_port_reaches_its_own_socket_and_no_other() {
    let routed = sock_path("guest-routed-target");
    let _ = std::fs::remove_file(&routed);
    let target = UnixListener::bind(&routed).unwrap();
    let path = sock_path("guest-routed");
    let dev = VsockDevice::new(GUEST_CID, path.clone())
        .unwrap()
        .with_routes([(50_000, routed.clone())].into());
    let mut h = VsockHarness::with_device(dev, path);
    // A listener where an unrouted port would go is never reached.
    let unrouted = h.host_listener(50_000);
    unrouted.set_nonblocking(true).unwrap();
    assert_eq!(h.guest_connect(1025, 50_000).op, OP_RESPONSE);
    let (mut host, _) = target.accept().unwrap();
    h.send(ghdr(OP_RW, 1025, 50_000), b"svc");
    let mut buf = [0u8; 3];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"svc");
    assert!(unrouted.accept().is_err(), "the unrouted socket was used");
    // Other ports keep the `<uds>_P` rule.
    let other = h.host_listener(5000);
    assert_eq!(h.guest_connect(1026, 5000).op, OP_RESPONSE);
    other.accept().unwrap();
    let _ = std::fs::remove_file(&routed);
}

#[test]
fn guest_connect_to_missing_socket_gets_rst() {
    let mut h = VsockHarness::new("guest-missing");
    let reply = h.guest_connect(1025, 6000);
    assert_eq!(
        (reply.op, reply.src_port, reply.dst_port),
        (OP_RST, 6000, 1025)
    );
    assert_eq!(h.dev.backend.conn_count(), 0);
}

#[test]
fn guest_connect_to_non_listening_socket_gets_rst() {
    let mut h = VsockHarness::new("guest-refused");
    let listener = h.host_listener(6001);
    drop(listener); // the file stays, nobody listens: ECONNREFUSED
    assert_eq!(h.guest_connect(1025, 6001).op, OP_RST);
}

#[test]
fn duplicate_request_resets_the_connection() {
    let mut h = VsockHarness::new("dup-request");
    let listener = h.host_listener(5000);
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RESPONSE);
    let (host, _) = listener.accept().unwrap();
    assert_eq!(h.guest_connect(1025, 5000).op, OP_RST);
    assert!(host_sees_close(&host));
}

#[test]
fn connection_cap_resets_new_requests() {
    let mut h = VsockHarness::new("cap");
    h.dev.backend.set_max_connections(3);
    let listener = h.host_listener(5000);
    for port in 0..3 {
        assert_eq!(h.guest_connect(2000 + port, 5000).op, OP_RESPONSE);
    }
    assert_eq!(h.guest_connect(2003, 5000).op, OP_RST);
    // Host programs beyond the cap are turned away at once.
    let host = UnixStream::connect(&h.path).unwrap();
    h.service();
    assert!(host_sees_close(&host));
    // Closing one makes room again.
    h.send(ghdr(OP_RST, 2000, 5000), &[]);
    assert_eq!(h.guest_connect(2004, 5000).op, OP_RESPONSE);
    drop(listener);
}

#[test]
fn many_concurrent_connections() {
    let mut h = VsockHarness::new("many");
    let listener = h.host_listener(5000);
    const N: u32 = 40;
    let mut guest_side = Vec::new();
    for i in 0..N {
        assert_eq!(h.guest_connect(3000 + i, 5000).op, OP_RESPONSE);
        let (s, _) = listener.accept().unwrap();
        guest_side.push(s);
    }
    let mut host_side = Vec::new();
    for i in 0..N {
        let (s, req) = h.host_connect(4000 + i);
        let key = h.accept_host(&s, &req);
        host_side.push((s, key));
    }
    assert_eq!(h.dev.backend.conn_count(), 2 * N as usize);
    // Each connection carries its own bytes.
    for i in 0..N {
        let msg = format!("guest->{i}");
        h.send(ghdr(OP_RW, 3000 + i, 5000), msg.as_bytes());
        let mut buf = vec![0u8; msg.len()];
        guest_side[i as usize].read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg.as_bytes());
    }
    for (i, (s, _)) in host_side.iter().enumerate() {
        (&*s).write_all(format!("host{i:03}").as_bytes()).unwrap();
    }
    h.give_rx(2 * N as usize, RX_BUF_LEN);
    h.service();
    let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
    for (hdr, payload) in h.recv_all() {
        assert_eq!(hdr.op, OP_RW);
        got.entry(hdr.dst_port).or_default().extend(payload);
    }
    for (i, (_, key)) in host_side.iter().enumerate() {
        assert_eq!(got[&key.peer_port], format!("host{i:03}").as_bytes());
    }
}

#[test]
fn reset_drops_connections_and_keeps_the_listener() {
    let mut h = VsockHarness::new("reset");
    let (host, req) = h.host_connect(1);
    h.accept_host(&host, &req);
    h.dev.reset();
    assert!(host_sees_close(&host));
    assert_eq!(h.dev.backend.conn_count(), 0);
    // Inactive: queue work is ignored; the listener still accepts.
    h.dev.handle_tx();
    let again = UnixStream::connect(&h.path).unwrap();
    h.dev.backend.handle_listener();
    assert_eq!(h.dev.backend.pending_count(), 1);
    drop(again);
}

#[test]
fn constructor_errors_say_what_to_do() {
    let path = sock_path("ctor");
    std::fs::write(&path, b"").unwrap();
    let err = VsockDevice::new(GUEST_CID, path.clone()).unwrap_err();
    assert!(matches!(err, VsockError::PathExists(_)));
    assert!(err.to_string().contains("remove it or pick another"));
    std::fs::remove_file(&path).unwrap();

    for cid in [0, 1, 2, u64::from(u32::MAX), 1 << 40] {
        assert!(matches!(
            VsockDevice::new(cid, path.clone()),
            Err(VsockError::InvalidCid(_))
        ));
    }
    let missing_dir = std::env::temp_dir().join("vsock-no-such-dir/x.sock");
    let err = VsockDevice::new(GUEST_CID, missing_dir).unwrap_err();
    assert!(matches!(err, VsockError::Bind { .. }));
    assert!(std::error::Error::source(&err).is_some());

    // Dropping the device removes its socket, so the path can be reused.
    let dev = VsockDevice::new(GUEST_CID, path.clone()).unwrap();
    assert!(path.exists());
    drop(dev);
    assert!(!path.exists());
}
