//! The hybrid Unix-socket backend (Firecracker's scheme): host programs
//! reach guest ports through one listening socket plus a `CONNECT <port>`
//! line; guest connections to host port P go to the socket `<path>_P`.
//!
//! The backend owns every host socket and routes packets between them and
//! the guest. It never touches the event loop itself: it records what each
//! socket should be watched for, and [`UnixBackend::sync_interest`] (called
//! by the device at the end of each event) applies that.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use event_manager::{EventOps, EventSet, Events};
use vmm_sys_util::timerfd::TimerFd;

use super::connection::{ConnKey, Connection, RxOutcome};
use super::handshake::{connect_nonblocking, LineStatus, PendingHost};
use super::packet::{
    PacketHeader, HOST_CID, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_REQUEST, OP_RESPONSE, OP_RST,
    OP_RW, OP_SHUTDOWN, TYPE_STREAM,
};

/// Most connections at once; requests beyond that are reset.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most host programs still sending their `CONNECT` line.
pub const MAX_PENDING_HOSTS: usize = 64;
/// How long a host program has to send its `CONNECT` line.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a restored device holds packets for the guest while the
/// driver has not taken the transport reset (it gives an event buffer
/// back when it has): past it they flow anyway, well inside the
/// [`CONNECT_TIMEOUT`] of a host connection made meanwhile.
pub const RESET_GATE: Duration = Duration::from_secs(2);
/// How long the guest has to answer a host-initiated REQUEST. Generous:
/// where guest kernel mode is emulated, a busy host can stall a guest's
/// answer past Firecracker's 2 s (seen as a failed `microagent cp` in CI).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// First local port handed to host-initiated connections.
pub const LOCAL_PORT_BASE: u32 = 1 << 30;
/// Event-loop tag of the listener.
pub const TAG_LISTENER: u32 = 4;
/// Event-loop tag of the timer.
pub const TAG_TIMER: u32 = 5;
/// First event-loop tag given to host connections.
pub const FIRST_HOST_TAG: u32 = 16;
/// Accepts per listener event; the listener stays readable if more wait.
const ACCEPT_BUDGET: usize = 32;
/// After an accept error (say, out of fds) the listener rests this long
/// instead of spinning the loop.
const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// All host-side state of the device.
pub struct UnixBackend {
    guest_cid: u64,
    uds_path: PathBuf,
    /// Host ports whose guest connections go to a socket of their own.
    routes: BTreeMap<u32, PathBuf>,
    listener: UnixListener,
    /// Host programs accepted so far, and connections open (read by
    /// [`super::HostArrivals`]).
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    listener_registered: bool,
    listener_paused_until: Option<Instant>,
    timer: TimerFd,
    timer_armed_for: Option<Instant>,
    pending: HashMap<u32, PendingHost>,
    conns: HashMap<ConnKey, Connection>,
    by_tag: HashMap<u32, ConnKey>,
    /// Connections with something for the guest, served round-robin.
    rx_ready: VecDeque<ConnKey>,
    /// RSTs owed to the guest for connections that are gone or never were.
    rst_queue: VecDeque<PacketHeader>,
    /// Closed host sockets still registered with the event loop; they stay
    /// open until deregistered so the fd number cannot be reused meanwhile.
    graveyard: Vec<(UnixStream, u32)>,
    next_local_port: u32,
    next_tag: u32,
    max_connections: usize,
    /// Set by a restore's transport reset until the driver has taken it
    /// (or [`RESET_GATE`] passed): nothing goes to the guest meanwhile, as
    /// a host connection delivered before the reset would be reset with
    /// the stale ones (its program would see the agent close and try
    /// again, which costs the guest's emulated kernel a round trip).
    held_until: Option<Instant>,
}

impl std::fmt::Debug for UnixBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A summary: connection buffers can hold megabytes.
        f.debug_struct("UnixBackend")
            .field("uds_path", &self.uds_path)
            .field("connections", &self.conns.len())
            .field("pending_hosts", &self.pending.len())
            .field("rx_ready", &self.rx_ready.len())
            .field("rst_queue", &self.rst_queue.len())
            .finish_non_exhaustive()
    }
}

