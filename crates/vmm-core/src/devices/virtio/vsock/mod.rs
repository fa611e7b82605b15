//! virtio-vsock (virtio 1.2 §5.10) with the hybrid Unix-socket backend
//! Firecracker introduced:
//!
//! - a host program connects to the device's socket at `uds_path` and
//!   writes `CONNECT <port>\n`; once the guest accepts it reads
//!   `OK <local_port>\n` and the socket carries the stream;
//! - a guest connecting to host (CID 2) port P is connected to the Unix
//!   socket `<uds_path>_P`.
//!
//! Queues: rx (0) holds guest buffers the device fills with host->guest
//! packets, tx (1) carries guest->host packets, event (2) carries the
//! transport reset of a restore.
//! Flow control follows the spec's credit scheme in both directions, and
//! every buffer and queue the guest or a host program can grow is bounded.

mod arrivals;
mod connection;
mod handshake;
mod packet;
mod unix_backend;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT, Writer};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::{
    ActivateError, Interrupt, VirtioDevice, INT_USED_RING, TYPE_VSOCK, VIRTIO_F_VERSION_1,
};
use crate::memory::GuestMemory;
use packet::{read_tx_packet, HDR_SIZE, MAX_PKT_PAYLOAD};
use unix_backend::{UnixBackend, TAG_LISTENER, TAG_TIMER};

pub use arrivals::HostArrivals;
pub use connection::CLOSE_TIMEOUT;

/// Size of each of the three queues.
pub const QUEUE_SIZE: u16 = 256;
/// Index of the rx queue (device -> guest).
pub const RX_QUEUE: usize = 0;
/// Index of the tx queue (guest -> device).
pub const TX_QUEUE: usize = 1;
/// Index of the event queue.
pub const EVENT_QUEUE: usize = 2;
const QUEUE_SIZES: [u16; 3] = [QUEUE_SIZE; 3];
/// Event-loop tags of the queue eventfds, by queue index.
const QUEUE_TAGS: [u32; 3] = [1, 2, 3];
/// `virtio_vsock_event.id` of a transport reset (virtio 1.2 §5.10.6.7).
const TRANSPORT_RESET: u32 = 0;
/// Tx chains handled per event before yielding to other work.
const TX_BUDGET: usize = QUEUE_SIZE as usize;

