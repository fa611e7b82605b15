//! One stream between a guest port and a host Unix socket: flow-control
//! accounting (virtio 1.2 §5.10.6.3), guest data the host socket could not
//! take yet, and the control packets the connection still owes the guest.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use event_manager::EventSet;

use super::packet::{
    PacketHeader, HOST_CID, MAX_PKT_PAYLOAD, OP_CREDIT_UPDATE, OP_REQUEST, OP_RESPONSE, OP_RW,
    OP_SHUTDOWN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// Receive buffer the device advertises per connection: the most guest data
/// it will hold for a host socket that is not reading.
pub const CONN_BUF_ALLOC: u32 = 256 * 1024;
/// How long to wait for buffered guest data to drain after the guest shut
/// down, or for the guest to reset after the host shut down.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Identifies a connection: the host-side port and the guest-side port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Port on the host (CID 2) side.
    pub local_port: u32,
    /// Port on the guest side.
    pub peer_port: u32,
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: REQUEST sent (or queued), waiting for the guest.
    LocalInit,
    /// Data flows.
    Established,
    /// The guest shut down both directions; draining buffered guest data
    /// into the host socket before closing it.
    Closing,
}

/// Why a connection must be reset.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The guest sent more than its credit allows.
    #[error("the guest sent {len} bytes with {credit} bytes of credit left")]
    CreditExceeded {
        /// Payload size.
        len: usize,
        /// Credit the guest had.
        credit: u32,
    },
    /// The guest sent a packet that makes no sense in this state.
    #[error("the guest sent op {op} to a connection in state {state:?}")]
    Protocol {
        /// The packet's op.
        op: u16,
        /// The connection state.
        state: ConnState,
    },
    /// The host socket failed.
    #[error("host socket I/O failed")]
    Io(#[source] io::Error),
    /// The host socket did not take the whole `OK <port>` line.
    #[error("the host socket did not accept the handshake reply")]
    ShortReply,
}

/// What a connection produced for an rx buffer.
#[derive(Debug)]
pub enum RxOutcome {
    /// A packet; its payload (`hdr.len` bytes) is at the start of the scratch buffer.
    Packet(PacketHeader),
    /// Nothing to send right now.
    Idle,
    /// The host socket failed: reset the connection.
    Reset(ConnError),
}

/// Control packets owed to the guest. Flags rather than a queue, so a guest
/// repeating requests cannot make the backlog grow.
#[derive(Debug, Default)]
struct PendingCtrl {
    request: bool,
    response: bool,
    shutdown: bool,
    credit_update: bool,
}

/// One connection.
pub struct Connection {
    key: ConnKey,
    guest_cid: u64,
    stream: UnixStream,
    tag: u32,
    state: ConnState,
    /// Guest data received but not yet written to the host socket.
    tx_buf: VecDeque<u8>,
    /// Bytes received from the guest (wraps, as on the wire).
    rx_cnt: Wrapping<u32>,
    /// Bytes delivered to the host socket.
    fwd_cnt: Wrapping<u32>,
    /// `fwd_cnt` as last told to the guest.
    fwd_cnt_sent: Wrapping<u32>,
    /// Bytes sent to the guest.
    tx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// The host socket may have input (or EOF/error) we have not read.
    host_readable: bool,
    host_eof: bool,
    host_write_shut: bool,
    peer_shut_rcv: bool,
    peer_shut_send: bool,
    pending: PendingCtrl,
    deadline: Option<Instant>,
    /// Interest currently registered with the event loop, if any.
    pub registered: Option<EventSet>,
    /// Whether the connection sits in the backend's rx queue.
    pub in_rx_ready: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the buffered bytes themselves.
        f.debug_struct("Connection")
            .field("key", &self.key)
            .field("state", &self.state)
            .field("buffered", &self.tx_buf.len())
            .field("peer_credit", &self.peer_credit())
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn new(key: ConnKey, guest_cid: u64, stream: UnixStream, tag: u32, state: ConnState) -> Self {
        Self {
            key,
            guest_cid,
            stream,
            tag,
            state,
            tx_buf: VecDeque::new(),
            rx_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            fwd_cnt_sent: Wrapping(0),
            tx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            host_readable: false,
            host_eof: false,
            host_write_shut: false,
            peer_shut_rcv: false,
            peer_shut_send: false,
            pending: PendingCtrl::default(),
            deadline: None,
            registered: None,
            in_rx_ready: false,
        }
    }

