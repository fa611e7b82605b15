//! The VMM process's side of published ports ([`base::store::ports`]): a listener
//! per host address; each connection is tunnelled over vsock to the guest
//! agent (`tcp_connect`), which connects to the guest port on the guest's
//! loopback. No guest network is involved. A service's VMM serves its
//! ports the same way on Unix sockets (`relay/<port>.sock`), which the
//! workspace it serves reaches from its guest through its own vsock.

use std::collections::BTreeMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_agent::client::blocking::BlockingClient;
use guest_agent::client::ClientError;

use crate::error::{Result, VmmProcessError};
use base::store::ports::PortMapping;

/// Longest a connection waits for the agent to answer (a guest that is
/// still booting, or a warm start being resumed).
const AGENT_WAIT: Duration = Duration::from_secs(60);
/// Pause between attempts to reach the agent.
const AGENT_RETRY: Duration = Duration::from_millis(250);
/// Timeout of each handshake step with the agent (generous: where guest
/// kernel mode is emulated a busy guest answers in seconds).
const AGENT_IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connections one published port carries at once; each costs two
/// threads against the VMM's `pids.max` (`base::host::cgroup`).
pub const MAX_CONNECTIONS_PER_PORT: usize = 16;
/// Most connections all of a VMM's published ports carry at once, so the
/// vCPU and device threads a resume needs always fit under `pids.max`.
pub const MAX_CONNECTIONS: usize = 32;

/// The published ports of one VMM process.
#[derive(Debug)]
pub struct PortForwarder {
    vsock: PathBuf,
    agent_port: u32,
    listening: Mutex<BTreeMap<SocketAddr, Listening>>,
    /// A service's relay sockets, served for the VMM's life.
    relays: Mutex<Vec<Served>>,
    /// Connections open on all ports.
    open: Arc<AtomicUsize>,
}

/// How often a listener logs a kind of refusal: its clients (a network
/// client of a published port, the guest of the workspace a service
/// serves) choose how many there are, and the log has no cap of its own.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A log line at most every [`LOG_EVERY`], with how many were held back.
#[derive(Debug, Default)]
struct Throttle(Mutex<Logged>);

#[derive(Debug, Default)]
struct Logged {
    /// When the last line was logged.
    last: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    /// Some(lines held back since the last one) when one may be logged now.
    fn allow(&self) -> Option<u64> {
        let mut logged = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if logged.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            logged.held_back += 1;
            return None;
        }
        logged.last = Some(Instant::now());
        Some(std::mem::take(&mut logged.held_back))
    }
}

/// One connection's place under both caps, given back when dropped.
struct Slot {
    port: Arc<AtomicUsize>,
    all: Arc<AtomicUsize>,
}

