//! A command in a workspace that lives on a server: one workspace call
//! that runs it there to its end, its output coming back as it comes (the
//! handle's `exec` sends it).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::exec::{ExecRequest, Exited, EXEC_DEADLINE_GRACE};
use crate::guest::stream::{ExecEvent, ExecInput};
use crate::servers::{CallFrame, RunStreams, WorkspaceCall};
use crate::workspaces::handle::Workspace;

/// How long a command without a timeout may run in a workspace on a
/// server (its call waits for the end).
pub const REMOTE_EXEC_WAIT: Duration = Duration::from_secs(3600);

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
        let (stdin, then_input) = match input {
            ExecInput::None => (None, None),
            ExecInput::Bytes(bytes) => (Some(bytes), None),
            ExecInput::Reader(reader) => (None, Some(reader)),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "a command in a workspace on server {} takes its stdin whole or from a reader; a channel or a terminal is not sent there yet",
                    remote.server()
                )))
            }
        };
        let wait = req
            .timeout
            .map_or(REMOTE_EXEC_WAIT, |t| t.saturating_add(EXEC_DEADLINE_GRACE));
        let stdin_follows = then_input.is_some();
        let call = WorkspaceCall::Exec {
            request: serde_json::to_value(&req).map_err(crate::servers::ServerError::Encode)?,
            stdin,
            stdin_follows,
            wait_ms: crate::servers::millis(wait),
        };
        let mut on_frame = |frame: CallFrame| match frame {
            CallFrame::ExecStarted { exec_id, pid } => {
                on_event(ExecEvent::Started { exec_id, pid })
            }
            CallFrame::Stdout { data } => on_event(ExecEvent::Stdout(data)),
            CallFrame::Stderr { data } => on_event(ExecEvent::Stderr(data)),
            // Not a command's: nothing to hand on.
            CallFrame::StartProgress { .. } => {}
        };
        let streams = RunStreams {
            then_input,
            // Its end tells the server this host went away.
            hold_input: !stdin_follows,
            on_frame: Some(&mut on_frame),
        };
        Ok(remote.call_streaming(call, streams).await?)
    }
}
