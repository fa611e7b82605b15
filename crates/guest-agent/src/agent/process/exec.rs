//! `exec` and `signal`.
//!
//! An exec runs in its own process group. Its connection thread polls the
//! process's outputs and forwards them as they arrive (a slow client slows
//! the process down rather than filling memory), enforces the timeout, and
//! reports the exit status the reaper routes to it. If the client goes
//! away the process keeps running until it ends or times out; its output
//! is then only counted, and its result kept for `result`.

use std::fs::File;
use std::io::{self, Write};
use std::net::Shutdown;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guest_agent::frame::FrameKind;
use guest_agent::protocol::{
    AgentErrorCode, ExecCall, ExecExit, Response, SignalSpec, StdinMode, DEFAULT_OUTPUT_CAP,
    MAX_OUTPUT_CAP, OUTPUT_CHUNK, RESULT_HEAD, UNCAPPED_OUTPUT,
};

use super::lookup;
use super::poller;
use super::pty;
use super::reaper::decode_status;
use super::registry::{Lookup, ProcessTableError};
use super::root::{read_inside, ExecRoot, RootError};
use super::spawn::{Input, Spawn};
use crate::agent::conn::Conn;
use crate::agent::{spawn_thread, AgentState};

/// PATH of every exec unless its `env` sets one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// After the process exits, output still arriving is forwarded until the
/// pipes close, or nothing came for this long (a background process
/// holding them open), or [`POST_EXIT_MAX`] has passed.
const POST_EXIT_IDLE: Duration = Duration::from_millis(500);
const POST_EXIT_MAX: Duration = Duration::from_secs(30);
/// Stack of the input threads (their buffer is on the heap).
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
    /// `user` names no user or group of the guest.
    #[error("cannot run as `{user}`")]
    User {
        /// The user asked for.
        user: String,
        /// Why it did not resolve.
        #[source]
        source: guest_agent::users::UserError,
    },
    /// `root` cannot be used.
    #[error("exec root")]
    Root(#[source] RootError),
    /// `output_cap` over the limit.
    #[error("output_cap {0} is over the {MAX_OUTPUT_CAP}-byte limit")]
    OutputCap(u64),
    /// `timeout_ms` of 0.
    #[error("timeout_ms must be at least 1")]
    ZeroTimeout,
    /// The exec id could not be taken.
    #[error("exec id")]
    Id(#[source] ProcessTableError),
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
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Command
            | Self::EnvName(_)
            | Self::Cwd(_)
            | Self::User { .. }
            | Self::ZeroTimeout
            | Self::BadSignal(_) => AgentErrorCode::InvalidInput,
            Self::Root(RootError::MountPoint { source, .. }) => {
                AgentErrorCode::from_io(source.kind())
            }
            Self::Root(_) => AgentErrorCode::InvalidInput,
            Self::OutputCap(_) => AgentErrorCode::TooLarge,
            Self::Id(e) => e.code(),
            Self::Spawn { source, .. } | Self::Kill { source, .. } => {
                AgentErrorCode::from_io(source.kind())
            }
            Self::Thread(_) | Self::Pty(_) => AgentErrorCode::Internal,
            Self::NotRunning(_) => AgentErrorCode::NotFound,
        }
    }
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

