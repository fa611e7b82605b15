//! A command in a workspace that lives on a server: one workspace call
//! that runs it there to its end (the handle's `exec` sends it).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::exec::{
    ExecRequest, ExecResult, Exited, EXEC_DEADLINE_GRACE, MAX_COLLECTED_BYTES,
};
use crate::guest::stream::{ExecEvent, ExecInput};
use crate::workspaces::handle::Workspace;

/// How long a command without a timeout may run in a workspace on a
/// server (its call waits for the end).
pub const REMOTE_EXEC_WAIT: Duration = Duration::from_secs(3600);

impl Workspace<'_> {
    /// [`Workspace::exec`] of a workspace on a server: run there to its end,
    /// its output collected there (up to the request's cap) and handed to
    /// `on_event` here as one chunk per stream. Stdin goes as bytes only.
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
        let stdin = match input {
            ExecInput::None => None,
            ExecInput::Bytes(bytes) => Some(bytes),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "a command in a workspace on server {} takes its stdin whole; a stream or a terminal is not sent there yet",
                    remote.server()
                )))
            }
        };
        let cap = req
            .output_cap
            .unwrap_or(MAX_COLLECTED_BYTES)
            .min(MAX_COLLECTED_BYTES);
        let wait = req
            .timeout
            .map_or(REMOTE_EXEC_WAIT, |t| t.saturating_add(EXEC_DEADLINE_GRACE));
        let call = crate::servers::WorkspaceCall::Exec {
            request: serde_json::to_value(&req).map_err(crate::servers::ServerError::Encode)?,
            stdin,
            wait_ms: crate::servers::millis(wait),
        };
        let ran: ExecResult = remote.call(call).await?;
        // Invalid UTF-8 was replaced there: at most three bytes for one.
        for (stream, text) in [("stdout", &ran.stdout), ("stderr", &ran.stderr)] {
            let what = format!("exec {stream}");
            crate::servers::check_answer_bytes(remote.server(), &what, text.len(), cap * 3)?;
        }
        on_event(ExecEvent::Started {
            exec_id: ran.exec_id.clone(),
            pid: 0,
        });
        for (event, text) in [
            (ExecEvent::Stdout as fn(Vec<u8>) -> ExecEvent, ran.stdout),
            (ExecEvent::Stderr, ran.stderr),
        ] {
            if !text.is_empty() {
                on_event(event(text.into_bytes()));
            }
        }
        Ok(Exited {
            exec_id: ran.exec_id,
            code: ran.exit_code,
            signal: ran.signal,
            timed_out: ran.timed_out,
            wall_ms: ran.wall_ms,
            stdout_bytes: ran.stdout_bytes,
            stderr_bytes: ran.stderr_bytes,
            stdout_dropped: ran.stdout_dropped,
            stderr_dropped: ran.stderr_dropped,
        })
    }
}