/// Why the device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The CID is one of the reserved ones.
    #[error("guest CID {0} is reserved: use a CID from 3 to 4294967294")]
    InvalidCid(u64),
    /// Something already exists at the socket path.
    #[error("the socket path {} already exists: remove it or pick another", .0.display())]
    PathExists(PathBuf),
    /// The listening socket could not be bound.
    #[error("cannot listen on {}: check that its directory exists and is writable", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// What bind said.
        #[source]
        source: io::Error,
    },
    /// The listening socket could not be made non-blocking.
    #[error("cannot make the socket at {} non-blocking", path.display())]
    ListenerNonblocking {
        /// The socket path.
        path: PathBuf,
        /// What fcntl said.
        #[source]
        source: io::Error,
    },
    /// A queue eventfd could not be created.
    #[error("cannot create a queue eventfd: raise the open-file limit")]
    EventFd(#[source] io::Error),
    /// The deadline timer could not be created.
    #[error("cannot create the connection timer: raise the open-file limit")]
    Timer(#[source] io::Error),
    /// The listening socket could not be opened a second time (to watch
    /// arrivals while the machine is paused).
    #[error("cannot open the listening socket again: raise the open-file limit")]
    ListenerAgain(#[source] io::Error),
}

/// What the device holds while the driver has it running.
#[derive(Debug)]
struct Active {
    mem: GuestMemory,
    rxq: Queue,
    txq: Queue,
    evq: Queue,
    interrupt: Arc<Interrupt>,
}

/// A virtio-vsock device backed by host Unix sockets.
pub struct VsockDevice {
    guest_cid: u64,
    queue_events: Vec<EventFd>,
    backend: UnixBackend,
    active: Option<Active>,
    /// Payload of the tx packet being handled (at most `MAX_PKT_PAYLOAD`).
    tx_payload: Vec<u8>,
    /// Host data on its way into an rx buffer.
    rx_scratch: Vec<u8>,
}

impl std::fmt::Debug for VsockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockDevice")
            .field("guest_cid", &self.guest_cid)
            .field("backend", &self.backend)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl VsockDevice {
    /// A device for a guest with context id `guest_cid`, listening for host
    /// programs at `uds_path` (which must not exist yet).
    pub fn new(guest_cid: u64, uds_path: PathBuf) -> Result<Self, VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&guest_cid) {
            return Err(VsockError::InvalidCid(guest_cid));
        }
        let queue_events = (0..QUEUE_SIZES.len())
            .map(|_| EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))
            .collect::<Result<Vec<_>, _>>()
            .map_err(VsockError::EventFd)?;
        let timer = TimerFd::new().map_err(|e| VsockError::Timer(e.into()))?;
        let listener = bind_listener(&uds_path)?;
        Ok(Self {
            guest_cid,
            queue_events,
            backend: UnixBackend::new(guest_cid, uds_path, listener, timer),
            active: None,
            tx_payload: Vec::with_capacity(MAX_PKT_PAYLOAD),
            rx_scratch: vec![0; MAX_PKT_PAYLOAD],
        })
    }

    /// Sends the guest's connections to host port P to `routes[P]`
    /// instead of `<uds_path>_P`.
    pub fn with_routes(mut self, routes: BTreeMap<u32, PathBuf>) -> Self {
        self.backend.set_routes(routes);
        self
    }

    /// Host programs arriving at the device's socket, watched from outside
    /// the device loop.
    pub fn host_arrivals(&self) -> io::Result<HostArrivals> {
        self.backend.host_arrivals()
    }

    /// The guest's context id.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Consumes the tx queue: every chain is returned to the guest and its
    /// packet, if well formed, routed to the backend.
    /// What a tx queue notification does: consumes the guest's packets.
    /// Public for the fuzz entry points.
    pub fn handle_tx(&mut self) {
        let Some(act) = self.active.as_mut() else {
            return;
        };
        let mut used = false;
        let mut exhausted = true;
        for _ in 0..TX_BUDGET {
            let Some(chain) = act.txq.pop_descriptor_chain(&act.mem) else {
                exhausted = false;
                break;
            };
            let head = chain.head_index();
            let res = read_tx_packet(&act.mem, chain, &mut self.tx_payload);
            if let Err(e) = act.txq.add_used(&act.mem, head, 0) {
                tracing::debug!("vsock: cannot return tx chain {head}: {e}");
            }
            used = true;
            match res {
                Ok(hdr) => self.backend.handle_guest_packet(&hdr, &self.tx_payload),
                Err(e) => tracing::debug!("vsock: dropping tx packet: {e}"),
            }
        }
        if used {
            signal_used(&mut act.txq, &act.mem, &act.interrupt);
        }
        if exhausted {
            // More may be waiting: come back after other events had a turn.
            let _ = self.queue_events[TX_QUEUE].write(1);
        }
    }

    /// Fills rx buffers with whatever the backend has for the guest.
    /// What an rx queue notification does: fills the guest's buffers.
    /// Public for the fuzz entry points.
    pub fn handle_rx(&mut self) {
        if self.backend.holding() {
            return;
        }
        let Some(act) = self.active.as_mut() else {
            return;
        };
        let mut used = false;
        while self.backend.has_rx_work() {
            let Some(chain) = act.rxq.pop_descriptor_chain(&act.mem) else {
                break;
            };
            let head = chain.head_index();
            let len = match fill_rx_chain(&act.mem, chain, &mut self.backend, &mut self.rx_scratch)
            {
                Fill::Wrote(len) => len,
                Fill::Discard => 0,
                Fill::Nothing => {
                    act.rxq.go_to_previous_position();
                    break;
                }
            };
            if let Err(e) = act.rxq.add_used(&act.mem, head, len) {
                tracing::debug!("vsock: cannot return rx chain {head}: {e}");
            }
            used = true;
        }
        if used {
            signal_used(&mut act.rxq, &act.mem, &act.interrupt);
        }
    }

    /// What an event queue notification does: the driver gave an event
    /// buffer back, so it has handled the transport reset (Linux resets its
    /// connected sockets, then refills and notifies): packets flow again.
    fn handle_event_queue(&mut self) {
        self.backend.release_hold();
    }
}

