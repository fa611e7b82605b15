//! A command's control beyond its run here: a signal to it, a cancel that
//! kills it ([`ExecEnd`]), and a command in a workspace that lives on a
//! server, one workspace call that runs it there to its end, its output
//! coming back as it comes (the handle's `exec` sends it).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::exec::{ExecRequest, Exited, EXEC_DEADLINE_GRACE};
use crate::guest::stream::{ExecEvent, ExecInput, PtySize, TerminalInput};
use crate::servers::{CallFrame, InputFrame, RunStreams, WorkspaceCall};
use crate::workspaces::handle::Workspace;

use base::store::events::EventKind;

/// How [`Workspace::exec_cancellable`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEnd {
    /// The command ended by itself (or its own timeout killed it).
    Exited(Exited),
    /// The cancel future completed first, and SIGKILL was sent to the
    /// command's process group.
    Cancelled {
        /// The exec's id, as the workspace's events name it.
        exec_id: String,
        /// Whether the agent confirmed the kill. When false the command may
        /// still run in the guest: the agent could not be reached, or did
        /// not know the exec within about 2 s (it had not started yet, or
        /// had already ended).
        killed: bool,
    },
}

/// How long an interrupted command's kill may take in all (a server's
/// answers included): the user who pressed Ctrl-C waits for it.
const KILL_BUDGET: Duration = Duration::from_secs(10);

/// How long a command without a timeout may run in a workspace on a
/// server (its call waits for the end).
pub const REMOTE_EXEC_WAIT: Duration = Duration::from_secs(3600);
/// How long a terminal session (`shell`, `exec -t`) without a timeout may
/// last in a workspace on a server.
pub const REMOTE_TERMINAL_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

impl Workspace<'_> {
    /// [`Workspace::exec`] of a workspace on a server: one call that runs
    /// it there, its output handed to `on_event` as it comes (frames before
    /// the call's answer). Stdin goes whole, or as a reader that is sent
    /// as it is read; a channel or a terminal is not sent there.
    pub(crate) async fn exec_there<F>(
        self,
        remote: &crate::servers::RemoteWorkspace,
        req: ExecRequest,
        input: ExecInput,
        mut on_event: F,
    ) -> Result<Exited>
    where
        F: FnMut(ExecEvent) + Send,
    {
        let mut terminal_follows = false;
        let (stdin, then_input) = match input {
            ExecInput::None => (None, None),
            ExecInput::Bytes(bytes) => (Some(bytes), None),
            ExecInput::Reader(reader) => (None, Some(stdin_frames(reader))),
            ExecInput::Terminal(keys) => {
                terminal_follows = true;
                (None, Some(terminal_frames(keys)))
            }
            ExecInput::Channel(_) => {
                return Err(Error::InvalidInput(format!(
                    "a command in a workspace on server {} takes its stdin whole, from a reader or from a terminal; a channel is not sent there",
                    remote.server()
                )))
            }
        };
        let untimed = match terminal_follows {
            true => REMOTE_TERMINAL_WAIT,
            false => REMOTE_EXEC_WAIT,
        };
        let wait = req
            .timeout
            .map_or(untimed, |t| t.saturating_add(EXEC_DEADLINE_GRACE));
        let stdin_follows = then_input.is_some() && !terminal_follows;
        let call = WorkspaceCall::Exec {
            request: serde_json::to_value(&req).map_err(crate::servers::ServerError::Encode)?,
            stdin,
            stdin_follows,
            terminal_follows,
            wait_ms: crate::servers::millis(wait),
        };
        let mut on_frame = |frame: CallFrame| {
            match frame {
                CallFrame::ExecStarted { exec_id, pid } => {
                    on_event(ExecEvent::Started { exec_id, pid })
                }
                CallFrame::Stdout { data } => on_event(ExecEvent::Stdout(data)),
                CallFrame::Stderr { data } => on_event(ExecEvent::Stderr(data)),
                // Not a command's.
                CallFrame::StartProgress { .. } | CallFrame::Copy { .. } => return false,
            }
            true
        };
        let streams = RunStreams {
            then_input,
            // Its end tells the server this host went away.
            hold_input: true,
            on_frame: Some(&mut on_frame),
        };
        Ok(remote.call_streaming(call, streams).await?)
    }
}

