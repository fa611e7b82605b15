//! Background processes in a workspace: started and returned from at once,
//! then listed, read from byte cursors, fed stdin, signalled, waited for
//! and removed by any later caller (another CLI run, a restarted MCP
//! server), since the guest agent keeps them and their output.

use std::time::Duration;

use guest_agent::protocol::{self as wire, SignalSpec, StdinMode};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::guest::request::ExecRequest;
use crate::secrets::SecretMask;
use crate::workspaces::handle::Workspace;
use base::store::events::EventKind;

pub use wire::{
    DEFAULT_PROCESS_RING, MAX_FINISHED_PROCESSES, MAX_PROCESS_READ, MAX_PROCESS_RING,
    MAX_RUNNING_PROCESSES,
};

/// Longest wait one agent request may carry; longer waits are several.
const AGENT_MAX_WAIT: Duration = wire::MAX_PROCESS_WAIT;

/// How a background process starts, beyond its command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessOptions {
    /// Keep its stdin a pipe for [`WorkspaceProcesses::process_write_stdin`]
    /// (otherwise it reads /dev/null).
    pub stdin: bool,
    /// Bytes of each output stream kept (default 1 MiB, at most 16 MiB);
    /// older output is dropped, and readers are told how much.
    pub ring_bytes: Option<u64>,
    /// Its id (1-128 of `A-Za-z0-9._:-`); default `proc-N`.
    pub id: Option<String>,
}

/// Whether a background process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// It runs.
    Running,
    /// It exited or was killed; its output can still be read.
    Exited,
}

/// A background process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ProcessInfo {
    /// Its id (what every other process call takes).
    pub id: String,
    /// Its pid in the guest (also its process group).
    pub pid: u32,
    /// The command: the arguments joined by spaces, or the shell line (cut
    /// at 200 bytes).
    pub command: String,
    /// Running or exited.
    pub state: ProcessState,
    /// When it started, Unix milliseconds (the guest's clock).
    pub started_unix_ms: u64,
    /// When it ended, Unix milliseconds.
    pub ended_unix_ms: Option<u64>,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
    /// True when its timeout killed it.
    pub timed_out: bool,
    /// Bytes it wrote to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr so far.
    pub stderr_bytes: u64,
    /// Its stdin is open for writing.
    pub stdin_open: bool,
    /// Bytes of each output stream kept.
    pub ring_bytes: u64,
}

impl From<wire::ProcessEntry> for ProcessInfo {
    fn from(p: wire::ProcessEntry) -> Self {
        Self {
            id: p.id,
            pid: p.pid,
            command: p.command,
            state: match p.state {
                wire::ProcessRunState::Running => ProcessState::Running,
                wire::ProcessRunState::Exited => ProcessState::Exited,
            },
            started_unix_ms: p.started_unix_ms,
            ended_unix_ms: p.ended_unix_ms,
            exit_code: p.exit_code,
            signal: p.signal,
            timed_out: p.timed_out,
            stdout_bytes: p.stdout_bytes,
            stderr_bytes: p.stderr_bytes,
            stdin_open: p.stdin_open,
            ring_bytes: p.ring_bytes,
        }
    }
}

impl ProcessInfo {
    /// True while it runs.
    pub fn running(&self) -> bool {
        self.state == ProcessState::Running
    }

    /// "running", "exit 0", "killed by signal 15", "timed out".
    pub fn status(&self) -> String {
        match (self.state, self.exit_code, self.signal) {
            (ProcessState::Running, ..) => "running".into(),
            _ if self.timed_out => "timed out (killed)".into(),
            (_, Some(code), _) => format!("exit {code}"),
            (_, _, Some(sig)) => format!("killed by signal {sig}"),
            _ => "exited".into(),
        }
    }
}

/// One stream's part of a [`ProcessOutput`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StreamOutput {
    /// Offset of `bytes[0]` in everything the stream carried.
    pub cursor: u64,
    /// The bytes from `cursor`.
    #[serde(with = "crate::wire_bytes")]
    pub bytes: Vec<u8>,
    /// The cursor to ask for next.
    pub next_cursor: u64,
    /// Bytes between the cursor asked for and `cursor` that were no longer
    /// kept (the ring overflowed).
    pub dropped: u64,
}