pub(super) fn build_command(req: &ExecCall) -> Result<(Spawn, String), ExecError> {
    let root = match &req.root {
        Some(dir) => Some(ExecRoot::prepare(dir).map_err(ExecError::Root)?),
        None => None,
    };
    let (mut cmd, program) = match (&req.argv, &req.shell) {
        (Some(argv), None) if argv.first().is_some_and(|p| !p.is_empty()) => {
            let path = req.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
            let found = lookup::find_program(&argv[0], path, root.as_ref().map(ExecRoot::dir))
                .map_err(|source| ExecError::Spawn {
                    program: argv[0].clone(),
                    source,
                })?;
            // The program sees the name it was asked by (busybox picks its
            // applet by it, `ps` shows it).
            let mut cmd = Spawn::new(&found, &argv[0]);
            for arg in &argv[1..] {
                cmd.arg(arg);
            }
            (cmd, argv[0].clone())
        }
        (None, Some(line)) => {
            let mut cmd = Spawn::new(Path::new("/bin/sh"), "/bin/sh");
            cmd.arg("-c").arg(line);
            (cmd, "/bin/sh".to_owned())
        }
        _ => return Err(ExecError::Command),
    };
    let named = match &req.user {
        Some(user) => Some(resolve_user(user, root.as_ref())?),
        None => None,
    };
    let (uid, gid) = match &named {
        Some(found) => (Some(found.uid), Some(found.gid)),
        None => (req.uid, req.gid),
    };
    // HOME is the user's home in /etc/passwd (`/` when unlisted, `/root`
    // for root by default); the request's env may set another.
    let home = match (&named, uid) {
        (Some(found), _) => found.home.clone().unwrap_or_else(|| "/".into()),
        (None, Some(uid)) if uid != 0 => {
            passwd_home(uid, root.as_ref()).unwrap_or_else(|| "/".into())
        }
        _ => "/root".into(),
    };
    cmd.env("PATH", DEFAULT_PATH).env("HOME", &home);
    for (key, value) in &req.env {
        if key.is_empty() || key.contains(['=', '\0']) {
            return Err(ExecError::EnvName(key.clone()));
        }
        cmd.env(key, value);
    }
    // Without a cwd the process inherits the agent's, `/` (main.rs).
    match &req.cwd {
        Some(dir) if !dir.starts_with('/') => return Err(ExecError::Cwd(dir.clone())),
        Some(dir) => {
            cmd.cwd(dir);
        }
        None => {}
    }
    if let Some(uid) = uid {
        cmd.uid(uid);
    }
    if let Some(gid) = gid {
        cmd.gid(gid);
    }
    // It leads a new process group, its outputs are pipes; on a pty,
    // pty::attach gives it a session and the terminal instead.
    if req.stdin == StdinMode::Stream {
        cmd.stdin(Input::Piped);
    }
    if let Some(root) = &root {
        cmd.root(root.dir());
    }
    Ok((cmd, program))
}

/// The home directory /etc/passwd (the root's) gives `uid`.
fn passwd_home(uid: u32, root: Option<&ExecRoot>) -> Option<String> {
    let passwd = read_inside(root, "/etc/passwd");
    guest_agent::users::resolve(&uid.to_string(), &passwd, "")
        .ok()?
        .home
}

/// `user` resolved in /etc/passwd and /etc/group (the root's).
fn resolve_user(
    user: &str,
    root: Option<&ExecRoot>,
) -> Result<guest_agent::users::ResolvedUser, ExecError> {
    let passwd = read_inside(root, "/etc/passwd");
    let group = read_inside(root, "/etc/group");
    guest_agent::users::resolve(user, &passwd, &group).map_err(|source| ExecError::User {
        user: user.to_owned(),
        source,
    })
}

/// The command as text: the arguments joined by spaces, or the shell line.
pub(super) fn describe(req: &ExecCall) -> String {
    match (&req.argv, &req.shell) {
        (Some(argv), _) => argv.join(" "),
        (None, Some(line)) => line.clone(),
        (None, None) => String::new(),
    }
}

