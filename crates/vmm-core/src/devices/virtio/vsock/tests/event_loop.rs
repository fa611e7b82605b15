//! The device inside a real `event_manager::EventManager`: registrations,
//! deregistrations, the timer, and no busy looping.

use std::io::Write;
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberId, SubscriberOps};

use super::*;
use crate::devices::virtio::vsock::unix_backend::{CONNECT_TIMEOUT, RESET_GATE};

struct Looped {
    em: EventManager<VsockDevice>,
    id: SubscriberId,
    mem: GuestMemory,
    rx: DriverQueue,
    tx: DriverQueue,
    ev: DriverQueue,
    path: PathBuf,
}

impl Looped {
    fn new(test: &str) -> Self {
        let path = sock_path(test);
        let dev = VsockDevice::new(GUEST_CID, path.clone()).unwrap();
        let mem = create_guest_memory(16).unwrap();
        let (rx, rxq) = DriverQueue::new(&mem, RING_BASE[0], QUEUE_SIZE, RX_BUFS);
        let (tx, txq) = DriverQueue::new(&mem, RING_BASE[1], QUEUE_SIZE, TX_BUFS);
        let (ev, evq) = DriverQueue::new(&mem, RING_BASE[2], QUEUE_SIZE, EVENT_BUFS);
        let irq = Arc::new(Interrupt::new(
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
        ));
        let mut em = EventManager::new().unwrap();
        let id = em.add_subscriber(dev);
        em.subscriber_mut(id)
            .unwrap()
            .activate(mem.clone(), vec![rxq, txq, evq], irq, VIRTIO_F_VERSION_1)
            .unwrap();
        Self {
            em,
            id,
            mem,
            rx,
            tx,
            ev,
            path,
        }
    }

    fn kick(&mut self, q: usize) {
        let dev = self.em.subscriber_mut(self.id).unwrap();
        dev.queue_events()[q].write(1).unwrap();
    }

    fn send(&mut self, mut hdr: PacketHeader, payload: &[u8]) {
        hdr.len = payload.len() as u32;
        queue_packet(&self.mem, &mut self.tx, hdr, payload);
        self.kick(TX_QUEUE);
    }

    fn give_rx(&mut self, n: usize) {
        add_rx_buffers(&self.mem, &mut self.rx, n, RX_BUF_LEN);
        self.kick(RX_QUEUE);
    }

    /// Runs the loop until the guest receives a packet (or 5 s pass).
    fn recv(&mut self) -> (PacketHeader, Vec<u8>) {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(p) = recv_packet(&self.mem, &mut self.rx) {
                return p;
            }
            assert!(Instant::now() < end, "no packet for the guest");
            self.em.run_with_timeout(20).unwrap();
        }
    }

    /// Runs the loop until it has been idle for a while; returns how many
    /// events were dispatched.
    fn settle(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..200 {
            let n = self.em.run_with_timeout(30).unwrap();
            if n == 0 {
                return total;
            }
            total += n;
        }
        panic!("the event loop never went idle ({total} events)");
    }

    fn conn_count(&mut self) -> usize {
        self.em
            .subscriber_mut(self.id)
            .unwrap()
            .backend
            .conn_count()
    }

    /// Host program connects to guest `port`; the guest accepts.
    fn host_connect(&mut self, port: u32) -> (UnixStream, ConnKey) {
        let host = UnixStream::connect(&self.path).unwrap();
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (&host)
            .write_all(format!("CONNECT {port}\n").as_bytes())
            .unwrap();
        let (req, _) = self.recv();
        assert_eq!((req.op, req.dst_port), (OP_REQUEST, port));
        self.send(ghdr(OP_RESPONSE, port, req.src_port), &[]);
        self.settle();
        assert_eq!(read_line(&host), format!("OK {}\n", req.src_port));
        let key = ConnKey {
            local_port: req.src_port,
            peer_port: port,
        };
        (host, key)
    }
}

#[test]
fn event_loop_end_to_end() {
    let mut l = Looped::new("loop-e2e");
    l.give_rx(32);
    let (mut host, key) = l.host_connect(1234);

    host.write_all(b"hello guest").unwrap();
    let (p, payload) = l.recv();
    assert_eq!((p.op, payload.as_slice()), (OP_RW, &b"hello guest"[..]));

    l.send(ghdr(OP_RW, key.peer_port, key.local_port), b"hello host");
    l.settle();
    let mut b = [0u8; 10];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello host");

    drop(host);
    let (p, _) = l.recv();
    assert_eq!(p.op, OP_SHUTDOWN);
    l.send(ghdr(OP_RST, key.peer_port, key.local_port), &[]);
    l.settle();
    assert_eq!(l.conn_count(), 0);
}

#[test]
fn connections_come_and_go_without_stale_registrations() {
    let mut l = Looped::new("loop-churn");
    let _listener = {
        let mut p = l.path.clone().into_os_string();
        p.push("_5000");
        let p = PathBuf::from(p);
        (UnixListener::bind(&p).unwrap(), DropPath(p))
    };
    for round in 0..30u32 {
        l.give_rx(4);
        let (host, key) = l.host_connect(round);
        // Alternate who closes, so both paths free fds for reuse.
        if round % 2 == 0 {
            l.send(ghdr(OP_RST, key.peer_port, key.local_port), &[]);
            l.settle();
            assert!(host_sees_close(&host));
        } else {
            drop(host);
            assert_eq!(l.recv().0.op, OP_SHUTDOWN);
            l.send(ghdr(OP_RST, key.peer_port, key.local_port), &[]);
            l.settle();
        }
        // Guest-initiated ones too.
        l.send(ghdr(OP_REQUEST, 9000 + round, 5000), &[]);
        assert_eq!(l.recv().0.op, OP_RESPONSE);
        l.send(ghdr(OP_RST, 9000 + round, 5000), &[]);
        l.settle();
        assert_eq!(l.conn_count(), 0, "round {round}");
    }
}