impl StreamOutput {
    fn new(chunk: wire::OutputChunk, bytes: Vec<u8>) -> Self {
        Self {
            cursor: chunk.cursor,
            bytes,
            next_cursor: chunk.next_cursor,
            dropped: chunk.dropped,
        }
    }
}

/// Output of a background process from a pair of cursors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProcessOutput {
    /// The process as of this read.
    pub process: ProcessInfo,
    /// Stdout from the stdout cursor.
    pub stdout: StreamOutput,
    /// Stderr from the stderr cursor.
    pub stderr: StreamOutput,
    /// Both streams are closed: no more output will come.
    pub eof: bool,
}

impl ProcessOutput {
    /// True when nothing more will come: it exited and its output is closed.
    pub fn finished(&self) -> bool {
        self.eof && !self.process.running()
    }
}

/// Masks one stream's read in place: unless no more will come (`eof`
/// and all `total` bytes read), a tail that may begin a value is left for
/// the next read (its cursor stays there). True when something was held.
fn mask_output(mask: &SecretMask, stream: &mut StreamOutput, eof: bool, total: u64) -> bool {
    let last = eof && stream.next_cursor >= total;
    let (bytes, used) = mask.mask_read(&stream.bytes, last);
    let held = used < stream.bytes.len();
    stream.bytes = bytes;
    stream.next_cursor = stream.cursor + used as u64;
    held
}

/// A signal by number (`"9"`) or name (`"KILL"`, `"SIGTERM"`); the agent
/// checks it.
fn signal_spec(signal: &str) -> SignalSpec {
    match signal.trim().parse::<i32>() {
        Ok(n) => SignalSpec::Number(n),
        Err(_) => SignalSpec::Name(signal.trim().to_owned()),
    }
}

/// A workspace's background processes (`dev.processes()`), kept by its
/// guest agent between calls. `Copy`; its calls take it by value, as the
/// handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceProcesses<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's background processes.
    pub fn processes(self) -> WorkspaceProcesses<'a> {
        WorkspaceProcesses { ws: self }
    }
}

