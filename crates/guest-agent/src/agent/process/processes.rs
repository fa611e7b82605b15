//! Background processes: started by one connection, read, fed, signalled
//! and waited for by any later one.
//!
//! Each process has two reader threads that append its stdout and stderr
//! to bounded rings ([`Ring`]), the reaper's callback that records its
//! exit, and (with a timeout) a watchdog thread. Everything a request
//! needs is under the process's own lock, with a condition variable that
//! wakes long-polling readers and waiters on every change.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use guest_agent::frame::FrameKind;
use guest_agent::protocol::{
    AgentErrorCode, ExecCall, OutputAnswer, OutputChunk, ProcessEntry, ProcessRunState, SignalSpec,
    DEFAULT_PROCESS_RING, MAX_FINISHED_PROCESSES, MAX_PROCESS_COMMAND, MAX_PROCESS_READ,
    MAX_PROCESS_RING, MAX_PROCESS_STDIN, MAX_PROCESS_WAIT, MAX_RUNNING_PROCESSES, OUTPUT_CHUNK,
};

use super::exec::{build_command, describe, kill_group, parse_signal};
use super::reaper::{decode_status, Reaper};
use super::registry::valid_id;
use super::ring::Ring;
use crate::agent::conn::Conn;
use crate::agent::{spawn_thread, unix_ms};

/// How long `process_wait` waits, after the exit, for the output pipes
/// to drain.
const PIPE_DRAIN: Duration = Duration::from_millis(500);
/// Stack of the reader and watchdog threads (their buffers are on the heap).
const THREAD_STACK: usize = 64 << 10;

