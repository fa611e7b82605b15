//! `forward`: names on the guest loopback for services that live outside
//! the guest. The agent listens on each forward's `addr:port`; each
//! connection is carried to the host's vsock port of it (the VMM passes it
//! on to the service), and /etc/hosts names the addresses. The set is
//! replaced whole; a forward kept from the set before keeps its listener
//! and its connections.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use guest_agent::protocol::{AgentErrorCode, Forward, MAX_FORWARDS, MAX_FORWARD_CONNECTIONS};

/// The marks around the lines the agent keeps in /etc/hosts.
const HOSTS_BEGIN: &str = "# microagent services: begin";
const HOSTS_END: &str = "# microagent services: end";
/// Longest name.
const MAX_NAME: usize = 63;
/// Stack of a listener thread (it only accepts).
const LISTEN_STACK: usize = 64 << 10;

/// How a connection reaches the host.
#[derive(Debug, Clone)]
pub enum Dial {
    /// AF_VSOCK to the host (CID 2): in a guest.
    Vsock,
    /// The Unix socket `<base>_<vsock_port>`, as a VMM's hybrid vsock
    /// names what a guest connects to: an agent run as a host process.
    Unix(PathBuf),
}

/// Why a `forward` failed; the set before stays.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// More than [`MAX_FORWARDS`].
    #[error("{0} forwards asked, at most {MAX_FORWARDS}")]
    TooMany(usize),
    /// A forward the rules refuse.
    #[error("forward {name:?} to {addr}:{port}: {why}")]
    Invalid {
        /// Its name.
        name: String,
        /// Its address.
        addr: Ipv4Addr,
        /// Its port.
        port: u16,
        /// The rule.
        why: &'static str,
    },
    /// Not the guest's init, nor an agent on a Unix socket.
    #[error("forward is only honoured by the guest's init (PID 1)")]
    NotInit,
    /// Listening failed.
    #[error("listening on {addr}:{port}")]
    Listen {
        /// The address.
        addr: Ipv4Addr,
        /// The port.
        port: u16,
        /// What bind said.
        #[source]
        source: io::Error,
    },
    /// /etc/hosts could not be written.
    #[error("writing /etc/hosts")]
    Hosts(#[source] io::Error),
}

impl ForwardError {
    /// The wire code.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::TooMany(_) => AgentErrorCode::TooLarge,
            Self::Invalid { .. } => AgentErrorCode::InvalidInput,
            Self::NotInit => AgentErrorCode::PermissionDenied,
            Self::Listen { source, .. } | Self::Hosts(source) => {
                AgentErrorCode::from_io(source.kind())
            }
        }
    }
}

/// One forward listening.
#[derive(Debug)]
struct Listening {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    /// Where its connections go; a set may change it in place.
    vsock_port: Arc<AtomicU32>,
}