impl WorkspaceProcesses<'_> {
    /// Starts `req` as a background process in this running workspace
    /// and returns at once; the workspace's env is added under the
    /// request's own, and its timeout (if any) kills it.
    pub async fn process_start(
        self,
        req: ExecRequest,
        options: ProcessOptions,
    ) -> Result<ProcessInfo> {
        if let Some(remote) = self.ws.remote()? {
            let encode = crate::servers::ServerError::Encode;
            let call = crate::servers::WorkspaceCall::ProcessStart {
                request: serde_json::to_value(&req).map_err(encode)?,
                options: serde_json::to_value(&options).map_err(encode)?,
            };
            return Ok(remote.call(call).await?);
        }
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        req.check()?;
        let (ws, meta) = all.awake(name).await?;
        let command = req.describe();
        let secrets = req.secret_names();
        let (values, _) = all.resolve_secrets(&secrets)?;
        let mut wire = req.into_wire(&meta.spec, &values);
        drop(values);
        if options.stdin {
            wire.stdin = StdinMode::Stream;
        }
        wire.output_cap = options.ring_bytes;
        wire.id = options.id;
        let client = crate::guest::connect_awake(all, name, &ws).await?;
        let info: ProcessInfo = client
            .process_start(wire)
            .await
            .map_err(Error::agent("process_start"))?
            .into();
        // Names only: what later reads of its output mask. Without the
        // record its output would be read unmasked: it is killed instead.
        if let Err(e) = crate::secrets::processes::remember(ws.path(), &info.id, &secrets) {
            if let Ok(client) = crate::guest::connect_agent(&ws).await {
                let _ = client
                    .process_signal(&info.id, SignalSpec::Number(libc::SIGKILL))
                    .await;
            }
            return Err(e.into());
        }
        ws.events().append(EventKind::ProcessStarted {
            id: info.id.clone(),
            command,
        })?;
        Ok(info)
    }

    /// Its background processes, oldest first
    /// (finished ones until removed or pushed out by newer ones).
    pub async fn process_list(self) -> Result<Vec<ProcessInfo>> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ProcessList {})
                .await?);
        }
        let list = self
            .ws
            .agent()
            .await?
            .process_list()
            .await
            .map_err(Error::agent("process_list"))?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// Output of process `id` from `cursors` (stdout, stderr byte offsets;
    /// 0 for the start), at most `max_bytes` per stream (default and limit
    /// 4 MiB), waiting up to `wait` (at most 10 min) for some when there
    /// is none yet.
    pub async fn process_output(
        self,
        id: &str,
        cursors: [u64; 2],
        max_bytes: Option<u64>,
        wait: Duration,
    ) -> Result<ProcessOutput> {
        if let Some(remote) = self.ws.remote()? {
            let out: ProcessOutput = remote
                .call(crate::servers::WorkspaceCall::ProcessOutput {
                    id: id.to_owned(),
                    cursors,
                    max_bytes,
                    wait_ms: crate::servers::millis(wait),
                })
                .await?;
            // Held to what was asked, as an agent's answer is; a masked
            // secret may grow to `***` (3 bytes a byte at most).
            let asked = max_bytes.map_or(MAX_PROCESS_READ, |m| m.min(MAX_PROCESS_READ));
            for stream in [&out.stdout, &out.stderr] {
                let (server, got) = (remote.server(), stream.bytes.len());
                crate::servers::check_answer_bytes(server, "process_output", got, asked * 3)?;
            }
            return Ok(out);
        }
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let names = crate::secrets::processes::names(all.dir(name)?.path(), id)?;
        let mask = all.secrets().mask_for(&names);
        let deadline = std::time::Instant::now() + wait.min(AGENT_MAX_WAIT);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let read = self
                .ws
                .agent()
                .await?
                .process_output(id, cursors, max_bytes, left)
                .await
                .map_err(Error::agent("process_output"))?;
            let mut out = ProcessOutput {
                process: read.output.process.into(),
                stdout: StreamOutput::new(read.output.stdout, read.stdout),
                stderr: StreamOutput::new(read.output.stderr, read.stderr),
                eof: read.output.eof,
            };
            if mask.is_empty() {
                return Ok(out);
            }
            let (total_out, total_err) = (out.process.stdout_bytes, out.process.stderr_bytes);
            let held = [
                mask_output(&mask, &mut out.stdout, out.eof, total_out),
                mask_output(&mask, &mut out.stderr, out.eof, total_err),
            ];
            // All that came may be the start of a value: wait for more
            // rather than have the caller ask again at once.
            let nothing = out.stdout.bytes.is_empty() && out.stderr.bytes.is_empty();
            if !(nothing && held.contains(&true)) || left.is_zero() {
                return Ok(out);
            }
            tokio::time::sleep(Duration::from_millis(100).min(left)).await;
        }
    }

    /// Writes `data` to process `id`'s stdin, then closes it when `close`;
    /// returns the bytes written.
    pub async fn process_write_stdin(self, id: &str, data: &[u8], close: bool) -> Result<u64> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ProcessWriteStdin {
                    id: id.to_owned(),
                    data: data.to_vec(),
                    close,
                })
                .await?);
        }
        let mut written = 0;
        let mut parts = data.chunks(wire::MAX_PROCESS_STDIN).peekable();
        if parts.peek().is_none() && !close {
            return Ok(0);
        }
        loop {
            let part = parts.next().unwrap_or_default();
            let last = parts.peek().is_none();
            written += self
                .ws
                .agent()
                .await?
                .process_stdin(id, part, close && last)
                .await
                .map_err(Error::agent("process_stdin"))?;
            if last {
                return Ok(written);
            }
        }
    }

    /// Sends `signal` (a number, or a name such as `TERM` or `SIGKILL`) to
    /// process `id`'s process group.
    pub async fn process_signal(self, id: &str, signal: &str) -> Result<()> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ProcessSignal {
                    id: id.to_owned(),
                    signal: signal.to_owned(),
                })
                .await?);
        }
        self.ws
            .agent()
            .await?
            .process_signal(id, signal_spec(signal))
            .await
            .map_err(Error::agent("process_signal"))
    }

    /// Waits up to `timeout` for process `id` to exit; returns it either
    /// way (check [`ProcessInfo::running`]).
    pub async fn process_wait(self, id: &str, timeout: Duration) -> Result<ProcessInfo> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ProcessWait {
                    id: id.to_owned(),
                    timeout_ms: crate::servers::millis(timeout),
                })
                .await?);
        }
        let mut left = timeout;
        loop {
            let part = left.min(AGENT_MAX_WAIT);
            let info: ProcessInfo = self
                .ws
                .agent()
                .await?
                .process_wait(id, part)
                .await
                .map_err(Error::agent("process_wait"))?
                .into();
            left -= part;
            if !info.running() || left.is_zero() {
                return Ok(info);
            }
        }
    }

    /// Forgets finished process `id` and its output.
    pub async fn process_remove(self, id: &str) -> Result<()> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ProcessRemove { id: id.to_owned() })
                .await?);
        }
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        self.ws
            .agent()
            .await?
            .process_remove(id)
            .await
            .map_err(Error::agent("process_remove"))?;
        crate::secrets::processes::forget(all.dir(name)?.path(), id);
        Ok(())
    }
}