/// Runs an exec on this connection: `started`, output frames, `exited`.
pub fn run(conn: &mut Conn, state: &AgentState, req: ExecCall) -> Result<(), ExecError> {
    let cap = req.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
    if cap > MAX_OUTPUT_CAP && cap != UNCAPPED_OUTPUT {
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
    let wake = match poller::Wake::new() {
        Ok(wake) => Arc::new(wake),
        Err(e) => {
            state.registry.release(&exec_id);
            return Err(ExecError::Thread(e));
        }
    };

    let exit_slot: Arc<Mutex<Option<ExitSeen>>> = Arc::default();
    let on_exit = {
        let (slot, wake) = (exit_slot.clone(), wake.clone());
        Box::new(move |status| {
            let seen = ExitSeen {
                status,
                at: Instant::now(),
            };
            *lock(&slot) = Some(seen);
            wake.signal();
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
    // Spawning closed our copies of the pty's slave side: the master sees
    // EIO at the end once the process and its descendants have closed it.
    drop(cmd);
    let pid = child.pid;
    state.registry.set_pid(&exec_id, pid);

    let streams = match master {
        Some(master) => Streams::Terminal(master),
        None => Streams::Pipes(child.stdout.take(), child.stderr.take(), child.stdin.take()),
    };
    let sources = match start_input(conn, streams) {
        Ok(sources) => sources,
        Err(e) => {
            let _ = kill_group(pid, libc::SIGKILL);
            state.registry.release(&exec_id);
            return Err(e);
        }
    };

    let client = conn
        .send(&Response::Started {
            exec_id: exec_id.clone(),
            pid,
        })
        .is_ok();
    // A deadline past what Instant can hold is no deadline.
    let deadline = req
        .timeout_ms
        .and_then(|ms| start.checked_add(Duration::from_millis(ms)));
    let mut forward = Forward {
        conn,
        client,
        outputs: [
            Output::new(FrameKind::Stdout, cap),
            Output::new(FrameKind::Stderr, cap),
        ],
        verbose: state.config.verbose,
        exec_id: &exec_id,
    };
    let ended = follow(
        &mut forward,
        sources,
        &wake,
        &exit_slot,
        deadline.map(|at| (at, pid)),
    );

    let (code, signal) = ended
        .exit
        .as_ref()
        .map_or((None, None), |e| decode_status(e.status));
    let end = ended.exit.map_or_else(Instant::now, |e| e.at);
    let Forward {
        conn,
        client,
        outputs: [stdout, stderr],
        ..
    } = forward;
    let exited = ExecExit {
        exec_id: exec_id.clone(),
        code,
        signal,
        timed_out: ended.timed_out,
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

/// Output on its way to the client.
struct Forward<'a> {
    conn: &'a mut Conn,
    /// Still there: a client that went away gets nothing more, and the
    /// process keeps running (its output only counted).
    client: bool,
    outputs: [Output; 2],
    verbose: bool,
    exec_id: &'a str,
}

impl Forward<'_> {
    fn output(&mut self, index: usize, bytes: &[u8]) {
        let out = &mut self.outputs[index];
        let part = out.take(bytes);
        if self.client && !part.is_empty() && self.conn.send_frame(out.kind, part).is_err() {
            if self.verbose {
                log!(
                    "exec {}: client gone; the process keeps running",
                    self.exec_id
                );
            }
            self.client = false;
        }
    }
}

/// How the exec's wait ended.
struct Ended {
    exit: Option<ExitSeen>,
    timed_out: bool,
}

/// Forwards output until the process has exited and its outputs have
/// closed (or stayed silent for [`POST_EXIT_IDLE`], held open by a
/// background process, or [`POST_EXIT_MAX`] has passed), killing its group
/// at the deadline. All in this thread: a thread costs the emulated guest
/// kernel a clone, a stack mapping and its page faults.
fn follow(
    forward: &mut Forward<'_>,
    mut sources: Vec<poller::Source>,
    wake: &poller::Wake,
    exit_slot: &Mutex<Option<ExitSeen>>,
    mut deadline: Option<(Instant, u32)>,
) -> Ended {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    let mut exit: Option<ExitSeen> = None;
    let mut timed_out = false;
    loop {
        if exit.is_none() {
            exit = *lock(exit_slot);
        }
        if let Some(seen) = &exit {
            if sources.is_empty() || seen.at.elapsed() > POST_EXIT_MAX {
                break;
            }
        }
        let mut wait = None;
        if let (None, Some((at, pgid))) = (&exit, deadline) {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                timed_out = true;
                deadline = None;
                if let Err(e) = kill_group(pgid, libc::SIGKILL) {
                    log!("timeout: killing process group {pgid}: {e}");
                }
            } else {
                wait = Some(left);
            }
        }
        if exit.is_some() {
            wait = Some(POST_EXIT_IDLE);
        }
        let ready = match poller::wait(&sources, exit.is_none().then_some(wake), wait) {
            Ok(ready) => ready,
            Err(e) => {
                log!("exec {}: poll failed ({e}); output ends", forward.exec_id);
                sources.clear();
                continue;
            }
        };
        if ready.timed_out && exit.is_some() {
            break;
        }
        if ready.woken {
            wake.clear();
        }
        let mut closed = Vec::new();
        for i in ready.sources {
            match sources[i].read(&mut buf) {
                Ok(Some(0)) | Err(_) => closed.push(i),
                Ok(Some(n)) => forward.output(sources[i].index, &buf[..n]),
                Ok(None) => {}
            }
        }
        for i in closed.into_iter().rev() {
            sources.remove(i);
        }
    }
    if exit.is_none() {
        exit = *lock(exit_slot);
    }
    Ended { exit, timed_out }
}

/// Where an exec's output comes from and its input goes.
enum Streams {
    Pipes(Option<File>, Option<File>, Option<File>),
    Terminal(pty::Master),
}

/// Starts the thread that takes the client's input, if the exec has any,
/// and returns the outputs to follow.
fn start_input(conn: &mut Conn, streams: Streams) -> Result<Vec<poller::Source>, ExecError> {
    let (stdout, stderr, stdin) = match streams {
        Streams::Pipes(stdout, stderr, stdin) => (stdout, stderr, stdin),
        Streams::Terminal(master) => {
            let input = master.try_clone().map_err(ExecError::Thread)?;
            let reader = conn.split_reader().map_err(ExecError::Thread)?;
            reader.set_read_timeout(None).map_err(ExecError::Thread)?;
            spawn_thread("exec-pty-in", PUMP_STACK, move || {
                pty::pump_input(reader, input)
            })
            .map_err(ExecError::Thread)?;
            return Ok(vec![poller::Source::new(master.into_reader(), 0)]);
        }
    };
    if let Some(stdin) = stdin {
        // Stdin frames come whenever the client has them: no idle limit
        // (the exec's own timeout bounds it).
        let reader = conn.split_reader().map_err(ExecError::Thread)?;
        reader.set_read_timeout(None).map_err(ExecError::Thread)?;
        spawn_thread("exec-stdin", PUMP_STACK, move || pump_stdin(reader, stdin))
            .map_err(ExecError::Thread)?;
    }
    let mut sources = Vec::with_capacity(2);
    if let Some(out) = stdout {
        sources.push(poller::Source::new(out, 0));
    }
    if let Some(err) = stderr {
        sources.push(poller::Source::new(err, 1));
    }
    Ok(sources)
}

fn lock(slot: &Mutex<Option<ExitSeen>>) -> MutexGuard<'_, Option<ExitSeen>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kind-4 frames to the child's stdin; an empty one (or the client
/// leaving) closes it. Input the child no longer reads is discarded.
fn pump_stdin(mut conn: Conn, stdin: File) {
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
pub fn signal(state: &AgentState, exec_id: &str, spec: &SignalSpec) -> Result<(), ExecError> {
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
    fn uncapped_output_is_all_sent() {
        let mut out = Output::new(FrameKind::Stdout, UNCAPPED_OUTPUT);
        let chunk = vec![7u8; OUTPUT_CHUNK];
        for _ in 0..4 {
            assert_eq!(out.take(&chunk).len(), OUTPUT_CHUNK);
        }
        assert_eq!(out.dropped(), 0);
    }

    #[test]
    fn commands_need_exactly_one_program() {
        let both = ExecCall {
            argv: Some(vec!["ls".into()]),
            shell: Some("ls".into()),
            ..ExecCall::default()
        };
        assert!(matches!(build_command(&both), Err(ExecError::Command)));
        let empty = ExecCall::argv(Vec::<String>::new());
        assert!(matches!(build_command(&empty), Err(ExecError::Command)));
        let bad_env = ExecCall::shell("true").env("A=B", "c");
        assert!(matches!(
            build_command(&bad_env),
            Err(ExecError::EnvName(_))
        ));
        let rel = ExecCall::shell("true").cwd("tmp");
        assert!(matches!(build_command(&rel), Err(ExecError::Cwd(_))));
    }
}