impl UnixBackend {
    /// A backend around an already bound, non-blocking listener.
    pub fn new(guest_cid: u64, uds_path: PathBuf, listener: UnixListener, timer: TimerFd) -> Self {
        Self {
            guest_cid,
            uds_path,
            routes: BTreeMap::new(),
            listener,
            accepted: std::sync::Arc::default(),
            open: std::sync::Arc::default(),
            listener_registered: false,
            listener_paused_until: None,
            timer,
            timer_armed_for: None,
            pending: HashMap::new(),
            conns: HashMap::new(),
            by_tag: HashMap::new(),
            rx_ready: VecDeque::new(),
            rst_queue: VecDeque::new(),
            graveyard: Vec::new(),
            next_local_port: LOCAL_PORT_BASE,
            next_tag: FIRST_HOST_TAG,
            max_connections: MAX_CONNECTIONS,
            held_until: None,
        }
    }

    /// Where guest connections to some host ports go instead of
    /// `<uds_path>_P`.
    pub fn set_routes(&mut self, routes: BTreeMap<u32, PathBuf>) {
        self.routes = routes;
    }

    /// The host socket a guest connection to host port `port` reaches.
    fn guest_target(&self, port: u32) -> PathBuf {
        if let Some(route) = self.routes.get(&port) {
            return route.clone();
        }
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{port}"));
        path.into()
    }

    /// The deadline timer.
    pub fn timer(&self) -> &TimerFd {
        &self.timer
    }

    /// Holds every packet for the guest from `now` until the driver has
    /// taken a transport reset ([`Self::release_hold`]), at most
    /// [`RESET_GATE`]; the timer ends it then.
    pub fn hold_for_reset(&mut self, now: Instant) {
        self.held_until = Some(now + RESET_GATE);
        self.rearm_timer(true);
    }

    /// The driver took the transport reset: packets go to the guest again.
    pub fn release_hold(&mut self) {
        if self.held_until.take().is_some() {
            self.rearm_timer(true);
        }
    }

    /// Whether packets for the guest are held (see [`Self::hold_for_reset`]).
    pub fn holding(&self) -> bool {
        self.held_until.is_some()
    }

    /// Whether a packet is waiting for an rx buffer.
    pub fn has_rx_work(&self) -> bool {
        !self.rst_queue.is_empty() || !self.rx_ready.is_empty()
    }

    /// The listener and its accept count, for whoever watches arrivals
    /// while the device loop does not run.
    pub fn host_arrivals(&self) -> io::Result<super::HostArrivals> {
        Ok(super::HostArrivals::new(
            self.listener.try_clone()?,
            self.accepted.clone(),
            self.open.clone(),
        ))
    }

    /// Accepts host programs waiting on the listener.
    pub fn handle_listener(&mut self) {
        for _ in 0..ACCEPT_BUDGET {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => {
                    self.accepted
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    stream
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("vsock: accept on {} failed: {e}", self.uds_path.display());
                    self.listener_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            };
            let full =
                self.pending.len() >= MAX_PENDING_HOSTS || self.conns.len() >= self.max_connections;
            // Dropping the stream closes it: the host program sees EOF.
            if full || stream.set_nonblocking(true).is_err() {
                continue;
            }
            let tag = self.alloc_tag();
            let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
            self.pending
                .insert(tag, PendingHost::new(stream, tag, deadline));
        }
    }

    /// The event loop reported `set` on the host socket tagged `tag`.
    pub fn handle_host_event(&mut self, tag: u32, set: EventSet) {
        if self.pending.contains_key(&tag) {
            self.handle_pending(tag);
            return;
        }
        // Unknown tags are stale events of sockets closed in this batch.
        let Some(&key) = self.by_tag.get(&tag) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        match conn.on_host_event(set) {
            Ok(()) if conn.finished() => self.kill(key, true),
            Ok(()) => self.schedule_rx(key),
            Err(e) => {
                tracing::debug!("vsock: resetting {key:?}: {e}");
                self.kill(key, true);
            }
        }
    }