    /// A connection a host program asked for: a REQUEST to the guest is
    /// owed, and the guest must answer before `deadline`.
    pub fn host_initiated(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        tag: u32,
        deadline: Instant,
    ) -> Self {
        let mut c = Self::new(key, guest_cid, stream, tag, ConnState::LocalInit);
        c.pending.request = true;
        c.deadline = Some(deadline);
        c
    }

    /// A connection the guest asked for (`req`) and the host accepted: a
    /// RESPONSE is owed.
    pub fn guest_initiated(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        tag: u32,
        req: &PacketHeader,
    ) -> Self {
        let mut c = Self::new(key, guest_cid, stream, tag, ConnState::Established);
        c.update_peer_credit(req);
        c.pending.response = true;
        c
    }

    /// The connection's key.
    pub fn key(&self) -> ConnKey {
        self.key
    }

    /// The event-loop tag of the host socket.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// The host socket.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Gives up the host socket (the connection is being dropped).
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    /// When the connection gives up waiting, if it is waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Guest data held for the host socket.
    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.tx_buf.len()
    }

    /// Bytes the device may still send to the guest.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.tx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Bytes the guest may still send to the device.
    fn guest_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.fwd_cnt_sent).0;
        CONN_BUF_ALLOC.saturating_sub(in_flight)
    }

    /// Every guest packet carries its credit information.
    pub fn update_peer_credit(&mut self, hdr: &PacketHeader) {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
    }

    /// The guest accepted a host-initiated connection: tell the host program.
    pub fn on_response(&mut self) -> Result<(), ConnError> {
        if self.state != ConnState::LocalInit {
            return Err(self.protocol(OP_RESPONSE));
        }
        let line = format!("OK {}\n", self.key.local_port);
        // A fresh socket's send buffer is empty, so a short write means the
        // host program is gone or misbehaving.
        match write_some(&mut self.stream, line.as_bytes()) {
            Ok(n) if n == line.len() => {}
            Ok(_) => return Err(ConnError::ShortReply),
            Err(e) => return Err(ConnError::Io(e)),
        }
        self.state = ConnState::Established;
        self.deadline = None;
        Ok(())
    }

    /// Guest payload for the host socket.
    pub fn on_rw(&mut self, data: &[u8]) -> Result<(), ConnError> {
        if self.state != ConnState::Established || self.peer_shut_send {
            return Err(self.protocol(OP_RW));
        }
        let credit = self.guest_credit();
        if data.len() > credit as usize {
            return Err(ConnError::CreditExceeded {
                len: data.len(),
                credit,
            });
        }
        // `data.len()` is at most the credit, itself a u32.
        self.rx_cnt += Wrapping(data.len() as u32);
        let written = if self.tx_buf.is_empty() {
            write_some(&mut self.stream, data).map_err(ConnError::Io)?
        } else {
            0
        };
        self.tx_buf.extend(&data[written..]);
        self.forwarded(written);
        Ok(())
    }

    /// The guest asked for our credit information.
    pub fn on_credit_request(&mut self) {
        self.pending.credit_update = true;
    }

    /// The guest shut down one or both directions.
    pub fn on_shutdown(&mut self, flags: u32) -> Result<(), ConnError> {
        if self.state == ConnState::LocalInit {
            return Err(self.protocol(OP_SHUTDOWN));
        }
        if flags & SHUTDOWN_RCV != 0 {
            self.peer_shut_rcv = true;
        }
        if flags & SHUTDOWN_SEND != 0 {
            self.peer_shut_send = true;
            self.shut_host_write_if_drained();
        }
        if self.peer_shut_rcv && self.peer_shut_send && self.state != ConnState::Closing {
            self.state = ConnState::Closing;
            self.deadline = Some(Instant::now() + CLOSE_TIMEOUT);
        }
        Ok(())
    }

    /// The event loop reported `set` on the host socket.
    pub fn on_host_event(&mut self, set: EventSet) -> Result<(), ConnError> {
        let trouble = EventSet::HANG_UP | EventSet::ERROR;
        if set.intersects(EventSet::IN | trouble) {
            // Reading reveals data, EOF or the error.
            self.host_readable = true;
        }
        if set.intersects(EventSet::OUT | trouble) {
            self.flush_tx()?;
        }
        Ok(())
    }

    /// Writes buffered guest data to the host socket, as much as it takes.
    pub fn flush_tx(&mut self) -> Result<(), ConnError> {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            let n = write_some(&mut self.stream, front).map_err(ConnError::Io)?;
            if n == 0 {
                break;
            }
            self.tx_buf.drain(..n);
            self.forwarded(n);
        }
        self.shut_host_write_if_drained();
        Ok(())
    }

    /// The guest closed both directions and everything it sent reached the
    /// host socket: close and answer with RST.
    pub fn finished(&self) -> bool {
        self.state == ConnState::Closing && self.tx_buf.is_empty()
    }

    /// Whether [`Connection::next_rx_packet`] could produce something.
    pub fn has_rx_work(&self) -> bool {
        let p = &self.pending;
        p.request || p.response || p.shutdown || p.credit_update || self.can_read_host()
    }

    fn may_read_host(&self) -> bool {
        self.state == ConnState::Established && !self.host_eof && !self.peer_shut_rcv
    }

    fn can_read_host(&self) -> bool {
        self.may_read_host() && self.host_readable && self.peer_credit() > 0
    }

    /// Events to watch on the host socket. Input is watched only while the
    /// guest has credit and we do not already know the socket is readable
    /// (then it waits for rx buffers instead); output only while guest data
    /// is waiting. An empty set means "do not watch at all", so a hung-up
    /// socket cannot spin the loop.
    pub fn desired_interest(&self) -> EventSet {
        let mut set = EventSet::empty();
        if self.may_read_host() && !self.host_readable && self.peer_credit() > 0 {
            set |= EventSet::IN;
        }
        if !self.tx_buf.is_empty() {
            set |= EventSet::OUT;
        }
        set
    }

    /// Produces the next packet for the guest, reading host data into
    /// `scratch` (whose length bounds the payload).
    pub fn next_rx_packet(&mut self, scratch: &mut [u8]) -> RxOutcome {
        if std::mem::take(&mut self.pending.request) {
            return RxOutcome::Packet(self.header(OP_REQUEST, 0, 0));
        }
        if std::mem::take(&mut self.pending.response) {
            return RxOutcome::Packet(self.header(OP_RESPONSE, 0, 0));
        }
        if self.can_read_host() && !scratch.is_empty() {
            let n = scratch
                .len()
                .min(MAX_PKT_PAYLOAD)
                .min(self.peer_credit() as usize);
            match read_some(&mut self.stream, &mut scratch[..n]) {
                Ok(Some(0)) => {
                    self.host_eof = true;
                    self.host_readable = false;
                    self.pending.shutdown = true;
                }
                Ok(Some(k)) => {
                    // k <= n <= MAX_PKT_PAYLOAD.
                    self.tx_cnt += Wrapping(k as u32);
                    return RxOutcome::Packet(self.header(OP_RW, 0, k as u32));
                }
                Ok(None) => self.host_readable = false,
                Err(e) => return RxOutcome::Reset(ConnError::Io(e)),
            }
        }
        if std::mem::take(&mut self.pending.shutdown) {
            // The guest normally resets on seeing this; if not, give up later.
            self.deadline = Some(Instant::now() + CLOSE_TIMEOUT);
            let flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
            return RxOutcome::Packet(self.header(OP_SHUTDOWN, flags, 0));
        }
        if self.pending.credit_update {
            // `header` clears the flag: every packet carries the credit.
            return RxOutcome::Packet(self.header(OP_CREDIT_UPDATE, 0, 0));
        }
        RxOutcome::Idle
    }

    /// A header from this connection's host end; it tells the guest our
    /// current credit, so no separate update is owed afterwards.
    fn header(&mut self, op: u16, flags: u32, len: u32) -> PacketHeader {
        self.fwd_cnt_sent = self.fwd_cnt;
        self.pending.credit_update = false;
        PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.key.local_port,
            dst_port: self.key.peer_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: CONN_BUF_ALLOC,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    fn forwarded(&mut self, n: usize) {
        // n is bounded by the buffer, itself bounded by CONN_BUF_ALLOC.
        self.fwd_cnt += Wrapping(n as u32);
        // Tell the guest once a good part of its credit came back; telling
        // it on every write would double the packet count.
        if (self.fwd_cnt - self.fwd_cnt_sent).0 >= CONN_BUF_ALLOC / 2 {
            self.pending.credit_update = true;
        }
    }

    fn shut_host_write_if_drained(&mut self) {
        if self.peer_shut_send && self.tx_buf.is_empty() && !self.host_write_shut {
            self.host_write_shut = true;
            // The host program sees EOF; failure means it is gone already.
            let _ = self.stream.shutdown(Shutdown::Write);
        }
    }

    fn protocol(&self, op: u16) -> ConnError {
        ConnError::Protocol {
            op,
            state: self.state,
        }
    }
}

/// Writes as much of `data` as a non-blocking socket takes right now.
pub fn write_some(stream: &mut UnixStream, data: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        match stream.write(&data[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// One non-blocking read: `Some(0)` is EOF, `None` means no data yet.
pub fn read_some(stream: &mut UnixStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match stream.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