impl Listening {
    /// Serves `listener` on a thread of its own.
    fn start(
        listener: TcpListener,
        vsock_port: u32,
        dial: &Dial,
        connections: &Arc<AtomicUsize>,
    ) -> io::Result<Self> {
        let listening = Self {
            listener: Arc::new(listener),
            stop: Arc::new(AtomicBool::new(false)),
            vsock_port: Arc::new(AtomicU32::new(vsock_port)),
        };
        let (listener, stop, port) = (
            listening.listener.clone(),
            listening.stop.clone(),
            listening.vsock_port.clone(),
        );
        let (dial, connections) = (dial.clone(), connections.clone());
        // Dropped on failure: its listener is shut down with it.
        std::thread::Builder::new()
            .name("forward".into())
            .stack_size(LISTEN_STACK)
            .spawn(move || accept_loop(&listener, &stop, &dial, &connections, &port))?;
        Ok(listening)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown() takes no pointers; the descriptor is the
        // listener's, alive while `self.listener` is. It wakes the accept.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// The forwards of this agent, by address and port.
#[derive(Debug)]
pub struct Forwards {
    dial: Dial,
    active: Mutex<BTreeMap<(Ipv4Addr, u16), Listening>>,
    connections: Arc<AtomicUsize>,
}

impl Forwards {
    /// None yet; connections go out by `dial`.
    pub fn new(dial: Dial) -> Self {
        Self {
            dial,
            active: Mutex::new(BTreeMap::new()),
            connections: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Makes `wanted` the set: checked whole first, then the new listeners
    /// bound and started and /etc/hosts written (any failure drops what
    /// was new and keeps the set before), then the kept ones pointed where
    /// `wanted` says and the others closed.
    pub fn set(&self, wanted: Vec<Forward>) -> Result<(), ForwardError> {
        let pid1 = std::process::id() == 1;
        if !pid1 && matches!(self.dial, Dial::Vsock) {
            return Err(ForwardError::NotInit);
        }
        check(&wanted)?;
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh = Vec::new();
        for f in wanted
            .iter()
            .filter(|f| !active.contains_key(&(f.addr, f.port)))
        {
            let failed = |source| ForwardError::Listen {
                addr: f.addr,
                port: f.port,
                source,
            };
            let listener = TcpListener::bind(SocketAddr::from((f.addr, f.port))).map_err(failed)?;
            let listening = Listening::start(listener, f.vsock_port, &self.dial, &self.connections)
                .map_err(failed)?;
            fresh.push(((f.addr, f.port), listening));
        }
        if pid1 {
            super::net::edit_hosts(super::net::HOSTS, |hosts| {
                hosts_with_forwards(hosts, &wanted)
            })
            .map_err(ForwardError::Hosts)?;
        }
        for f in &wanted {
            if let Some(kept) = active.get(&(f.addr, f.port)) {
                kept.vsock_port.store(f.vsock_port, Ordering::SeqCst);
            }
        }
        active.retain(|(addr, port), _| wanted.iter().any(|f| (f.addr, f.port) == (*addr, *port)));
        active.extend(fresh);
        Ok(())
    }
}

/// The rules: at most [`MAX_FORWARDS`]; names `[a-z][a-z0-9-]*`; an
/// address in 127.0.1.2-254 and one name per address; ports not 0; no
/// address and port twice.
fn check(wanted: &[Forward]) -> Result<(), ForwardError> {
    if wanted.len() > MAX_FORWARDS {
        return Err(ForwardError::TooMany(wanted.len()));
    }
    let mut names: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
    let mut ports = std::collections::BTreeSet::new();
    for f in wanted {
        let invalid = |why| ForwardError::Invalid {
            name: f.name.chars().take(MAX_NAME).collect(),
            addr: f.addr,
            port: f.port,
            why,
        };
        let name_ok = f.name.len() <= MAX_NAME
            && f.name.starts_with(|c: char| c.is_ascii_lowercase())
            && f.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(invalid(
                "a name is a-z, 0-9 and '-', starting with a letter, at most 63 bytes",
            ));
        }
        let [a, b, c, d] = f.addr.octets();
        if (a, b, c) != (127, 0, 1) || !(2..=254).contains(&d) {
            return Err(invalid("the address must be in 127.0.1.2 to 127.0.1.254"));
        }
        if f.port == 0 || f.vsock_port == 0 {
            return Err(invalid("port 0 names nothing"));
        }
        if *names.entry(f.addr).or_insert(&f.name) != f.name {
            return Err(invalid("an address has one name"));
        }
        if !ports.insert((f.addr, f.port)) {
            return Err(invalid("an address and port are forwarded once"));
        }
    }
    Ok(())
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    dial: &Dial,
    connections: &Arc<AtomicUsize>,
    to: &AtomicU32,
) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors: wait for connections to end.
                log!("forward accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        // One slot per connection; past the cap it is closed at once.
        if connections.fetch_add(1, Ordering::SeqCst) >= MAX_FORWARD_CONNECTIONS {
            connections.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (dial, held, vsock_port) =
            (dial.clone(), connections.clone(), to.load(Ordering::SeqCst));
        let spawned = std::thread::Builder::new()
            .name("forwarded".into())
            .stack_size(LISTEN_STACK)
            .spawn(move || {
                if let Ok(host) = connect(&dial, vsock_port) {
                    let _ = guest_agent::pipe::pipe(host, tcp);
                }
                held.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A connection to the host's vsock port `port`.
fn connect(dial: &Dial, port: u32) -> io::Result<UnixStream> {
    if let Dial::Unix(base) = dial {
        let mut path = base.clone().into_os_string();
        path.push(format!("_{port}"));
        return UnixStream::connect(path);
    }
    let fd = super::listen::vsock_socket()?;
    let addr = super::listen::vsock_addr(libc::VMADDR_CID_HOST, port);
    // SAFETY: `addr` is a valid sockaddr_vm and its exact size is passed.
    let connected = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if connected != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// `hosts` with the agent's block naming `forwards`' addresses (one line
/// per address), in place of the block before; the rest kept as it was.
pub fn hosts_with_forwards(hosts: &str, forwards: &[Forward]) -> String {
    let lines: Vec<&str> = hosts.lines().collect();
    let begin = lines.iter().position(|l| l.trim() == HOSTS_BEGIN);
    let end = begin.and_then(|b| {
        lines[b..]
            .iter()
            .position(|l| l.trim() == HOSTS_END)
            .map(|e| b + e)
    });
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        // Only a whole block is ours; a lone mark is dropped, not what follows it.
        let ours = matches!((begin, end), (Some(b), Some(e)) if (b..=e).contains(&i));
        if ours || matches!(line.trim(), HOSTS_BEGIN | HOSTS_END) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let names: BTreeMap<Ipv4Addr, &str> =
        forwards.iter().map(|f| (f.addr, f.name.as_str())).collect();
    if !names.is_empty() {
        out.push_str(HOSTS_BEGIN);
        out.push('\n');
        for (addr, name) in names {
            out.push_str(&format!("{addr}\t{name}\n"));
        }
        out.push_str(HOSTS_END);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(name: &str, last: u8, port: u16) -> Forward {
        Forward {
            name: name.into(),
            addr: Ipv4Addr::new(127, 0, 1, last),
            port,
            vsock_port: 5_000_000 + u32::from(port),
        }
    }

    #[test]
    fn the_hosts_block_is_replaced_and_the_rest_kept() {
        let debian = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";
        let one = hosts_with_forwards(debian, &[fwd("db", 2, 5432), fwd("db", 2, 5433)]);
        assert_eq!(
            one,
            format!("{debian}{HOSTS_BEGIN}\n127.0.1.2\tdb\n{HOSTS_END}\n"),
            "one line per address"
        );
        let two = hosts_with_forwards(&one, &[fwd("cache", 3, 6379)]);
        assert_eq!(
            two,
            format!("{debian}{HOSTS_BEGIN}\n127.0.1.3\tcache\n{HOSTS_END}\n")
        );
        assert_eq!(hosts_with_forwards(&two, &[]), debian, "none: no block");
        let cut = format!("{debian}{HOSTS_BEGIN}\n10.0.0.9\tmine\n");
        assert_eq!(
            hosts_with_forwards(&cut, &[]),
            format!("{debian}10.0.0.9\tmine\n"),
            "a begin mark without an end keeps what follows it"
        );
    }

    #[test]
    fn the_rules_refuse_before_anything_changes() {
        assert!(check(&[fwd("db", 2, 5432), fwd("web", 3, 80)]).is_ok());
        let refused = |f: Vec<Forward>| check(&f).unwrap_err().code();
        assert_eq!(refused(vec![fwd("Db", 2, 1)]), AgentErrorCode::InvalidInput);
        assert_eq!(
            refused(vec![fwd("1db", 2, 1)]),
            AgentErrorCode::InvalidInput
        );
        assert_eq!(
            refused(vec![fwd("d b", 2, 1)]),
            AgentErrorCode::InvalidInput
        );
        assert_eq!(
            refused(vec![fwd(&"a".repeat(64), 2, 1)]),
            AgentErrorCode::InvalidInput
        );
        assert_eq!(refused(vec![fwd("db", 1, 1)]), AgentErrorCode::InvalidInput);
        assert_eq!(
            refused(vec![fwd("db", 255, 1)]),
            AgentErrorCode::InvalidInput
        );
        let mut outside = fwd("db", 2, 1);
        outside.addr = Ipv4Addr::new(10, 0, 2, 2);
        assert_eq!(refused(vec![outside]), AgentErrorCode::InvalidInput);
        assert_eq!(refused(vec![fwd("db", 2, 0)]), AgentErrorCode::InvalidInput);
        assert_eq!(
            refused(vec![fwd("db", 2, 1), fwd("web", 2, 2)]),
            AgentErrorCode::InvalidInput,
            "one name per address"
        );
        assert_eq!(
            refused(vec![fwd("db", 2, 1), fwd("db", 2, 1)]),
            AgentErrorCode::InvalidInput,
            "once each"
        );
        let many: Vec<Forward> = (0..=MAX_FORWARDS as u16)
            .map(|p| fwd("db", 2, p + 1))
            .collect();
        assert_eq!(refused(many), AgentErrorCode::TooLarge);
    }
}