    fn handle_pending(&mut self, tag: u32) {
        let Some(p) = self.pending.get_mut(&tag) else {
            return;
        };
        let port = match p.read_line() {
            LineStatus::Incomplete => return,
            LineStatus::Failed => {
                self.drop_pending(tag);
                return;
            }
            LineStatus::Connect(port) => port,
        };
        let Some(p) = self.pending.remove(&tag) else {
            return;
        };
        let registered = p.registered;
        let stream = p.into_stream();
        if self.conns.len() >= self.max_connections {
            self.bury(stream, tag, registered);
            return;
        }
        let local_port = self.alloc_local_port(port);
        let key = ConnKey {
            local_port,
            peer_port: port,
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let mut conn = Connection::host_initiated(key, self.guest_cid, stream, tag, deadline);
        // Same socket, same tag: the registration carries over.
        conn.registered = registered;
        self.by_tag.insert(tag, key);
        self.conns.insert(key, conn);
        self.schedule_rx(key);
    }

    /// Routes a packet the guest sent (already length-checked).
    pub fn handle_guest_packet(&mut self, hdr: &PacketHeader, payload: &[u8]) {
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            tracing::debug!("vsock: dropping misaddressed or non-stream packet {hdr:?}");
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        match hdr.op {
            OP_REQUEST => self.guest_connect(key, hdr),
            OP_RST => {
                if self.conns.contains_key(&key) {
                    self.kill(key, false);
                }
            }
            OP_RESPONSE | OP_RW | OP_SHUTDOWN | OP_CREDIT_UPDATE | OP_CREDIT_REQUEST => {
                let Some(conn) = self.conns.get_mut(&key) else {
                    self.queue_rst(hdr, false);
                    return;
                };
                conn.update_peer_credit(hdr);
                let res = match hdr.op {
                    OP_RESPONSE => conn.on_response(),
                    OP_RW => conn.on_rw(payload),
                    OP_SHUTDOWN => conn.on_shutdown(hdr.flags),
                    OP_CREDIT_REQUEST => {
                        conn.on_credit_request();
                        Ok(())
                    }
                    _ => Ok(()),
                };
                match res {
                    Ok(()) if conn.finished() => self.kill(key, true),
                    Ok(()) => self.schedule_rx(key),
                    Err(e) => {
                        tracing::debug!("vsock: resetting {key:?}: {e}");
                        self.kill(key, true);
                    }
                }
            }
            op => tracing::debug!("vsock: dropping packet with unknown op {op}"),
        }
    }

    fn guest_connect(&mut self, key: ConnKey, hdr: &PacketHeader) {
        if self.conns.contains_key(&key) {
            // A second REQUEST for a live connection: both ends are confused.
            self.kill(key, true);
            return;
        }
        if self.conns.len() >= self.max_connections {
            self.queue_rst(hdr, true);
            return;
        }
        let path = self.guest_target(hdr.dst_port);
        match connect_nonblocking(&path) {
            Ok(stream) => {
                let tag = self.alloc_tag();
                let conn = Connection::guest_initiated(key, self.guest_cid, stream, tag, hdr);
                self.by_tag.insert(tag, key);
                self.conns.insert(key, conn);
                self.schedule_rx(key);
            }
            Err(e) => {
                tracing::debug!("vsock: guest connect to {path:?} failed: {e}");
                self.queue_rst(hdr, true);
            }
        }
    }

    /// Produces the next packet for the guest into `scratch` (payload)
    /// and returns its header, or `None` if nothing is ready.
    pub fn next_rx_packet(&mut self, scratch: &mut [u8]) -> Option<PacketHeader> {
        if let Some(rst) = self.rst_queue.pop_front() {
            return Some(rst);
        }
        // Each waiting connection gets one try, so this cannot loop forever.
        for _ in 0..self.rx_ready.len() {
            let key = self.rx_ready.pop_front()?;
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.in_rx_ready = false;
            match conn.next_rx_packet(scratch) {
                RxOutcome::Packet(hdr) => {
                    self.schedule_rx(key);
                    return Some(hdr);
                }
                RxOutcome::Idle => self.schedule_rx(key),
                RxOutcome::Reset(e) => {
                    tracing::debug!("vsock: resetting {key:?}: {e}");
                    self.kill(key, true);
                    return self.rst_queue.pop_front();
                }
            }
        }
        None
    }

    /// Gives up on whatever missed its deadline by `now`.
    pub fn handle_timer(&mut self, now: Instant) {
        let late_pending: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline() <= now)
            .map(|(&t, _)| t)
            .collect();
        for tag in late_pending {
            self.drop_pending(tag);
        }
        let late_conns: Vec<ConnKey> = self
            .conns
            .values()
            .filter(|c| c.deadline().is_some_and(|d| d <= now))
            .map(|c| c.key())
            .collect();
        for key in late_conns {
            tracing::debug!("vsock: {key:?} timed out");
            self.kill(key, true);
        }
        if self.listener_paused_until.is_some_and(|d| d <= now) {
            self.listener_paused_until = None;
        }
        if self.held_until.is_some_and(|d| d <= now) {
            tracing::warn!(
                "vsock: the driver has not taken the transport reset; delivering anyway"
            );
            self.held_until = None;
        }
        self.rearm_timer(true);
    }