/// Why a process request failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process")]
    Command(#[source] super::exec::ExecError),
    #[error("process id {0:?} must be 1-128 characters of A-Z a-z 0-9 . _ : -")]
    BadId(String),
    #[error("a process with id {0:?} exists; remove it first or choose another id")]
    Exists(String),
    #[error("{MAX_RUNNING_PROCESSES} processes already run; wait for or signal one first")]
    Full,
    #[error("ring size {0} is over the {MAX_PROCESS_RING}-byte limit")]
    RingTooLarge(u64),
    #[error("timeout_ms must be at least 1")]
    ZeroTimeout,
    #[error("background processes run without a pty; use exec with pty for a terminal")]
    Pty,
    #[error("a wait of {0} ms is over the limit of {max} ms", max = MAX_PROCESS_WAIT.as_millis())]
    WaitTooLong(u64),
    #[error("no process {0:?} (never started, removed, or pushed out by newer ones)")]
    Unknown(String),
    #[error("process {0:?} still runs; signal it and wait for it first")]
    StillRunning(String),
    #[error("process {0:?} has no open stdin (start it with stdin \"stream\")")]
    NoStdin(String),
    #[error("stdin data is not base64")]
    Base64(#[source] base64::DecodeError),
    #[error("{0} bytes of stdin is over the {MAX_PROCESS_STDIN}-byte limit per request")]
    StdinTooLarge(usize),
    #[error("writing to the process's stdin")]
    Stdin(#[source] io::Error),
    #[error("unknown signal {0}")]
    BadSignal(String),
    #[error("signalling process group {pgid}")]
    Kill {
        pgid: u32,
        #[source]
        source: io::Error,
    },
    #[error("spawning {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("starting a process thread")]
    Thread(#[source] io::Error),
    #[error("sending the output")]
    Send(#[source] guest_agent::frame::FrameError),
}

impl ProcessError {
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Command(e) => e.code(),
            Self::BadId(_)
            | Self::ZeroTimeout
            | Self::Pty
            | Self::WaitTooLong(_)
            | Self::StillRunning(_)
            | Self::NoStdin(_)
            | Self::Base64(_)
            | Self::BadSignal(_) => AgentErrorCode::InvalidInput,
            Self::Exists(_) => AgentErrorCode::Exists,
            Self::Full | Self::RingTooLarge(_) | Self::StdinTooLarge(_) => AgentErrorCode::TooLarge,
            Self::Unknown(_) => AgentErrorCode::NotFound,
            Self::Stdin(e) | Self::Spawn { source: e, .. } | Self::Kill { source: e, .. } => {
                AgentErrorCode::from_io(e.kind())
            }
            Self::Thread(_) => AgentErrorCode::Internal,
            Self::Send(e) => e.code(),
        }
    }
}

struct Exit {
    status: i32,
    unix_ms: u64,
}

struct Live {
    out: [Ring; 2],
    eofs: u8,
    exit: Option<Exit>,
    stdin: Option<std::fs::File>,
    timed_out: bool,
}

/// One background process.
struct Proc {
    id: String,
    command: String,
    started_unix_ms: u64,
    ring_bytes: u64,
    pid: AtomicU32,
    live: Mutex<Live>,
    changed: Condvar,
}

impl Proc {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change` and wakes every waiter.
    fn update(&self, change: impl FnOnce(&mut Live)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits on `live` while `keep_waiting` holds, for at most `wait`.
    fn wait_while<'a>(
        &self,
        live: MutexGuard<'a, Live>,
        wait: Duration,
        keep_waiting: impl FnMut(&mut Live) -> bool,
    ) -> MutexGuard<'a, Live> {
        self.changed
            .wait_timeout_while(live, wait, keep_waiting)
            .map_or_else(|p| p.into_inner().0, |(guard, _)| guard)
    }

    fn info(&self, live: &Live) -> ProcessEntry {
        let (exit_code, signal) = live
            .exit
            .as_ref()
            .map_or((None, None), |e| decode_status(e.status));
        ProcessEntry {
            id: self.id.clone(),
            pid: self.pid.load(Ordering::SeqCst),
            command: self.command.clone(),
            state: match live.exit {
                Some(_) => ProcessRunState::Exited,
                None => ProcessRunState::Running,
            },
            started_unix_ms: self.started_unix_ms,
            ended_unix_ms: live.exit.as_ref().map(|e| e.unix_ms),
            exit_code,
            signal,
            timed_out: live.timed_out,
            stdout_bytes: live.out[0].total(),
            stderr_bytes: live.out[1].total(),
            stdin_open: live.stdin.is_some(),
            ring_bytes: self.ring_bytes,
        }
    }

    fn running(&self) -> bool {
        self.lock().exit.is_none()
    }
}

/// The agent's background processes, oldest first.
#[derive(Default)]
pub struct Processes {
    table: Mutex<Vec<Arc<Proc>>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Processes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Processes({})", self.lock().len())
    }
}

fn wait_limit(ms: u64) -> Result<Duration, ProcessError> {
    let wait = Duration::from_millis(ms);
    if wait > MAX_PROCESS_WAIT {
        return Err(ProcessError::WaitTooLong(ms));
    }
    Ok(wait)
}

impl Processes {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Proc>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, id: &str) -> Result<Arc<Proc>, ProcessError> {
        self.lock()
            .iter()
            .find(|p| p.id == id)
            .cloned()
            .ok_or_else(|| ProcessError::Unknown(id.to_owned()))
    }

    /// `process_start`: spawns the process and returns at once.
    pub fn start(&self, reaper: &Reaper, req: ExecCall) -> Result<ProcessEntry, ProcessError> {
        let ring_bytes = req.output_cap.unwrap_or(DEFAULT_PROCESS_RING);
        if ring_bytes > MAX_PROCESS_RING {
            return Err(ProcessError::RingTooLarge(ring_bytes));
        }
        if req.timeout_ms == Some(0) {
            return Err(ProcessError::ZeroTimeout);
        }
        if req.pty.is_some() {
            return Err(ProcessError::Pty);
        }
        let (mut cmd, program) = build_command(&req).map_err(ProcessError::Command)?;
        let mut command = describe(&req);
        if command.len() > MAX_PROCESS_COMMAND {
            let mut cut = MAX_PROCESS_COMMAND;
            while !command.is_char_boundary(cut) {
                cut -= 1;
            }
            command.truncate(cut);
            command.push_str("...");
        }
        let proc = {
            let mut table = self.lock();
            let id = match req.id.clone() {
                Some(id) if !valid_id(&id) => return Err(ProcessError::BadId(id)),
                Some(id) if table.iter().any(|p| p.id == id) => {
                    return Err(ProcessError::Exists(id))
                }
                Some(id) => id,
                None => loop {
                    let id = format!("proc-{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
                    if !table.iter().any(|p| p.id == id) {
                        break id;
                    }
                },
            };
            if table.iter().filter(|p| p.running()).count() >= MAX_RUNNING_PROCESSES {
                return Err(ProcessError::Full);
            }
            let cap = ring_bytes as usize;
            let proc = Arc::new(Proc {
                id,
                command,
                started_unix_ms: unix_ms(),
                ring_bytes,
                pid: AtomicU32::new(0),
                live: Mutex::new(Live {
                    out: [Ring::new(cap), Ring::new(cap)],
                    eofs: 0,
                    exit: None,
                    stdin: None,
                    timed_out: false,
                }),
                changed: Condvar::new(),
            });
            table.push(proc.clone());
            proc
        };
        match self.spawn(reaper, &mut cmd, &proc, req.timeout_ms) {
            Ok(()) => {
                self.prune();
                Ok(proc.info(&proc.lock()))
            }
            Err(e) => {
                self.lock().retain(|p| !Arc::ptr_eq(p, &proc));
                Err(match e {
                    SpawnFailure::Spawn(source) => ProcessError::Spawn { program, source },
                    SpawnFailure::Thread(e) => ProcessError::Thread(e),
                })
            }
        }
    }

    fn spawn(
        &self,
        reaper: &Reaper,
        cmd: &mut super::spawn::Spawn,
        proc: &Arc<Proc>,
        timeout_ms: Option<u64>,
    ) -> Result<(), SpawnFailure> {
        let on_exit = {
            let proc = proc.clone();
            Box::new(move |status| {
                proc.update(|live| {
                    live.exit = Some(Exit {
                        status,
                        unix_ms: unix_ms(),
                    });
                    // Nobody can write to a process that is gone.
                    live.stdin = None;
                });
            })
        };
        let mut child = reaper.spawn(cmd, on_exit).map_err(SpawnFailure::Spawn)?;
        let pid = child.pid;
        proc.pid.store(pid, Ordering::SeqCst);
        let stdin = child.stdin.take();
        proc.update(|live| {
            // The exit may already have been recorded (a process that ended at once).
            if live.exit.is_none() {
                live.stdin = stdin;
            }
        });
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|p| Box::new(p) as _),
            child.stderr.take().map(|p| Box::new(p) as _),
        ];
        let started = (|| {
            for (index, pipe) in pipes.into_iter().enumerate() {
                let Some(pipe) = pipe else { continue };
                let proc = proc.clone();
                spawn_thread("proc-output", THREAD_STACK, move || {
                    pump(pipe, index, &proc)
                })?;
            }
            if let Some(deadline) =
                timeout_ms.and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)))
            {
                let proc = proc.clone();
                spawn_thread("proc-timeout", THREAD_STACK, move || watch(deadline, &proc))?;
            }
            Ok(())
        })();
        if let Err(e) = started {
            let _ = kill_group(pid, libc::SIGKILL);
            return Err(SpawnFailure::Thread(e));
        }
        Ok(())
    }

    /// Drops the oldest finished processes beyond the number kept.
    fn prune(&self) {
        let mut table = self.lock();
        let mut finished = table.iter().filter(|p| !p.running()).count();
        table.retain(|p| {
            if finished > MAX_FINISHED_PROCESSES && !p.running() {
                finished -= 1;
                false
            } else {
                true
            }
        });
    }

    /// `process_list`.
    pub fn list(&self) -> Vec<ProcessEntry> {
        self.prune();
        let table = self.lock().clone();
        table.iter().map(|p| p.info(&p.lock())).collect()
    }

    /// `process_output`: the answer, then the bytes in kind-2/3 frames.
    pub fn output(
        &self,
        conn: &mut Conn,
        id: &str,
        cursors: [u64; 2],
        max_bytes: Option<u64>,
        wait_ms: Option<u64>,
    ) -> Result<(), ProcessError> {
        let wait = wait_limit(wait_ms.unwrap_or(0))?;
        let max = max_bytes.unwrap_or(MAX_PROCESS_READ).min(MAX_PROCESS_READ) as usize;
        let proc = self.find(id)?;
        let live = proc.lock();
        let exited_before = live.exit.is_some();
        // Wait for output, the end of both streams, or the exit.
        let live = proc.wait_while(live, wait, |l| {
            !l.out[0].has_after(cursors[0])
                && !l.out[1].has_after(cursors[1])
                && l.eofs < 2
                && l.exit.is_some() == exited_before
        });
        let reads = [
            live.out[0].read(cursors[0], max),
            live.out[1].read(cursors[1], max),
        ];
        let chunk = |r: &super::ring::Read| OutputChunk {
            cursor: r.cursor,
            len: r.bytes.len() as u64,
            next_cursor: r.cursor + r.bytes.len() as u64,
            dropped: r.dropped,
        };
        let answer = OutputAnswer {
            process: proc.info(&live),
            stdout: chunk(&reads[0]),
            stderr: chunk(&reads[1]),
            eof: live.eofs >= 2,
        };
        drop(live);
        conn.send(&guest_agent::protocol::Response::ProcessOutput(answer))
            .map_err(ProcessError::Send)?;
        for (read, kind) in reads.iter().zip([FrameKind::Stdout, FrameKind::Stderr]) {
            for part in read.bytes.chunks(OUTPUT_CHUNK) {
                conn.send_frame(kind, part).map_err(ProcessError::Send)?;
            }
        }
        Ok(())
    }

    /// `process_stdin`: writes `data` (base64), then closes stdin if asked;
    /// returns the bytes written.
    pub fn stdin(&self, id: &str, data: &str, close: bool) -> Result<u64, ProcessError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(ProcessError::Base64)?;
        if bytes.len() > MAX_PROCESS_STDIN {
            return Err(ProcessError::StdinTooLarge(bytes.len()));
        }
        let proc = self.find(id)?;
        // Taken out of the lock: a full pipe must not block readers of the
        // process's output.
        let mut pipe = proc
            .lock()
            .stdin
            .take()
            .ok_or_else(|| ProcessError::NoStdin(id.to_owned()))?;
        let written = pipe.write_all(&bytes);
        if !close && written.is_ok() {
            proc.update(|live| {
                if live.exit.is_none() {
                    live.stdin = Some(pipe);
                }
            });
        } else {
            proc.changed.notify_all();
        }
        written.map_err(ProcessError::Stdin)?;
        Ok(bytes.len() as u64)
    }

    /// `process_signal`.
    pub fn signal(&self, id: &str, spec: &SignalSpec) -> Result<(), ProcessError> {
        let sig = parse_signal(spec).ok_or_else(|| ProcessError::BadSignal(format!("{spec:?}")))?;
        let proc = self.find(id)?;
        let live = proc.lock();
        if live.exit.is_some() {
            return Err(ProcessError::Unknown(format!("{id} (it has exited)")));
        }
        let pgid = proc.pid.load(Ordering::SeqCst);
        kill_group(pgid, sig).map_err(|source| ProcessError::Kill { pgid, source })
    }

    /// `process_wait`: the process once it exits, or as it is after `timeout_ms`.
    pub fn wait(&self, id: &str, timeout_ms: u64) -> Result<ProcessEntry, ProcessError> {
        let wait = wait_limit(timeout_ms)?;
        let proc = self.find(id)?;
        let until = Instant::now() + wait;
        let mut live = proc.wait_while(proc.lock(), wait, |l| l.exit.is_none());
        if live.exit.is_some() {
            // Output still in the pipes when it exited is in the rings by
            // the time the answer says "exited" (unless a child it left
            // behind keeps the pipes open).
            let left = until.saturating_duration_since(Instant::now());
            live = proc.wait_while(live, left.min(PIPE_DRAIN), |l| l.eofs < 2);
        }
        Ok(proc.info(&live))
    }

    /// `process_remove`: forgets a finished process.
    pub fn remove(&self, id: &str) -> Result<(), ProcessError> {
        let mut table = self.lock();
        let at = table
            .iter()
            .position(|p| p.id == id)
            .ok_or_else(|| ProcessError::Unknown(id.to_owned()))?;
        if table[at].running() {
            return Err(ProcessError::StillRunning(id.to_owned()));
        }
        table.remove(at);
        Ok(())
    }
}

enum SpawnFailure {
    Spawn(io::Error),
    Thread(io::Error),
}

/// Pipe to ring until end of file.
fn pump(mut pipe: Box<dyn Read + Send>, index: usize, proc: &Proc) {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => proc.update(|live| live.out[index].push(&buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    proc.update(|live| live.eofs += 1);
}

/// Kills the process group at `deadline` unless the process exited first.
fn watch(deadline: Instant, proc: &Proc) {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut live = proc.wait_while(proc.lock(), left, |l| l.exit.is_none());
    // Spurious or early wakeups end the wait only when the process exited.
    while live.exit.is_none() && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        live = proc.wait_while(live, left, |l| l.exit.is_none());
    }
    if live.exit.is_none() {
        live.timed_out = true;
        let pgid = proc.pid.load(Ordering::SeqCst);
        if let Err(e) = kill_group(pgid, libc::SIGKILL) {
            log!(
                "process {}: killing process group {pgid} at its timeout: {e}",
                proc.id
            );
        }
    }
}
