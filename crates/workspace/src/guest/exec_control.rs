//! A command's control beyond its run: a signal to it, and a cancel that
//! kills it ([`ExecEnd`]), here or on the workspace's server.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::request::{ExecRequest, Exited};
use crate::guest::stream::{ExecEvent, ExecInput};
use crate::servers::WorkspaceCall;
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