    /// Drops every connection (device reset); the listener stays.
    pub fn reset(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for key in keys {
            self.kill(key, false);
        }
        self.rx_ready.clear();
        self.rst_queue.clear();
        // The reset event went with the driver's old queues.
        self.held_until = None;
    }

    /// Applies the wanted event-loop interest of every socket, deregisters
    /// closed ones and re-arms the timer.
    pub fn sync_interest(&mut self, ops: &mut EventOps) {
        self.open.store(
            self.pending.len() + self.conns.len(),
            std::sync::atomic::Ordering::SeqCst,
        );
        for (stream, tag) in self.graveyard.drain(..) {
            let _ = ops.remove(Events::with_data(&stream, tag, EventSet::empty()));
        }
        let want = if self.listener_paused_until.is_none() {
            EventSet::IN
        } else {
            EventSet::empty()
        };
        let mut listener_reg = self.listener_registered.then_some(EventSet::IN);
        sync_one(ops, &self.listener, TAG_LISTENER, &mut listener_reg, want);
        self.listener_registered = listener_reg.is_some();

        let mut failed_pending = Vec::new();
        for p in self.pending.values_mut() {
            let mut reg = p.registered;
            if !sync_one(ops, p.stream(), p.tag(), &mut reg, EventSet::IN) {
                failed_pending.push(p.tag());
            }
            p.registered = reg;
        }
        let mut failed = Vec::new();
        for c in self.conns.values_mut() {
            let want = c.desired_interest();
            let (key, tag) = (c.key(), c.tag());
            let mut reg = c.registered;
            if !sync_one(ops, c.stream(), tag, &mut reg, want) {
                failed.push(key);
            }
            c.registered = reg;
        }
        for tag in failed_pending {
            self.drop_pending(tag);
        }
        for key in failed {
            self.kill(key, true);
        }
        // Sockets of connections killed just above.
        for (stream, tag) in self.graveyard.drain(..) {
            let _ = ops.remove(Events::with_data(&stream, tag, EventSet::empty()));
        }
        self.rearm_timer(false);
    }

    /// Arms the timer for the earliest deadline (always when `force`, as
    /// re-arming is also what clears a fired timerfd).
    pub fn rearm_timer(&mut self, force: bool) {
        let next = self
            .pending
            .values()
            .map(|p| p.deadline())
            .chain(self.conns.values().filter_map(|c| c.deadline()))
            .chain(self.listener_paused_until)
            .chain(self.held_until)
            .min();
        if !force && next == self.timer_armed_for {
            return;
        }
        let res = match next {
            Some(at) => {
                // A zero duration would disarm the timer instead.
                let wait = at
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                self.timer.reset(wait, None)
            }
            None => self.timer.clear(),
        };
        if let Err(e) = res {
            tracing::warn!("vsock: cannot arm the connection timer: {e}");
        }
        self.timer_armed_for = next;
    }

    fn schedule_rx(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(&key) {
            if c.has_rx_work() && !c.in_rx_ready {
                c.in_rx_ready = true;
                self.rx_ready.push_back(key);
            }
        }
    }

    /// Closes a connection's host socket, optionally owing the guest an RST.
    fn kill(&mut self, key: ConnKey, send_rst: bool) {
        let Some(conn) = self.conns.remove(&key) else {
            return;
        };
        self.by_tag.remove(&conn.tag());
        if conn.in_rx_ready {
            self.rx_ready.retain(|k| *k != key);
        }
        if send_rst {
            let hdr = PacketHeader {
                src_cid: HOST_CID,
                dst_cid: self.guest_cid,
                src_port: key.local_port,
                dst_port: key.peer_port,
                type_: TYPE_STREAM,
                op: OP_RST,
                ..Default::default()
            };
            // At most one per connection, so the hard bound is not reached
            // while unsolicited RSTs keep to their own share.
            if self.rst_queue.len() < 2 * MAX_CONNECTIONS {
                self.rst_queue.push_back(hdr);
            }
        }
        let (tag, registered) = (conn.tag(), conn.registered);
        self.bury(conn.into_stream(), tag, registered);
    }