/// A stdin as frames to send after a call: its bytes, then `end` once the
/// reader ended (not when it failed: the server then hangs the command up
/// instead of ending its input).
fn stdin_frames(
    mut stdin: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
) -> Box<dyn tokio::io::AsyncRead + Send + Unpin> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut writer, reader) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        let mut buf = vec![0u8; crate::servers::MAX_FRAME_DATA];
        loop {
            let frame = match stdin.read(&mut buf).await {
                Ok(0) => InputFrame::End {},
                Ok(n) => InputFrame::Data {
                    data: buf[..n].to_vec(),
                },
                Err(_) => return,
            };
            let end = frame == InputFrame::End {};
            if writer.write_all(&frame.to_line()).await.is_err() || end {
                return;
            }
        }
    });
    Box::new(reader)
}

/// A terminal's keys and sizes as frames to send after a call: a reader
/// that ends when the terminal's senders are gone.
fn terminal_frames(
    mut keys: tokio::sync::mpsc::Receiver<TerminalInput>,
) -> Box<dyn tokio::io::AsyncRead + Send + Unpin> {
    use tokio::io::AsyncWriteExt;
    let (mut writer, reader) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        while let Some(input) = keys.recv().await {
            let frames: Vec<InputFrame> = match input {
                TerminalInput::Data(data) => InputFrame::data(&data).collect(),
                TerminalInput::Resize(PtySize { rows, cols }) => {
                    vec![InputFrame::Resize { rows, cols }]
                }
            };
            for frame in frames {
                if writer.write_all(&frame.to_line()).await.is_err() {
                    return;
                }
            }
        }
    });
    Box::new(reader)
}

impl Workspace<'_> {
    /// Like [`Workspace::exec`], but when `cancel` completes first the
    /// command's process group is killed (SIGKILL): the agent keeps a
    /// process running when its client goes away, so dropping the exec
    /// alone would leave it behind. [`ExecEnd`] says whether the kill was
    /// confirmed; only then is `exec_finished` (signal 9) logged.
    pub async fn exec_cancellable<F, C>(
        self,
        mut req: ExecRequest,
        input: ExecInput,
        on_event: F,
        cancel: C,
    ) -> Result<ExecEnd>
    where
        F: FnMut(ExecEvent) + Send,
        C: std::future::Future<Output = ()>,
    {
        let (all, name) = (self.all, self.name.as_str());
        let id = req
            .id
            .get_or_insert_with(|| format!("host-{}", base::host::settings::unique_id()))
            .clone();
        let exec = self.exec(req, input, on_event);
        tokio::pin!(exec);
        tokio::select! {
            done = &mut exec => done.map(ExecEnd::Exited),
            () = cancel => {
                let killed = self.kill_exec(&id).await;
                if killed {
                    if let Ok(ws) = all.dir(name) {
                        let _ = ws.events().append(EventKind::ExecFinished {
                            exec_id: id.clone(),
                            code: None,
                            signal: Some(libc::SIGKILL),
                        });
                    }
                }
                Ok(ExecEnd::Cancelled { exec_id: id, killed })
            }
        }
    }

    /// Sends a signal to a running exec's process group.
    pub async fn signal_exec(self, exec_id: &str, signal: i32) -> Result<()> {
        if let Some(remote) = self.remote()? {
            let exec_id = exec_id.to_owned();
            let call = WorkspaceCall::SignalExec { exec_id, signal };
            let _: serde_json::Value = remote.call(call).await?;
            return Ok(());
        }
        self.agent()
            .await?
            .signal(exec_id, signal)
            .await
            .map_err(Error::agent("signal"))
    }
}

impl Workspace<'_> {
    /// Sends SIGKILL to exec `id`'s process group; true when the agent
    /// confirmed it. An exec the agent does not know yet may be starting:
    /// it is retried for about 2 s, and the whole kill (a server's
    /// included) takes at most [`KILL_BUDGET`].
    async fn kill_exec(self, id: &str) -> bool {
        let tries = async {
            for _ in 0..20 {
                match self.signal_exec(id, libc::SIGKILL).await {
                    Ok(()) => return true,
                    Err(e) if e.code() == base::code::ErrorCode::NotFound => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(_) => return false,
                }
            }
            false
        };
        tokio::time::timeout(KILL_BUDGET, tries)
            .await
            .unwrap_or(false)
    }
}
