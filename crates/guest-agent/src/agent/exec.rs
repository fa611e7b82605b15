//! `exec` and `signal`.
//!
//! An exec runs in its own process group. Its connection thread forwards
//! output as it arrives (two reader threads feed a bounded queue, so a slow
//! client slows the process down rather than filling memory), enforces the
//! timeout, and reports the exit status the reaper routes to it. If the
//! client goes away the process keeps running until it ends or times out;
//! its output is then only counted, and its result kept for `result`.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guest_agent::frame::FrameKind;
use guest_agent::protocol::{
    ErrorCode, ExecRequest, Exited, Response, SignalSpec, StdinMode, DEFAULT_OUTPUT_CAP,
    MAX_OUTPUT_CAP, OUTPUT_CHUNK, RESULT_HEAD,
};

use super::conn::Conn;
use super::lookup;
use super::pty;
use super::reaper::decode_status;
use super::registry::{Lookup, RegistryError};
use super::{spawn_thread, State};

/// PATH of every exec unless its `env` sets one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// After the process exits, output still arriving is forwarded until the
/// pipes close, or nothing came for this long (a background process
/// holding them open), or [`POST_EXIT_MAX`] has passed.
const POST_EXIT_IDLE: Duration = Duration::from_millis(500);
const POST_EXIT_MAX: Duration = Duration::from_secs(30);
/// Output chunks queued between the reader threads and the connection.
const QUEUE: usize = 16;
/// Stack of the pipe reader threads (their buffer is on the heap).
const PUMP_STACK: usize = 64 << 10;

/// Why an exec or a signal failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Neither or both of `argv` and `shell`, or an empty program.
    #[error("exec needs exactly one of a non-empty `argv` and `shell`")]
    Command,
    /// A bad environment variable name.
    #[error("environment variable name {0:?} is empty or contains '=' or NUL")]
    EnvName(String),
    /// `cwd` is relative.
    #[error("cwd {0:?} is not an absolute path")]
    Cwd(String),
    /// `output_cap` over the limit.
    #[error("output_cap {0} is over the {MAX_OUTPUT_CAP}-byte limit")]
    OutputCap(u64),
    /// `timeout_ms` of 0.
    #[error("timeout_ms must be at least 1")]
    ZeroTimeout,
    /// The exec id could not be taken.
    #[error("exec id")]
    Id(#[source] RegistryError),
    /// The process could not be started.
    #[error("spawning {program:?}")]
    Spawn {
        /// What was run.
        program: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A helper thread could not be started.
    #[error("starting an exec thread")]
    Thread(#[source] io::Error),
    /// The pseudo-terminal could not be set up.
    #[error("exec on a pty")]
    Pty(#[source] pty::PtyError),
    /// An unknown signal.
    #[error("unknown signal {0}")]
    BadSignal(String),
    /// No running exec by that id.
    #[error("no running exec {0:?}")]
    NotRunning(String),
    /// kill() failed.
    #[error("signalling process group {pgid}")]
    Kill {
        /// The process group.
        pgid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl ExecError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Command
            | Self::EnvName(_)
            | Self::Cwd(_)
            | Self::ZeroTimeout
            | Self::BadSignal(_) => ErrorCode::InvalidInput,
            Self::OutputCap(_) => ErrorCode::TooLarge,
            Self::Id(e) => e.code(),
            Self::Spawn { source, .. } | Self::Kill { source, .. } => {
                ErrorCode::from_io(source.kind())
            }
            Self::Thread(_) | Self::Pty(_) => ErrorCode::Internal,
            Self::NotRunning(_) => ErrorCode::NotFound,
        }
    }
}

enum Event {
    Output(usize, Vec<u8>),
    Eof,
    Exited,
}

#[derive(Clone, Copy)]
struct ExitSeen {
    status: i32,
    at: Instant,
}

/// One output stream's accounting.
struct Output {
    kind: FrameKind,
    cap: u64,
    total: u64,
    sent: u64,
    head: Vec<u8>,
}

impl Output {
    fn new(kind: FrameKind, cap: u64) -> Self {
        Self {
            kind,
            cap,
            total: 0,
            sent: 0,
            head: Vec::new(),
        }
    }

    /// Counts `bytes`, keeps the head, and returns the part within the cap.
    fn take<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        self.total += bytes.len() as u64;
        let keep = RESULT_HEAD.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..keep]);
        let room = self.cap - self.sent;
        let n = room.min(bytes.len() as u64) as usize;
        self.sent += n as u64;
        &bytes[..n]
    }

    fn dropped(&self) -> u64 {
        self.total - self.sent
    }
}