/// What says a starting guest process still works: when it last did
/// (output seen, or more CPU time than at the last look), and the CPU
/// time its process had spent then. A start that keeps working may be
/// waited for long where guest kernel mode is emulated; a stuck one not.
pub(crate) struct CpuProgress {
    pid: u32,
    pub last: std::time::Instant,
    cpu_ticks: Option<u64>,
}

impl CpuProgress {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            last: std::time::Instant::now(),
            cpu_ticks: None,
        }
    }

    /// Reads its process's CPU time from the guest; more than before is
    /// progress. An unreadable figure is none (the quiet period runs on).
    pub async fn sample(&mut self, ws: Workspace<'_>) {
        let stat = format!("/proc/{}/stat", self.pid);
        let Ok(read) = ws.files().read_file(&stat, None, Some(4096)).await else {
            return;
        };
        let Some(ticks) = base::store::process::cpu_ticks(&String::from_utf8_lossy(&read.data))
        else {
            return;
        };
        if self.cpu_ticks.is_some_and(|before| ticks > before) {
            self.last = std::time::Instant::now();
        }
        self.cpu_ticks = Some(ticks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_go_by_number_or_name() {
        assert_eq!(signal_spec("9"), SignalSpec::Number(9));
        assert_eq!(signal_spec(" TERM "), SignalSpec::Name("TERM".into()));
    }

    #[test]
    fn process_reads_are_masked_and_hold_a_possible_start_back() {
        let value = crate::secrets::SecretValue::new("T", b"hunter2".to_vec()).unwrap();
        let mask = SecretMask::new([&value]);
        let mut read = StreamOutput {
            cursor: 10,
            bytes: b"pw=hunter2 next=hun".to_vec(),
            next_cursor: 29,
            dropped: 0,
        };
        assert!(mask_output(&mask, &mut read, false, 29));
        assert_eq!(read.bytes, b"pw=*** next=");
        assert_eq!(read.next_cursor, 26, "the next read starts at `hun`");
        // The rest arrives: read from there.
        let mut rest = StreamOutput {
            cursor: 26,
            bytes: b"hunter2".to_vec(),
            next_cursor: 33,
            dropped: 0,
        };
        assert!(!mask_output(&mask, &mut rest, true, 33));
        assert_eq!(rest.bytes, b"***");
        // Closed, and all of it read: nothing is held.
        let mut end = StreamOutput {
            cursor: 0,
            bytes: b"bye hun".to_vec(),
            next_cursor: 7,
            dropped: 0,
        };
        assert!(!mask_output(&mask, &mut end, true, 7));
        assert_eq!(
            (end.bytes.as_slice(), end.next_cursor),
            (&b"bye hun"[..], 7)
        );
        // Closed, but more past max_bytes: still held.
        let mut capped = StreamOutput {
            cursor: 0,
            bytes: b"bye hun".to_vec(),
            next_cursor: 7,
            dropped: 0,
        };
        assert!(mask_output(&mask, &mut capped, true, 20));
        assert_eq!(capped.next_cursor, 4);
    }

    #[test]
    fn the_status_says_how_it_ended() {
        let mut p = ProcessInfo::from(wire::ProcessEntry {
            id: "p".into(),
            pid: 5,
            command: "sleep 1".into(),
            state: wire::ProcessRunState::Running,
            started_unix_ms: 1,
            ended_unix_ms: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdin_open: false,
            ring_bytes: 1,
        });
        assert_eq!(p.status(), "running");
        p.state = ProcessState::Exited;
        p.exit_code = Some(2);
        assert_eq!(p.status(), "exit 2");
        p.exit_code = None;
        p.signal = Some(15);
        assert_eq!(p.status(), "killed by signal 15");
        p.timed_out = true;
        assert_eq!(p.status(), "timed out (killed)");
    }
}