#[test]
fn blocked_connections_do_not_spin_the_loop() {
    let mut l = Looped::new("loop-idle");
    l.give_rx(1);
    let (mut host, _key) = l.host_connect(77);
    // The one buffer went to the REQUEST: host data has nowhere to go.
    host.write_all(b"stuck").unwrap();
    l.settle();
    assert_eq!(l.em.run_with_timeout(50).unwrap(), 0, "idle while blocked");
    // A hang-up in that state does not spin either.
    drop(host);
    assert_eq!(l.em.run_with_timeout(50).unwrap(), 0, "idle after hang-up");
    l.give_rx(4);
    let (p, payload) = l.recv();
    assert_eq!((p.op, payload.as_slice()), (OP_RW, &b"stuck"[..]));
    assert_eq!(l.recv().0.op, OP_SHUTDOWN);
}

#[test]
fn returning_credit_rearms_host_input() {
    let mut l = Looped::new("loop-credit");
    l.give_rx(16);
    let (mut host, key) = l.host_connect(55);
    let mut upd = ghdr(OP_CREDIT_UPDATE, key.peer_port, key.local_port);
    upd.buf_alloc = 4;
    l.send(upd, &[]);
    l.settle();
    host.write_all(b"0123456789").unwrap();
    let mut chunks = Vec::new();
    for fwd in [4, 8, 10] {
        let (p, payload) = l.recv();
        assert_eq!(p.op, OP_RW);
        chunks.push(payload);
        // Out of credit: nothing more, and nothing spinning.
        l.settle();
        assert!(recv_packet(&l.mem, &mut l.rx).is_none());
        upd.fwd_cnt = fwd;
        l.send(upd, &[]);
    }
    assert_eq!(chunks, [&b"0123"[..], b"4567", b"89"]);
    // Credit is left and the socket is drained: input is watched again.
    host.write_all(b"x").unwrap();
    assert_eq!(l.recv().1, b"x");
}

#[test]
fn unanswered_host_connect_times_out_via_the_timer() {
    let mut l = Looped::new("loop-timer");
    l.give_rx(4);
    let host = UnixStream::connect(&l.path).unwrap();
    (&host).write_all(b"CONNECT 5\n").unwrap();
    let (req, _) = l.recv();
    assert_eq!(req.op, OP_REQUEST);
    let start = Instant::now();
    while l.conn_count() > 0 {
        assert!(
            start.elapsed() < CONNECT_TIMEOUT + Duration::from_secs(3),
            "no timeout"
        );
        l.em.run_with_timeout(100).unwrap();
    }
    assert!(start.elapsed() >= CONNECT_TIMEOUT - Duration::from_millis(500));
    assert!(host_sees_close(&host));
    assert_eq!(l.recv().0.op, OP_RST);
}

/// Removes a socket file when dropped.
struct DropPath(PathBuf);

impl Drop for DropPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A restored device whose driver has an event buffer posted, and a host
/// program that asked for guest port 1024 meanwhile.
fn restored_with_a_host_waiting(test: &str) -> (Looped, UnixStream) {
    let mut l = Looped::new(test);
    let at = l.ev.alloc(8);
    l.ev.add_chain(&l.mem, &[(at, 8, VRING_DESC_F_WRITE as u16)]);
    l.em.subscriber_mut(l.id).unwrap().restored();
    assert!(l.ev.pop_used(&l.mem).is_some(), "the reset event");
    l.give_rx(8);
    let host = UnixStream::connect(&l.path).unwrap();
    (&host).write_all(b"CONNECT 1024\n").unwrap();
    l.settle();
    assert!(
        recv_packet(&l.mem, &mut l.rx).is_none(),
        "held while the driver has not taken the reset"
    );
    (l, host)
}

#[test]
fn the_driver_taking_the_reset_lets_a_held_connection_through() {
    let (mut l, _host) = restored_with_a_host_waiting("loop-reset-taken");
    let at = l.ev.alloc(8);
    l.ev.add_chain(&l.mem, &[(at, 8, VRING_DESC_F_WRITE as u16)]);
    l.kick(EVENT_QUEUE);
    let began = Instant::now();
    let (req, _) = l.recv();
    assert_eq!((req.op, req.dst_port), (OP_REQUEST, 1024));
    assert!(began.elapsed() < RESET_GATE / 2, "{:?}", began.elapsed());
}

#[test]
fn a_held_connection_goes_through_when_the_gate_ends_unanswered() {
    let (mut l, host) = restored_with_a_host_waiting("loop-reset-unseen");
    // Nothing more from the guest or the host: the timer ends the hold.
    let began = Instant::now();
    let (req, _) = l.recv();
    assert_eq!((req.op, req.dst_port), (OP_REQUEST, 1024));
    assert!(began.elapsed() < CONNECT_TIMEOUT, "{:?}", began.elapsed());
    l.send(ghdr(OP_RESPONSE, 1024, req.src_port), &[]);
    l.settle();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(read_line(&host), format!("OK {}\n", req.src_port));
}