impl Slot {
    /// A place, or None when either cap is reached.
    fn take(port: &Arc<AtomicUsize>, all: &Arc<AtomicUsize>) -> Option<Self> {
        let under = |count: &AtomicUsize, cap| {
            count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < cap).then_some(n + 1)
                })
                .is_ok()
        };
        if !under(all, MAX_CONNECTIONS) {
            return None;
        }
        if !under(port, MAX_CONNECTIONS_PER_PORT) {
            all.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self {
            port: port.clone(),
            all: all.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.port.fetch_sub(1, Ordering::AcqRel);
        self.all.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
struct Listening {
    mapping: PortMapping,
    served: Served,
}

/// A listener its own thread serves, and how to stop that thread.
#[derive(Debug)]
struct Served {
    /// A second handle on the listening socket, to shut it down.
    socket: OwnedFd,
    stop: Arc<AtomicBool>,
}

impl Served {
    /// Ends its thread: on Linux a shut-down listening socket makes a
    /// blocked accept() fail.
    fn end(&self) {
        self.stop.store(true, Ordering::Release);
        // SAFETY: shutdown on a socket descriptor we own; no memory is passed.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl PortForwarder {
    /// Tunnels to the agent on vsock `agent_port` behind the hybrid vsock
    /// socket `vsock`.
    pub fn new(vsock: &Path, agent_port: u32) -> Self {
        Self {
            vsock: vsock.to_owned(),
            agent_port,
            listening: Mutex::new(BTreeMap::new()),
            relays: Mutex::new(Vec::new()),
            open: Arc::default(),
        }
    }

    /// Serves `mapping` on `listener`, bound to its host address by the
    /// caller (the same mapping twice is one). A host address already
    /// published here for another guest port is refused.
    pub fn publish(&self, mapping: PortMapping, listener: TcpListener) -> Result<()> {
        let mut listening = self.lock();
        if let Some(l) = listening.get(&mapping.host_addr()) {
            if l.mapping == mapping {
                return Ok(());
            }
            return Err(VmmProcessError::AlreadyPublished {
                addr: mapping.host_addr(),
                guest_port: l.mapping.guest_port,
            });
        }
        let served = self.serve(
            listener,
            |l| l.accept().map(|(tcp, _)| Accepted::Tcp(tcp)),
            mapping.guest_port,
            format!("port-{}", mapping.host_port),
            mapping.to_string(),
        )?;
        listening.insert(mapping.host_addr(), Listening { mapping, served });
        Ok(())
    }

    /// Serves guest port `guest_port` on `listener`, a service's relay
    /// socket bound by the caller, for the VMM's life; under the same caps
    /// as published ports.
    pub fn relay(&self, guest_port: u16, listener: UnixListener) -> Result<()> {
        let served = self.serve(
            listener,
            |l| l.accept().map(|(unix, _)| Accepted::Unix(unix)),
            guest_port,
            format!("relay-{guest_port}"),
            format!("relay of {guest_port}"),
        )?;
        self.relays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(served);
        Ok(())
    }

    /// Starts the thread that accepts on `listener` and tunnels each
    /// connection to `guest_port` (named `thread`; `label` in its logs).
    fn serve<L: AsFd + Send + 'static>(
        &self,
        listener: L,
        accept: fn(&L) -> io::Result<Accepted>,
        guest_port: u16,
        thread: String,
        label: String,
    ) -> Result<Served> {
        let socket = listener
            .as_fd()
            .try_clone_to_owned()
            .map_err(VmmProcessError::host_io(format!("serving {label}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let tunnel_to = Tunnel {
            vsock: self.vsock.clone(),
            agent_port: self.agent_port,
            guest_port,
        };
        let open = self.open.clone();
        std::thread::Builder::new()
            .name(thread)
            .spawn(move || {
                accept_loop(|| accept(&listener), &thread_stop, tunnel_to, &open, &label)
            })
            .map_err(VmmProcessError::host_io("starting a listener thread"))?;
        Ok(Served { socket, stop })
    }

    /// Stops listening on `addr`; false when it was not published.
    pub fn unpublish(&self, addr: SocketAddr) -> bool {
        let Some(l) = self.lock().remove(&addr) else {
            return false;
        };
        l.served.end();
        true
    }

    /// Stops every published port and relay (the run ended: nothing may
    /// answer for it once its end is recorded).
    pub fn close_all(&self) {
        let addrs: Vec<_> = self.lock().keys().copied().collect();
        for addr in addrs {
            self.unpublish(addr);
        }
        for served in self.relays.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            served.end();
        }
    }

    /// What is published, in host address order.
    #[cfg(test)]
    pub fn published(&self) -> Vec<PortMapping> {
        self.lock().values().map(|l| l.mapping).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, Listening>> {
        self.listening.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PortForwarder {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// A connection accepted on a published port or a relay socket.
enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Accepted {
    fn close(&self) {
        let _ = match self {
            Accepted::Tcp(s) => s.shutdown(Shutdown::Both),
            Accepted::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// Where a port's connections go.
#[derive(Clone, Debug)]
struct Tunnel {
    vsock: PathBuf,
    agent_port: u32,
    guest_port: u16,
}

fn accept_loop(
    mut accept: impl FnMut() -> io::Result<Accepted>,
    stop: &AtomicBool,
    to: Tunnel,
    open: &Arc<AtomicUsize>,
    label: &str,
) {
    let on_port = Arc::new(AtomicUsize::new(0));
    let (full, failing) = (Throttle::default(), Throttle::default());
    let refused = Arc::new(Throttle::default());
    loop {
        let accepted = accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok(conn) => {
                let Some(slot) = Slot::take(&on_port, open) else {
                    // Closed at once: the client sees the refusal, and the
                    // VMM keeps the threads it needs.
                    if let Some(held_back) = full.allow() {
                        tracing::warn!(
                            port = label,
                            held_back,
                            "connection refused: too many open"
                        );
                    }
                    conn.close();
                    continue;
                };
                let (to, refused) = (to.clone(), refused.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("tunnel-{}", to.guest_port))
                    .spawn(move || {
                        let _slot = slot;
                        tunnel(conn, &to, &refused)
                    });
                if let Err(e) = spawned {
                    tracing::warn!(port = label, "could not start a tunnel thread: {e}");
                }
            }
            // Out of descriptors or memory: wait for connections to end.
            Err(e) => {
                if let Some(held_back) = failing.allow() {
                    tracing::warn!(port = label, held_back, "accept failed: {e}");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Carries `conn` to 127.0.0.1:`guest_port` in the guest, or closes it when
/// the guest cannot be reached or nothing listens there.
fn tunnel(conn: Accepted, to: &Tunnel, refused: &Throttle) {
    let guest_port = to.guest_port;
    let deadline = Instant::now() + AGENT_WAIT;
    let stream = loop {
        match BlockingClient::connect_hybrid_vsock(&to.vsock, to.agent_port, AGENT_IO_TIMEOUT)
            .and_then(|c| c.tcp_connect(guest_port))
        {
            Ok(stream) => break stream,
            // The agent is not listening yet (booting, or being resumed).
            Err(ClientError::Connect { .. } | ClientError::Handshake { .. })
                if Instant::now() < deadline =>
            {
                std::thread::sleep(AGENT_RETRY);
            }
            Err(e) => {
                if let Some(held_back) = refused.allow() {
                    tracing::info!(guest_port, held_back, "a connection was refused: {e}");
                }
                conn.close();
                return;
            }
        }
    };
    let piped = match conn {
        Accepted::Tcp(tcp) => guest_agent::pipe::pipe(stream, tcp),
        Accepted::Unix(unix) => guest_agent::pipe::pipe(stream, unix),
    };
    if let (Err(e), Some(held_back)) = (piped, refused.allow()) {
        tracing::info!(guest_port, held_back, "a connection failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    #[test]
    fn connections_are_capped_per_port_and_in_all() {
        let all = Arc::new(AtomicUsize::new(0));
        let ports: Vec<_> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let mut held: Vec<Slot> = (0..MAX_CONNECTIONS_PER_PORT)
            .map(|_| Slot::take(&ports[0], &all).unwrap())
            .collect();
        assert!(Slot::take(&ports[0], &all).is_none(), "the port is full");
        held.extend((0..MAX_CONNECTIONS_PER_PORT).map(|_| Slot::take(&ports[1], &all).unwrap()));
        assert!(Slot::take(&ports[2], &all).is_none(), "the VMM is full");
        assert_eq!(
            ports[2].load(Ordering::Acquire),
            0,
            "a refusal holds nothing"
        );
        held.pop();
        assert!(
            Slot::take(&ports[2], &all).is_some(),
            "an ended one frees a place"
        );
        drop(held);
        assert_eq!(all.load(Ordering::Acquire), 0);
        assert!(ports.iter().all(|p| p.load(Ordering::Acquire) == 0));
    }

    /// A stand-in for the VMM's hybrid vsock socket and the agent: answers
    /// the handshake, hello and `tcp_connect`, then echoes in upper case.
    fn fake_agent(dir: &Path) -> PathBuf {
        use guest_agent::frame;
        use guest_agent::protocol::{Request, Response, PROTOCOL_VERSION};
        let path = dir.join("vsock.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut s = conn.unwrap();
                let mut line = Vec::new();
                let mut b = [0u8];
                while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                    line.push(b[0]);
                }
                assert_eq!(line, b"CONNECT 1024");
                s.write_all(b"OK 1024\n").unwrap();
                let hello = frame::read_frame(&mut s).unwrap().unwrap();
                assert!(matches!(
                    serde_json::from_slice(&hello.payload).unwrap(),
                    Request::Hello { .. }
                ));
                frame::write_json(
                    &mut s,
                    &Response::Hello {
                        version: PROTOCOL_VERSION,
                        agent: "fake".into(),
                        capabilities: vec![],
                    },
                )
                .unwrap();
                let req = frame::read_frame(&mut s).unwrap().unwrap();
                assert_eq!(
                    serde_json::from_slice::<Request>(&req.payload).unwrap(),
                    Request::TcpConnect { port: 8080 }
                );
                frame::write_json(&mut s, &Response::ok()).unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                s.write_all(&got.to_ascii_uppercase()).unwrap();
            }
        });
        path
    }

    #[test]
    fn a_connection_is_tunnelled_and_unpublish_stops_listening() {
        let dir = std::env::temp_dir().join(format!("microagent-ports-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vsock = fake_agent(&dir);
        let fwd = PortForwarder::new(&vsock, 1024);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mapping = PortMapping::local(port, 8080);
        let again = listener.try_clone().unwrap();
        let clashing = listener.try_clone().unwrap();
        fwd.publish(mapping, listener).unwrap();
        fwd.publish(mapping, again).unwrap();
        assert_eq!(fwd.published(), vec![mapping]);
        let clash = PortMapping::local(port, 9090);
        assert!(matches!(
            fwd.publish(clash, clashing).unwrap_err(),
            crate::error::VmmProcessError::AlreadyPublished {
                guest_port: 8080,
                ..
            }
        ));

        let mut c = TcpStream::connect(mapping.host_addr()).unwrap();
        c.write_all(b"through the tunnel").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = String::new();
        c.read_to_string(&mut back).unwrap();
        assert_eq!(back, "THROUGH THE TUNNEL");

        assert!(fwd.unpublish(mapping.host_addr()));
        assert!(!fwd.unpublish(mapping.host_addr()));
        assert!(fwd.published().is_empty());
        // The address is free again once the accept thread let go of it.
        assert!(testkit_wait(
            || TcpListener::bind(mapping.host_addr()).is_ok()
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refusals_are_logged_once_per_period_with_the_count_held_back() {
        let t = Throttle::default();
        assert_eq!(t.allow(), Some(0), "the first is logged");
        for _ in 0..1000 {
            assert_eq!(t.allow(), None);
        }
        // A period later: one line, saying how many were held back.
        let held_back = t.0.lock().unwrap().held_back;
        let now = Instant::now();
        let t2 = Throttle(Mutex::new(Logged {
            last: Some(now.checked_sub(LOG_EVERY).unwrap_or(now)),
            held_back,
        }));
        assert_eq!(t2.allow(), Some(1000));
        assert_eq!(t2.allow(), None);
    }

    #[test]
    fn a_relay_socket_carries_a_connection_to_the_guest_port() {
        let dir = std::env::temp_dir().join(format!("microagent-relay-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let vsock = fake_agent(&dir);
        let fwd = PortForwarder::new(&vsock, 1024);
        let path = dir.join("8080.sock");
        fwd.relay(8080, UnixListener::bind(&path).unwrap()).unwrap();
        // As the served workspace's VMM does for a guest's connection.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"to the service").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = String::new();
        c.read_to_string(&mut back).unwrap();
        assert_eq!(back, "TO THE SERVICE");
        drop(fwd);
        // Shut down with the forwarder: nothing accepts any more.
        assert!(testkit_wait(|| UnixStream::connect(&path).is_err()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn testkit_wait(mut f: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}
