//! A command in a workspace that lives on a server: one workspace call
//! that runs it there to its end, its output coming back as frames as it
//! comes, its stdin or a terminal's keys sent after the call (the
//! handle's `exec` sends it here).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::request::{ExecRequest, Exited, EXEC_DEADLINE_GRACE};
use crate::guest::stream::{ExecEvent, ExecInput, PtySize, TerminalInput};
use crate::servers::{CallFrame, InputFrame, RunStreams, WorkspaceCall};
use crate::workspaces::handle::Workspace;

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