    /// Answers `hdr` with an RST. Those for connections that never existed
    /// are capped, so a guest spraying packets cannot grow the queue.
    fn queue_rst(&mut self, hdr: &PacketHeader, for_request: bool) {
        let cap = if for_request {
            2 * MAX_CONNECTIONS
        } else {
            MAX_CONNECTIONS
        };
        if self.rst_queue.len() >= cap {
            return;
        }
        self.rst_queue.push_back(PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: hdr.dst_port,
            dst_port: hdr.src_port,
            type_: TYPE_STREAM,
            op: OP_RST,
            ..Default::default()
        });
    }

    fn drop_pending(&mut self, tag: u32) {
        if let Some(p) = self.pending.remove(&tag) {
            let registered = p.registered;
            self.bury(p.into_stream(), tag, registered);
        }
    }

    /// Closes a host socket now (peer sees EOF); one still registered with
    /// the event loop keeps its fd until `sync_interest` deregisters it.
    fn bury(&mut self, stream: UnixStream, tag: u32, registered: Option<EventSet>) {
        let _ = stream.shutdown(Shutdown::Both);
        if registered.is_some() {
            self.graveyard.push((stream, tag));
        }
    }

    fn alloc_tag(&mut self) -> u32 {
        loop {
            let tag = self.next_tag;
            self.next_tag = tag.checked_add(1).unwrap_or(FIRST_HOST_TAG);
            let taken = self.pending.contains_key(&tag)
                || self.by_tag.contains_key(&tag)
                || self.graveyard.iter().any(|(_, t)| *t == tag);
            if !taken {
                return tag;
            }
        }
    }

    fn alloc_local_port(&mut self, peer_port: u32) -> u32 {
        loop {
            let port = self.next_local_port;
            self.next_local_port = port.checked_add(1).unwrap_or(LOCAL_PORT_BASE);
            let key = ConnKey {
                local_port: port,
                peer_port,
            };
            if !self.conns.contains_key(&key) {
                return port;
            }
        }
    }
}

impl Drop for UnixBackend {
    fn drop(&mut self) {
        // The socket file would block the next bind at this path.
        let _ = std::fs::remove_file(&self.uds_path);
    }
}

/// Brings one fd's registration from `*registered` to `want` (empty means
/// not registered). Returns false if the event loop refused.
fn sync_one<F: std::os::fd::AsRawFd>(
    ops: &mut EventOps,
    fd: &F,
    tag: u32,
    registered: &mut Option<EventSet>,
    want: EventSet,
) -> bool {
    let ev = Events::with_data(fd, tag, want);
    let res = match *registered {
        None if want.is_empty() => return true,
        None => ops.add(ev),
        Some(_) if want.is_empty() => ops.remove(ev),
        Some(cur) if cur == want => return true,
        Some(_) => ops.modify(ev),
    };
    match res {
        Ok(()) => {
            *registered = (!want.is_empty()).then_some(want);
            true
        }
        Err(e) => {
            tracing::warn!("vsock: cannot update event-loop interest: {e:?}");
            false
        }
    }
}

#[cfg(test)]
impl UnixBackend {
    /// Treats every host socket as ready, as an event loop would after the
    /// fact (spurious readiness is harmless).
    pub fn poll_all(&mut self) {
        let tags: Vec<u32> = self
            .pending
            .keys()
            .copied()
            .chain(self.conns.values().map(|c| c.tag()))
            .collect();
        for tag in tags {
            self.handle_host_event(tag, EventSet::IN | EventSet::OUT);
        }
    }

    /// A connection, for inspection.
    pub fn conn(&self, key: ConnKey) -> Option<&Connection> {
        self.conns.get(&key)
    }

    /// Number of connections.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Number of host programs still handshaking.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// RSTs waiting for rx buffers.
    pub fn rst_backlog(&self) -> usize {
        self.rst_queue.len()
    }

    /// Lowers the connection cap.
    pub fn set_max_connections(&mut self, max: usize) {
        self.max_connections = max;
    }
}