/// Binds the non-blocking listener, refusing to replace an existing file.
fn bind_listener(path: &Path) -> Result<UnixListener, VsockError> {
    if path.symlink_metadata().is_ok() {
        return Err(VsockError::PathExists(path.to_path_buf()));
    }
    let listener = UnixListener::bind(path).map_err(|source| {
        if source.kind() == io::ErrorKind::AddrInUse {
            VsockError::PathExists(path.to_path_buf())
        } else {
            VsockError::Bind {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    // Only the owner may reach the guest agent through it.
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(source) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        {
            return Err(VsockError::Bind {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    if let Err(source) = listener.set_nonblocking(true) {
        let _ = std::fs::remove_file(path);
        return Err(VsockError::ListenerNonblocking {
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(listener)
}

/// What became of an rx chain.
enum Fill {
    /// A packet of this many bytes was written.
    Wrote(u32),
    /// The chain is unusable (bad memory, too small): return it empty.
    Discard,
    /// Nothing to send after all: give the chain back to the queue.
    Nothing,
}

fn fill_rx_chain(
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
    backend: &mut UnixBackend,
    scratch: &mut [u8],
) -> Fill {
    let mut writer: Writer<'_, ()> = match chain.writer(mem) {
        Ok(w) => w,
        Err(e) => {
            tracing::debug!("vsock: discarding rx chain: {e}");
            return Fill::Discard;
        }
    };
    let cap = writer.available_bytes();
    if cap < HDR_SIZE {
        return Fill::Discard;
    }
    let max_payload = (cap - HDR_SIZE).min(MAX_PKT_PAYLOAD).min(scratch.len());
    match backend.next_rx_packet(&mut scratch[..max_payload]) {
        Some(hdr) => {
            let payload = &scratch[..hdr.len as usize];
            let res = writer
                .write_all(&hdr.to_bytes())
                .and_then(|()| writer.write_all(payload));
            if let Err(e) = res {
                // The writer checked the memory up front, so this is not expected.
                tracing::warn!("vsock: writing an rx packet failed: {e}");
            }
            // Bounded by MAX_PKT_PAYLOAD + HDR_SIZE.
            Fill::Wrote(writer.bytes_written() as u32)
        }
        // A header-only buffer cannot carry the data waiting: skip it.
        None if max_payload == 0 && backend.has_rx_work() => Fill::Discard,
        None => Fill::Nothing,
    }
}

/// Interrupts the guest for new used entries, when the ring asks for it
/// (or when it cannot tell).
fn signal_used(queue: &mut Queue, mem: &GuestMemory, interrupt: &Interrupt) {
    if queue.needs_notification(mem).unwrap_or(true) {
        if let Err(e) = interrupt.trigger(INT_USED_RING) {
            tracing::warn!("vsock: cannot raise the interrupt: {e}");
        }
    }
}

impl VirtioDevice for VsockDevice {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.guest_cid.to_le_bytes();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        tracing::debug!(
            "vsock: ignoring {}-byte config write at {offset:#x}",
            data.len()
        );
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
        _acked_features: u64,
    ) -> Result<(), ActivateError> {
        let [rxq, txq, evq]: [Queue; 3] =
            queues
                .try_into()
                .map_err(|q: Vec<Queue>| ActivateError::QueueCount {
                    got: q.len(),
                    want: QUEUE_SIZES.len(),
                })?;
        self.active = Some(Active {
            mem,
            rxq,
            txq,
            evq,
            interrupt,
        });
        // Buffers may have been queued before activation, when their
        // notifications were drained unprocessed: have the loop look again.
        let _ = self.queue_events[RX_QUEUE].write(1);
        let _ = self.queue_events[TX_QUEUE].write(1);
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.backend.reset();
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active
            .iter()
            .flat_map(|a| [a.rxq.state(), a.txq.state(), a.evq.state()])
            .collect()
    }

    /// Connections do not survive a restore: the driver is told with a
    /// transport-reset event, resets its sockets and keeps its listeners.
    fn restored(&mut self) {
        let Some(act) = self.active.as_mut() else {
            return;
        };
        let Some(chain) = act.evq.pop_descriptor_chain(&act.mem) else {
            tracing::warn!("vsock: no event buffer for the transport reset");
            return;
        };
        let head = chain.head_index();
        let written = chain
            .writer(&act.mem)
            .ok()
            .and_then(|mut w: Writer<'_, ()>| w.write_all(&TRANSPORT_RESET.to_le_bytes()).ok());
        let len = if written.is_some() { 4 } else { 0 };
        if let Err(e) = act.evq.add_used(&act.mem, head, len) {
            tracing::warn!("vsock: cannot return the event buffer: {e}");
        }
        signal_used(&mut act.evq, &act.mem, &act.interrupt);
        if written.is_some() {
            self.backend.hold_for_reset(Instant::now());
        }
    }
}

impl MutEventSubscriber for VsockDevice {
    fn init(&mut self, ops: &mut EventOps) {
        for (evt, tag) in self.queue_events.iter().zip(QUEUE_TAGS) {
            if let Err(e) = ops.add(Events::with_data(evt, tag, EventSet::IN)) {
                tracing::error!("vsock: cannot watch queue eventfd: {e:?}");
            }
        }
        let timer = Events::with_data(self.backend.timer(), TAG_TIMER, EventSet::IN);
        if let Err(e) = ops.add(timer) {
            tracing::error!("vsock: cannot watch the connection timer: {e:?}");
        }
        // The listener and any host sockets accepted so far.
        self.backend.sync_interest(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let tag = events.data();
        if let Some(q) = QUEUE_TAGS.iter().position(|&t| t == tag) {
            // Drained whether active or not, or it would fire forever.
            let _ = self.queue_events[q].read();
            match q {
                RX_QUEUE => self.handle_rx(),
                TX_QUEUE => self.handle_tx(),
                _ => self.handle_event_queue(),
            }
        } else if tag == TAG_LISTENER {
            self.backend.handle_listener();
        } else if tag == TAG_TIMER {
            self.backend.handle_timer(Instant::now());
        } else {
            self.backend.handle_host_event(tag, events.event_set());
        }
        // Any event may have produced packets (replies, data, RSTs).
        self.handle_rx();
        self.backend.sync_interest(ops);
    }
}