pub(super) fn build_command(req: &ExecRequest) -> Result<(Command, String), ExecError> {
    let (mut cmd, program) = match (&req.argv, &req.shell) {
        (Some(argv), None) if argv.first().is_some_and(|p| !p.is_empty()) => {
            let path = req.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
            let found =
                lookup::find_program(&argv[0], path).map_err(|source| ExecError::Spawn {
                    program: argv[0].clone(),
                    source,
                })?;
            let mut cmd = Command::new(found);
            // The program sees the name it was asked by (busybox picks its
            // applet by it, `ps` shows it).
            cmd.arg0(&argv[0]).args(&argv[1..]);
            (cmd, argv[0].clone())
        }
        (None, Some(line)) => {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c").arg(line);
            (cmd, "/bin/sh".to_owned())
        }
        _ => return Err(ExecError::Command),
    };
    let home = match req.uid {
        Some(uid) if uid != 0 => "/",
        _ => "/root",
    };
    cmd.env_clear().env("PATH", DEFAULT_PATH).env("HOME", home);
    for (key, value) in &req.env {
        if key.is_empty() || key.contains(['=', '\0']) {
            return Err(ExecError::EnvName(key.clone()));
        }
        cmd.env(key, value);
    }
    // Without a cwd the process inherits the agent's, `/` (main.rs): a
    // spawn with a directory change forks the agent (agent/lookup.rs).
    match &req.cwd {
        Some(dir) if !dir.starts_with('/') => return Err(ExecError::Cwd(dir.clone())),
        Some(dir) => {
            cmd.current_dir(dir);
        }
        None => {}
    }
    if let Some(uid) = req.uid {
        cmd.uid(uid);
    }
    if let Some(gid) = req.gid {
        cmd.gid(gid);
    }
    // On a pty, pty::attach gives it a session and the terminal instead.
    if req.pty.is_none() {
        cmd.process_group(0)
            .stdin(match req.stdin {
                StdinMode::None => Stdio::null(),
                StdinMode::Stream => Stdio::piped(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    Ok((cmd, program))
}

/// The command as text: the arguments joined by spaces, or the shell line.
pub(super) fn describe(req: &ExecRequest) -> String {
    match (&req.argv, &req.shell) {
        (Some(argv), _) => argv.join(" "),
        (None, Some(line)) => line.clone(),
        (None, None) => String::new(),
    }
}

/// Runs an exec on this connection: `started`, output frames, `exited`.
pub fn run(conn: &mut Conn, state: &State, req: ExecRequest) -> Result<(), ExecError> {
    let cap = req.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
    if cap > MAX_OUTPUT_CAP {
        return Err(ExecError::OutputCap(cap));
    }
    if req.timeout_ms == Some(0) {
        return Err(ExecError::ZeroTimeout);
    }
    let (mut cmd, program) = build_command(&req)?;
    let master = match req.pty {
        Some(size) => Some(pty::attach(&mut cmd, size).map_err(ExecError::Pty)?),
        None => None,
    };
    let exec_id = state
        .registry
        .reserve(req.id.clone())
        .map_err(ExecError::Id)?;

    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let exit_slot: Arc<Mutex<Option<ExitSeen>>> = Arc::default();
    let on_exit = {
        let (slot, tx) = (exit_slot.clone(), tx.clone());
        Box::new(move |status| {
            let seen = ExitSeen {
                status,
                at: Instant::now(),
            };
            *lock(&slot) = Some(seen);
            // A full queue is fine: the exec checks the slot after each event.
            let _ = tx.try_send(Event::Exited);
        })
    };
    let start = Instant::now();
    let mut child = match state.reaper.spawn(&mut cmd, on_exit) {
        Ok(child) => child,
        Err(source) => {
            state.registry.release(&exec_id);
            return Err(ExecError::Spawn { program, source });
        }
    };
    // The command holds the pty's slave side: the master sees EIO at the
    // end only once every holder has closed it.
    drop(cmd);
    let pid = child.id();
    state.registry.set_pid(&exec_id, pid);

    let streams = match master {
        Some(master) => Streams::Terminal(master),
        None => Streams::Pipes(child.stdout.take(), child.stderr.take(), child.stdin.take()),
    };
    let expected_eofs = streams.outputs();
    let started = start_pumps(conn, streams, &tx);
    drop(tx);
    if let Err(e) = started {
        let _ = kill_group(pid, libc::SIGKILL);
        state.registry.release(&exec_id);
        return Err(e);
    }

    let mut outputs = [
        Output::new(FrameKind::Stdout, cap),
        Output::new(FrameKind::Stderr, cap),
    ];
    let mut client = conn
        .send(&Response::Started {
            exec_id: exec_id.clone(),
            pid,
        })
        .is_ok();
    let timed_out = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    // A deadline past what Instant can hold is no deadline.
    let deadline = req
        .timeout_ms
        .and_then(|ms| start.checked_add(Duration::from_millis(ms)));
    let watchdog = match deadline {
        Some(deadline) => {
            let (slot, done, flag) = (exit_slot.clone(), done.clone(), timed_out.clone());
            let watch = move || watch(deadline, pid, &slot, &done, &flag);
            match spawn_thread("exec-timeout", PUMP_STACK, watch) {
                Ok(handle) => Some(handle),
                Err(e) => {
                    let _ = kill_group(pid, libc::SIGKILL);
                    log!("exec {exec_id}: no timeout thread ({e}); killed it");
                    None
                }
            }
        }
        None => None,
    };
    let mut exit: Option<ExitSeen> = None;
    let mut eofs = 0;
    loop {
        if exit.is_none() {
            exit = *lock(&exit_slot);
        }
        if let Some(seen) = &exit {
            if eofs == expected_eofs || seen.at.elapsed() > POST_EXIT_MAX {
                break;
            }
        }
        let wait = match exit {
            Some(_) => POST_EXIT_IDLE,
            None => Duration::from_secs(1),
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Output(i, bytes)) => {
                let part = outputs[i].take(&bytes);
                if client && !part.is_empty() && conn.send_frame(outputs[i].kind, part).is_err() {
                    if state.config.verbose {
                        log!("exec {exec_id}: client gone; the process keeps running");
                    }
                    client = false;
                }
            }
            Ok(Event::Eof) => eofs += 1,
            Ok(Event::Exited) => {}
            Err(RecvTimeoutError::Timeout) if exit.is_some() => break,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                exit = exit.or(*lock(&exit_slot));
                break;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    if let Some(handle) = watchdog {
        handle.thread().unpark();
    }

    let (code, signal) = exit
        .as_ref()
        .map_or((None, None), |e| decode_status(e.status));
    let end = exit.map_or_else(Instant::now, |e| e.at);
    let [stdout, stderr] = outputs;
    let exited = Exited {
        exec_id,
        code,
        signal,
        timed_out: timed_out.load(Ordering::SeqCst),
        wall_ms: end.duration_since(start).as_millis() as u64,
        stdout_bytes: stdout.total,
        stderr_bytes: stderr.total,
        stdout_dropped: stdout.dropped(),
        stderr_dropped: stderr.dropped(),
        stdout_head: None,
        stderr_head: None,
    };
    state
        .registry
        .finish(exited.clone(), stdout.head, stderr.head);
    if client {
        let _ = conn.send(&Response::Exited(exited));
    }
    // Also ends the stdin thread, which may be waiting for a frame.
    conn.shutdown(Shutdown::Both);
    Ok(())
}

/// Where an exec's output comes from and its input goes.
enum Streams {
    Pipes(
        Option<std::process::ChildStdout>,
        Option<std::process::ChildStderr>,
        Option<ChildStdin>,
    ),
    Terminal(pty::Master),
}

impl Streams {
    /// Output streams whose end the exec waits for.
    fn outputs(&self) -> usize {
        match self {
            Self::Pipes(..) => 2,
            Self::Terminal(_) => 1,
        }
    }
}

fn start_pumps(conn: &Conn, streams: Streams, tx: &SyncSender<Event>) -> Result<(), ExecError> {
    let (stdout, stderr, stdin) = match streams {
        Streams::Pipes(stdout, stderr, stdin) => (stdout, stderr, stdin),
        Streams::Terminal(master) => {
            let input = master.try_clone().map_err(ExecError::Thread)?;
            let reader = conn.try_clone().map_err(ExecError::Thread)?;
            reader.set_read_timeout(None).map_err(ExecError::Thread)?;
            spawn_thread("exec-pty-in", PUMP_STACK, move || {
                pty::pump_input(reader, input)
            })
            .map_err(ExecError::Thread)?;
            let output = master.into_reader();
            let tx = tx.clone();
            spawn_thread("exec-pty-out", PUMP_STACK, move || pump(output, 0, &tx))
                .map_err(ExecError::Thread)?;
            return Ok(());
        }
    };
    if let Some(out) = stdout {
        let tx = tx.clone();
        spawn_thread("exec-stdout", PUMP_STACK, move || pump(out, 0, &tx))
            .map_err(ExecError::Thread)?;
    }
    if let Some(err) = stderr {
        let tx = tx.clone();
        spawn_thread("exec-stderr", PUMP_STACK, move || pump(err, 1, &tx))
            .map_err(ExecError::Thread)?;
    }
    if let Some(stdin) = stdin {
        // Stdin frames come whenever the client has them: no idle limit
        // (the exec's own timeout bounds it).
        let reader = conn.try_clone().map_err(ExecError::Thread)?;
        reader.set_read_timeout(None).map_err(ExecError::Thread)?;
        spawn_thread("exec-stdin", PUMP_STACK, move || pump_stdin(reader, stdin))
            .map_err(ExecError::Thread)?;
    }
    Ok(())
}

fn lock(slot: &Mutex<Option<ExitSeen>>) -> MutexGuard<'_, Option<ExitSeen>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills the process group at `deadline` unless the process has exited
/// (the exec unparks this thread when it ends).
fn watch(
    deadline: Instant,
    pgid: u32,
    exit: &Mutex<Option<ExitSeen>>,
    done: &AtomicBool,
    timed_out: &AtomicBool,
) {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::park_timeout(left);
        if done.load(Ordering::SeqCst) {
            return;
        }
    }
    let exit = lock(exit);
    if exit.is_none() && !done.load(Ordering::SeqCst) {
        timed_out.store(true, Ordering::SeqCst);
        if let Err(e) = kill_group(pgid, libc::SIGKILL) {
            log!("timeout: killing process group {pgid}: {e}");
        }
    }
}

/// Pipe to queue, in chunks of up to 64 KiB.
fn pump(mut pipe: impl Read, index: usize, tx: &SyncSender<Event>) {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if tx.send(Event::Output(index, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = tx.send(Event::Eof);
}

/// Kind-4 frames to the child's stdin; an empty one (or the client
/// leaving) closes it. Input the child no longer reads is discarded.
fn pump_stdin(mut conn: Conn, stdin: ChildStdin) {
    let mut stdin = Some(stdin);
    loop {
        match conn.read_frame() {
            Ok(Some(f)) if f.kind == FrameKind::Stdin => {
                if f.payload.is_empty() {
                    return;
                }
                if let Some(pipe) = stdin.as_mut() {
                    if pipe.write_all(&f.payload).is_err() {
                        stdin = None;
                    }
                }
            }
            Ok(Some(f)) => {
                log!("exec stdin: unexpected {:?} frame; closing stdin", f.kind);
                return;
            }
            Ok(None) | Err(_) => return,
        }
    }
}

pub(super) fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    // Never 0 or 1: kill(0) and kill(-1) would signal the agent's own group
    // or every process.
    let pgid = libc::pid_t::try_from(pgid)
        .ok()
        .filter(|&p| p > 1)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill only sends a signal; a negative pid names the process group.
    if unsafe { libc::kill(-pgid, signal) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("SYS", libc::SIGSYS),
];

/// A signal number from a number (1-64) or a name with or without `SIG`.
pub fn parse_signal(spec: &SignalSpec) -> Option<i32> {
    let n = match spec {
        SignalSpec::Number(n) => *n,
        SignalSpec::Name(name) => {
            let upper = name.trim().to_ascii_uppercase();
            let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
            match bare.parse::<i32>() {
                Ok(n) => n,
                Err(_) => SIGNALS.iter().find(|(s, _)| *s == bare)?.1,
            }
        }
    };
    (1..=64).contains(&n).then_some(n)
}

/// `signal`: signals a running exec's process group.
pub fn signal(state: &State, exec_id: &str, spec: &SignalSpec) -> Result<(), ExecError> {
    let sig = parse_signal(spec).ok_or_else(|| ExecError::BadSignal(format!("{spec:?}")))?;
    match state.registry.lookup(exec_id) {
        Lookup::Running(pid) if pid > 1 => kill_group(pid, sig).map_err(|source| {
            if source.raw_os_error() == Some(libc::ESRCH) {
                ExecError::NotRunning(exec_id.to_owned())
            } else {
                ExecError::Kill { pgid: pid, source }
            }
        }),
        _ => Err(ExecError::NotRunning(exec_id.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_number_and_name() {
        assert_eq!(parse_signal(&SignalSpec::Number(9)), Some(9));
        assert_eq!(parse_signal(&"TERM".into()), Some(libc::SIGTERM));
        assert_eq!(parse_signal(&"sigkill".into()), Some(libc::SIGKILL));
        assert_eq!(parse_signal(&"15".into()), Some(15));
        assert_eq!(parse_signal(&SignalSpec::Number(0)), None);
        assert_eq!(parse_signal(&"NOPE".into()), None);
    }

    #[test]
    fn output_past_the_cap_is_counted_not_sent() {
        let mut out = Output::new(FrameKind::Stdout, 5);
        assert_eq!(out.take(b"abc"), b"abc");
        assert_eq!(out.take(b"defg"), b"de");
        assert_eq!(out.take(b"h"), b"");
        assert_eq!((out.total, out.dropped()), (8, 3));
        assert_eq!(out.head, b"abcdefgh");
    }

    #[test]
    fn commands_need_exactly_one_program() {
        let both = ExecRequest {
            argv: Some(vec!["ls".into()]),
            shell: Some("ls".into()),
            ..ExecRequest::default()
        };
        assert!(matches!(build_command(&both), Err(ExecError::Command)));
        let empty = ExecRequest::argv(Vec::<String>::new());
        assert!(matches!(build_command(&empty), Err(ExecError::Command)));
        let bad_env = ExecRequest::shell("true").env("A=B", "c");
        assert!(matches!(
            build_command(&bad_env),
            Err(ExecError::EnvName(_))
        ));
        let rel = ExecRequest::shell("true").cwd("tmp");
        assert!(matches!(build_command(&rel), Err(ExecError::Cwd(_))));
    }
}
