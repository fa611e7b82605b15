//! The agent: accept loop, one thread per connection, the handshake, and
//! dispatch of the one request each connection carries.

mod archive;
mod conn;
mod files;
pub mod forward;
mod identity;
pub mod listen;
pub mod net;
mod process;
mod reclaim;
mod sysinfo;
mod tunnel;
mod volumes;
mod warm_up;
mod watch;

use std::collections::VecDeque;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use guest_agent::frame::{self, FrameError, FrameKind};
use guest_agent::protocol::{
    AgentErrorCode, Request, Response, CAPABILITIES, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

use conn::Conn;
use listen::Listener;
use process::processes::Processes;
use process::reaper::Reaper;
use process::registry::ProcessTable;

/// Stack of a connection thread (tar and JSON work happen there).
const CONN_STACK: usize = 512 << 10;
/// Connection threads kept waiting for the next connection.
const IDLE_WORKERS: usize = 4;

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct Config {
    /// Silence after which a client is dropped.
    pub idle_timeout: Duration,
    /// Most connections served at once (running execs included).
    pub max_connections: usize,
    /// Log every request, failure and reaped orphan (otherwise only
    /// internal errors).
    pub verbose: bool,
    /// Run one command through the exec path before serving
    /// ([`warm_up`]).
    pub warm_up: bool,
    /// How a forwarded connection reaches the host.
    pub dial: forward::Dial,
}

/// What every connection thread shares.
#[derive(Debug)]
pub struct AgentState {
    started: Instant,
    config: Config,
    reaper: Reaper,
    registry: ProcessTable,
    processes: Processes,
    connections: AtomicUsize,
    forwards: forward::Forwards,
    watches: watch::Watches,
    /// When the last request other than `reclaim` came or ended, ms
    /// after `started`.
    last_request_ms: AtomicU64,
    /// The `last_request_ms` the caches were last dropped after.
    reclaimed_after_ms: AtomicU64,
    /// When the last `reclaim` came and the CPU ticks the guest's
    /// programs had used then.
    last_cpu_ticks: Mutex<Option<(Instant, u64)>>,
}

/// Why a connection's request failed.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("reading the request")]
    Frame(#[source] FrameError),
    #[error("sending the answer")]
    Send(#[source] FrameError),
    #[error("the first message must be `hello`, not `{0}`")]
    NoHello(&'static str),
    #[error(
        "protocol version {0} is not supported (this agent speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})"
    )]
    Version(u32),
    #[error("`hello` was already sent")]
    RepeatedHello,
    #[error("`resize` only goes between the stdin frames of an exec on a pty")]
    StrayResize,
    #[error("no exec {0:?} (never started, or its result expired)")]
    NoResult(String),
    #[error("too many connections (at most {0})")]
    Busy(usize),
    #[error(
        "shutdown and restored are only honoured when the agent runs as the guest's init (PID 1)"
    )]
    NotInit,
    #[error("exec")]
    Exec(#[source] process::exec::ExecError),
    #[error("file operation")]
    File(#[source] files::FileError),
    #[error("tar")]
    Archive(#[source] archive::ArchiveError),
    #[error("info")]
    Info(#[source] sysinfo::InfoError),
    #[error("reclaim")]
    Reclaim(#[source] reclaim::ReclaimError),
    #[error("taking the restored identity")]
    Identity(#[source] identity::IdentityError),
    #[error("tcp_connect")]
    Tunnel(#[source] tunnel::TunnelError),
    #[error("forward")]
    Forward(#[source] forward::ForwardError),
    #[error("taking the restored network")]
    Network(#[source] net::NetSetupError),
    #[error("background process")]
    Process(#[source] process::processes::ProcessError),
    #[error("mounting volumes")]
    Volumes(#[source] volumes::MountError),
    #[error("watch")]
    Watch(#[source] watch::WatchError),
}

impl RequestError {
    fn code(&self) -> AgentErrorCode {
        match self {
            Self::Frame(e) | Self::Send(e) => e.code(),
            Self::NoHello(_) | Self::RepeatedHello | Self::StrayResize => {
                AgentErrorCode::InvalidInput
            }
            Self::Version(_) => AgentErrorCode::UnsupportedVersion,
            Self::NotInit => AgentErrorCode::PermissionDenied,
            Self::NoResult(_) => AgentErrorCode::NotFound,
            Self::Busy(_) => AgentErrorCode::TooLarge,
            Self::Exec(e) => e.code(),
            Self::File(e) => e.code(),
            Self::Archive(e) => e.code(),
            Self::Info(e) => e.code(),
            Self::Reclaim(_) => AgentErrorCode::Internal,
            Self::Identity(e) => e.code(),
            Self::Tunnel(e) => e.code(),
            Self::Forward(e) => e.code(),
            Self::Network(e) => e.code(),
            Self::Process(e) => e.code(),
            Self::Volumes(e) => e.code(),
            Self::Watch(e) => e.code(),
        }
    }

    /// The client is gone: nobody to send an error to.
    fn is_disconnect(&self) -> bool {
        let frame_error = match self {
            Self::Frame(e) | Self::Send(e) => Some(e),
            Self::File(files::FileError::Send(e)) => Some(e),
            Self::Archive(archive::ArchiveError::Send(e)) => Some(e),
            Self::Process(process::processes::ProcessError::Send(e)) => Some(e),
            _ => None,
        };
        frame_error.is_some_and(|e| e.is_disconnect())
    }
}

/// An error with its chain of causes, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Milliseconds since the Unix epoch by the guest's clock (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Starts a named thread with a small stack.
pub fn spawn_thread<F>(name: &str, stack: usize, f: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .stack_size(stack)
        .spawn(f)
}

impl AgentState {
    /// The shared state, its reaper thread started.
    fn start(config: Config) -> io::Result<Arc<Self>> {
        let reaper = Reaper::start(config.verbose)?;
        Ok(Arc::new(AgentState {
            started: Instant::now(),
            forwards: forward::Forwards::new(config.dial.clone()),
            watches: watch::Watches::default(),
            config,
            reaper,
            registry: ProcessTable::default(),
            processes: Processes::default(),
            connections: AtomicUsize::new(0),
            last_request_ms: AtomicU64::new(0),
            last_cpu_ticks: Mutex::new(None),
            reclaimed_after_ms: AtomicU64::new(0),
        }))
    }
}

/// Serves `listener` forever; returns only if the reaper thread cannot start.
pub fn serve(listener: Listener, config: Config) -> io::Error {
    let state = match AgentState::start(config) {
        Ok(state) => state,
        Err(e) => return e,
    };
    let workers = Workers::default();
    if state.config.warm_up {
        warm_up::run(&workers, &state);
    }
    loop {
        let stream = match listener.accept() {
            Ok(stream) => stream,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors or memory: wait for connections to end.
                log!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let active = state.connections.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = workers.hand_over(stream, active, &state) {
            state.connections.fetch_sub(1, Ordering::SeqCst);
            log!("no thread for a connection: {e}");
        }
    }
}

/// Connection threads, kept for the next connection when they finish:
/// creating a thread costs the emulated guest kernel a clone, a stack
/// mapping and its page faults, on every exec.
#[derive(Default)]
struct Workers {
    shared: Arc<WorkerQueue>,
}

#[derive(Default)]
struct WorkerQueue {
    /// Connections handed to an idle worker, with their `active` count.
    waiting: Mutex<VecDeque<(UnixStream, usize)>>,
    arrived: Condvar,
    /// Workers waiting for a connection and not yet claimed by one.
    idle: AtomicUsize,
}

impl Workers {
    /// Serves `stream` on an idle worker, or on a new one.
    fn hand_over(
        &self,
        stream: UnixStream,
        active: usize,
        state: &Arc<AgentState>,
    ) -> io::Result<()> {
        let queue = &self.shared;
        let claimed = queue
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if claimed {
            lock(&queue.waiting).push_back((stream, active));
            queue.arrived.notify_one();
            return Ok(());
        }
        let (queue, state) = (queue.clone(), state.clone());
        spawn_thread("conn", CONN_STACK, move || {
            work(&queue, &state, stream, active)
        })
        .map(drop)
    }
}

/// Serves connections until more than [`IDLE_WORKERS`] wait idle.
fn work(queue: &WorkerQueue, state: &AgentState, mut stream: UnixStream, mut active: usize) {
    loop {
        {
            let _slot = Slot(&state.connections);
            handle_connection(stream, state, active);
        }
        if queue.idle.load(Ordering::SeqCst) >= IDLE_WORKERS {
            return;
        }
        let mut waiting = lock(&queue.waiting);
        queue.idle.fetch_add(1, Ordering::SeqCst);
        loop {
            if let Some(next) = waiting.pop_front() {
                (stream, active) = next;
                break;
            }
            waiting = queue
                .arrived
                .wait(waiting)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The queue is a plain list: a panicking holder cannot break it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection counted in `AgentState::connections` (released even if the
/// connection's thread panics).
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn handle_connection(stream: UnixStream, state: &AgentState, active: usize) {
    let mut conn = match Conn::new(stream, state.config.idle_timeout) {
        Ok(conn) => conn,
        Err(e) => {
            log!("setting up a connection: {e}");
            return;
        }
    };
    let mut used = false;
    let outcome = if active >= state.config.max_connections {
        Err(RequestError::Busy(state.config.max_connections))
    } else {
        serve_request(&mut conn, state, &mut used)
    };
    // A long exec ending is use too: idleness counts from its end.
    if used {
        mark_activity(state);
    }
    if let Err(e) = outcome {
        let message = error_chain(&e);
        if !e.is_disconnect() {
            let _ = conn.send_error(e.code(), message.clone());
        }
        // The console may be slow (emulated serial): only what needs a look.
        if state.config.verbose || e.code() == AgentErrorCode::Internal {
            log!("request failed ({}): {message}", e.code());
        }
    }
    conn.finish();
}

fn mark_activity(state: &AgentState) {
    state
        .last_request_ms
        .store(reclaim::now_ms(state).max(1), Ordering::SeqCst);
}

/// Takes an identity sent with a hello unless it is the one taken last
/// (the host sends it with every request until the workspace restarts).
fn take_identity_once(new: &guest_agent::protocol::NewIdentity) -> Result<(), RequestError> {
    static TAKEN: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    if std::process::id() != 1 {
        return Err(RequestError::NotInit);
    }
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if taken.as_deref() == Some(new.entropy.as_str()) {
        return Ok(());
    }
    identity::take(&new.hostname, &new.entropy, new.unix_time_ns)
        .map_err(RequestError::Identity)?;
    *taken = Some(new.entropy.clone());
    Ok(())
}

fn read_request(conn: &mut Conn) -> Result<Option<Request>, RequestError> {
    let Some(frame) = conn.read_frame().map_err(RequestError::Frame)? else {
        return Ok(None);
    };
    if frame.kind != FrameKind::Json {
        return Err(RequestError::Frame(FrameError::UnexpectedKind {
            expected: FrameKind::Json,
            got: frame.kind,
        }));
    }
    frame::decode_json(&frame)
        .map(Some)
        .map_err(RequestError::Frame)
}

/// Serves the connection's request; `used` says whether it was one that
/// counts as use of the guest (anything but `reclaim`).
fn serve_request(conn: &mut Conn, state: &AgentState, used: &mut bool) -> Result<(), RequestError> {
    let (version, identity, host_time_ns) = match read_request(conn)? {
        // Connected and left (a probe): nothing to do.
        None => return Ok(()),
        Some(Request::Hello {
            version,
            identity,
            host_time_ns,
        }) => (version, identity, host_time_ns),
        Some(other) => return Err(RequestError::NoHello(other.name())),
    };
    if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
        return Err(RequestError::Version(version));
    }
    if let Some(new) = identity {
        take_identity_once(&new)?;
    }
    // Only the guest's init owns its clock (an agent run on a host for
    // tests must not set the host's).
    if let Some(host_ns) = host_time_ns.filter(|_| std::process::id() == 1) {
        match identity::catch_up_clock(host_ns) {
            Ok(true) if state.config.verbose => log!("clock set to the host's"),
            Ok(_) => {}
            Err(e) => log!("cannot set the clock to the host's: {e}"),
        }
    }
    // Answered in the client's version: an older client reads its own.
    let hello = Response::Hello {
        version,
        agent: format!("microagent-agent {}", env!("CARGO_PKG_VERSION")),
        capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
    };
    // A request sent with the hello is read at once: an exec's answer to
    // the hello then leaves with its `started` (one transmit, not two).
    // A client that waits for the hello gets it now.
    if conn.has_buffered_input() {
        conn.send_later(&hello)
    } else {
        conn.send(&hello)
    }
    .map_err(RequestError::Send)?;
    // No request after hello: the client only wanted the handshake.
    let Some(request) = read_request(conn)? else {
        return Ok(());
    };
    if !matches!(request, Request::Exec(_)) {
        conn.flush_pending().map_err(RequestError::Send)?;
    }
    if state.config.verbose {
        log!("request {}", request.name());
    }
    if !matches!(request, Request::Reclaim { .. }) {
        *used = true;
        mark_activity(state);
    }
    let answer = match request {
        Request::Hello { .. } => return Err(RequestError::RepeatedHello),
        Request::Ping => Response::Pong {
            uptime_ms: state.started.elapsed().as_millis() as u64,
        },
        Request::Info => Response::Info(sysinfo::collect().map_err(RequestError::Info)?),
        Request::Reclaim { idle_secs } => {
            Response::Reclaimed(reclaim::run(state, idle_secs).map_err(RequestError::Reclaim)?)
        }
        Request::Shutdown => {
            if std::process::id() != 1 {
                return Err(RequestError::NotInit);
            }
            conn.send(&Response::ok()).map_err(RequestError::Send)?;
            shutdown_guest();
        }
        Request::Exec(req) => {
            return process::exec::run(conn, state, req).map_err(RequestError::Exec)
        }
        Request::Signal { exec_id, signal } => {
            process::exec::signal(state, &exec_id, &signal).map_err(RequestError::Exec)?;
            Response::ok()
        }
        Request::Result { exec_id } => match state.registry.result(&exec_id) {
            Some(answer) => answer,
            None => return Err(RequestError::NoResult(exec_id)),
        },
        Request::ReadFile {
            path,
            offset,
            length,
        } => return files::read_file(conn, &path, offset, length).map_err(RequestError::File),
        Request::WriteFile { path, mode, perm } => {
            return files::write_file(conn, &path, mode, perm).map_err(RequestError::File)
        }
        Request::Stat { path } => files::stat(&path).map_err(RequestError::File)?,
        Request::ListDir { path } => files::list_dir(&path).map_err(RequestError::File)?,
        Request::Mkdir { path } => files::mkdir(&path).map_err(RequestError::File)?,
        Request::Remove { path, recursive } => {
            files::remove(&path, recursive).map_err(RequestError::File)?
        }
        Request::Rename { from, to } => files::rename(&from, &to).map_err(RequestError::File)?,
        Request::TarOut {
            path,
            one_file_system,
        } => return archive::tar_out(conn, &path, one_file_system).map_err(RequestError::Archive),
        Request::TarIn { path, owners } => {
            return archive::tar_in(conn, &path, owners).map_err(RequestError::Archive)
        }
        Request::TcpConnect { port } => {
            return tunnel::tcp_connect(conn, port).map_err(RequestError::Tunnel)
        }
        Request::Forward { forwards } => {
            state
                .forwards
                .set(forwards)
                .map_err(RequestError::Forward)?;
            Response::ok()
        }
        Request::ProcessStart(req) => Response::Process(
            state
                .processes
                .start(&state.reaper, req)
                .map_err(RequestError::Process)?,
        ),
        Request::ProcessList => Response::Processes {
            processes: state.processes.list(),
        },
        Request::ProcessOutput {
            id,
            stdout_cursor,
            stderr_cursor,
            max_bytes,
            wait_ms,
        } => {
            let cursors = [stdout_cursor, stderr_cursor];
            return state
                .processes
                .output(conn, &id, cursors, max_bytes, wait_ms)
                .map_err(RequestError::Process);
        }
        Request::ProcessStdin { id, data, close } => Response::Ok {
            bytes: Some(
                state
                    .processes
                    .stdin(&id, &data, close)
                    .map_err(RequestError::Process)?,
            ),
            entries: None,
        },
        Request::ProcessSignal { id, signal } => {
            state
                .processes
                .signal(&id, &signal)
                .map_err(RequestError::Process)?;
            Response::ok()
        }
        Request::ProcessWait { id, timeout_ms } => Response::Process(
            state
                .processes
                .wait(&id, timeout_ms)
                .map_err(RequestError::Process)?,
        ),
        Request::ProcessRemove { id } => {
            state.processes.remove(&id).map_err(RequestError::Process)?;
            Response::ok()
        }
        Request::WatchStart { path, recursive } => Response::Watch(
            state
                .watches
                .start(&path, recursive)
                .map_err(RequestError::Watch)?,
        ),
        Request::WatchEvents { id, since, wait_ms } => Response::WatchEvents(
            state
                .watches
                .events(&id, since, wait_ms)
                .map_err(RequestError::Watch)?,
        ),
        Request::WatchStop { id } => {
            state.watches.stop(&id).map_err(RequestError::Watch)?;
            Response::ok()
        }
        Request::WatchList => Response::Watches {
            watches: state.watches.list(),
        },
        Request::Resize(_) => return Err(RequestError::StrayResize),
        Request::Restored {
            hostname,
            entropy,
            unix_time_ns,
            network,
            mac,
        } => {
            if std::process::id() != 1 {
                return Err(RequestError::NotInit);
            }
            identity::take(&hostname, &entropy, unix_time_ns).map_err(RequestError::Identity)?;
            if let Some(setting) = network {
                net::readdress(&setting, mac.as_deref()).map_err(RequestError::Network)?;
            }
            Response::ok()
        }
        Request::MountVolumes { volumes } => {
            if std::process::id() != 1 {
                return Err(RequestError::NotInit);
            }
            volumes::mount_all(&volumes).map_err(RequestError::Volumes)?;
            Response::ok()
        }
    };
    conn.send(&answer).map_err(RequestError::Send)
}

/// Ends the guest: flushes every filesystem, then restarts, which the VMM
/// treats as the end of the VM (there is no ACPI to power off through).
fn shutdown_guest() -> ! {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    volumes::unmount_all();
    // SAFETY: reboot with a valid command; only reached as the guest's PID 1.
    unsafe { libc::reboot(libc::LINUX_REBOOT_CMD_RESTART) };
    // The restart failed (not permitted?): keep serving rather than exit,
    // since PID 1 exiting panics the guest kernel.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
