//! A workspace's code sessions (`dev.code()`): start, run, restart, stop,
//! list. A session is its kernel process in the guest and the host's
//! record of how to reach it; a run connects anew (another CLI run, a
//! restarted MCP server reach the same kernel) unless this process's last
//! run of the session left its connection (`kept`), and the runs of one
//! session take turns.

use std::future::Future;
use std::time::Duration;

use base::store::file_lock::FileLock;
use base::store::state::State;
use base::store::workspace_dir::WorkspaceDir;

use super::jupyter::READY_TIMEOUT;
use super::launch::{self, FIRST_ANSWER_TIMEOUT};
use super::outputs::CodeRunLimits;
use super::ready;
use super::records::{is_session_id, CodeDir, SessionRecord};
use super::server;
use super::{CodeLanguage, CodeRun, CodeSessionError, CodeSessionInfo, MAX_SESSIONS};
use crate::error::Result;
use crate::workspaces::handle::Workspace;

/// How long a run may take unless the caller says.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest run a caller may ask for.
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a kept connection may take to read up to date before a run
/// (else the run connects anew).
const KEPT_READY: Duration = Duration::from_secs(10);

/// A workspace's code sessions. `Copy`; its calls take it by value, as
/// the handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceCode<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's code sessions.
    pub fn code(self) -> WorkspaceCode<'a> {
        WorkspaceCode { ws: self }
    }
}

/// Interrupts a session's kernel when a run's caller goes away mid-run
/// (its future dropped) or the run failed with its code maybe still
/// running, so the next run does not queue behind it; the run's turn is
/// held until the interrupt is answered (or its grace is over), so the
/// next run's code cannot be the one interrupted.
struct InterruptUnlessDone {
    target: Option<(WorkspaceDir, SessionRecord, FileLock)>,
}

impl Drop for InterruptUnlessDone {
    fn drop(&mut self) {
        let Some((ws_dir, record, turn)) = self.target.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = launch::interrupt(&ws_dir, &record).await {
                    tracing::info!("interrupting an abandoned run of {}: {e}", record.id);
                }
                drop(turn);
            });
        }
    }
}

impl WorkspaceCode<'_> {
    fn name(self) -> String {
        self.ws.name.as_str().to_owned()
    }

    fn local(self) -> Result<()> {
        match self.ws.remote()? {
            Some(_) => Err(CodeSessionError::OnServer.into()),
            None => Ok(()),
        }
    }

    fn record(self, ws_dir: &WorkspaceDir, id: &str) -> Result<SessionRecord> {
        let unknown = || CodeSessionError::UnknownSession {
            workspace: self.name(),
            session: id.chars().take(64).collect(),
        };
        if !is_session_id(id) {
            return Err(unknown().into());
        }
        CodeDir::new(ws_dir.path())
            .load(id)
            .ok_or_else(|| unknown().into())
    }

    /// Why `record`'s kernel is not the running process of its id, if it
    /// is not.
    async fn gone(self, record: &SessionRecord) -> Result<Option<String>> {
        let list = self.ws.processes().process_list().await?;
        Ok(match list.iter().find(|p| p.id == record.process()) {
            Some(p) if p.pid == record.pid && p.started_unix_ms == record.started_unix_ms => {
                (!p.running()).then(|| format!("its kernel {}", p.status()))
            }
            _ => Some("its kernel is gone (the workspace restarted since)".into()),
        })
    }

    /// Starts a session of `language`: its kernel runs and answers when
    /// this returns.
    pub async fn start(self, language: CodeLanguage) -> Result<CodeSessionInfo> {
        self.local()?;
        let (ws_dir, _) = self.ws.all.awake(self.ws.name.as_str()).await?;
        let dir = CodeDir::new(ws_dir.path());
        let _lock = dir.lock().await?;
        // Ended sessions (their kernel gone) are forgotten first.
        let mut live = 0;
        for record in dir.list() {
            if self.gone(&record).await?.is_some() {
                let _ = self.ws.processes().process_remove(record.process()).await;
                dir.remove(&record.id)?;
            } else {
                live += 1;
            }
        }
        if live >= MAX_SESSIONS {
            return Err(CodeSessionError::TooMany {
                workspace: self.name(),
                limit: MAX_SESSIONS,
            }
            .into());
        }
        let id = dir.take_id()?;
        // A kernel made ahead in the image's warm snapshot, when one
        // waits; else one starts now.
        let record = match ready::adopt(self.ws, &ws_dir, &id, language, &dir.list()).await {
            Some(record) => record,
            None => self.start_kernel(&ws_dir, &id, language).await?,
        };
        dir.save(&record)?;
        Ok(info(&record, true))
    }

    /// Runs `code` in session `id`: variables, imports and the working
    /// directory are those earlier runs left. `on_stream` hears stdout
    /// and stderr as they come. A run past `timeout` (at most
    /// [`MAX_RUN_TIMEOUT`]) or whose `cancelled` completes is interrupted
    /// and its result says so; a caller that goes away mid-run leaves the
    /// kernel interrupted.
    pub async fn run(
        self,
        id: &str,
        code: &str,
        timeout: Duration,
        limits: CodeRunLimits,
        cancelled: impl Future<Output = ()>,
        on_stream: impl FnMut(&str, &str),
    ) -> Result<CodeRun> {
        self.local()?;
        tokio::pin!(cancelled);
        let (ws_dir, _) = self.ws.all.awake(self.ws.name.as_str()).await?;
        let record = self.record(&ws_dir, id)?;
        let dir = CodeDir::new(ws_dir.path());
        let kept = super::kept::of_this_process();
        // Cancelled while it waits for its turn or connects: its code is
        // never sent.
        let ready = async {
            let turn = dir.run_lock(&record.id).await?;
            // What a restart or another start made while this run waited.
            let record = self.record(&ws_dir, id)?;
            let (_, meta) = self.ws.all.running(self.ws.name.as_str())?;
            let vmm = meta.runtime.as_ref().map(|r| (r.pid, r.pid_start));
            // This process's last run's connection to the same kernel,
            // read up to date; one that cannot be is closed (no code was
            // sent through it).
            if let Some(mut client) = kept.take(ws_dir.path(), &record, vmm) {
                match client.resume_kept(KEPT_READY).await {
                    Ok(()) => return Ok((turn, record, vmm, client, true)),
                    Err(e) => tracing::debug!("a kept connection to {}: {e}", record.id),
                }
            }
            if let Some(why) = self.gone(&record).await? {
                return Err(self.ended(&record, why));
            }
            let client = launch::connect(&ws_dir, &record, READY_TIMEOUT).await?;
            Ok((turn, record, vmm, client, false))
        };
        let (turn, record, vmm, mut client, reused) = tokio::select! {
            ready = ready => ready?,
            () = &mut cancelled => {
                return Ok(CodeRun {
                    stopped: Some("cancelled".into()),
                    ..CodeRun::default()
                });
            }
        };
        let mut guard = InterruptUnlessDone {
            target: Some((ws_dir.clone(), record.clone(), turn)),
        };
        let ran = client
            .execute(
                code,
                timeout.min(MAX_RUN_TIMEOUT),
                limits,
                cancelled,
                on_stream,
            )
            .await;
        match ran {
            // Ended in order: nothing to interrupt. One that ended by
            // itself leaves its connection to the next run (kept before
            // the turn goes, so the next run finds it); one stopped by a
            // timeout or a cancel does not (its interrupt's answer is
            // still to come).
            Ok(run) => {
                if run.stopped.is_none() {
                    client.compact();
                    kept.keep(ws_dir.path(), record, vmm, client);
                }
                guard.target = None;
                Ok(run)
            }
            // A failure may have left the code running: the guard
            // interrupts it. Through a kept connection, a kernel that
            // ended since says so as a fresh connection would have.
            Err(e) => {
                drop(client);
                if reused {
                    if let Ok(Some(why)) = self.gone(&record).await {
                        return Err(self.ended(&record, why));
                    }
                }
                Err(CodeSessionError::from(e).into())
            }
        }
    }

    fn ended(self, record: &SessionRecord, why: String) -> crate::error::Error {
        CodeSessionError::Ended {
            workspace: self.name(),
            session: record.id.clone(),
            why,
        }
        .into()
    }

    /// Ends session `id`'s kernel and starts a fresh one under the same
    /// id (what it held is gone).
    pub async fn restart(self, id: &str) -> Result<CodeSessionInfo> {
        self.local()?;
        let (ws_dir, _) = self.ws.all.awake(self.ws.name.as_str()).await?;
        let record = self.record(&ws_dir, id)?;
        let dir = CodeDir::new(ws_dir.path());
        let _lock = dir.lock().await?;
        super::kept::of_this_process().forget(ws_dir.path(), &record.id);
        // The kernel first: a run in it ends (its channels close) and
        // gives its turn back.
        self.end_kernel(&record).await?;
        let _turn = dir.run_lock(&record.id).await?;
        match self
            .start_kernel(&ws_dir, &record.id, record.language)
            .await
        {
            Ok(fresh) => {
                dir.save(&fresh)?;
                Ok(info(&fresh, true))
            }
            Err(e) => {
                // Its kernel is gone and none took its place.
                dir.remove(&record.id)?;
                Err(e)
            }
        }
    }

    /// Ends session `id`: its kernel is asked to shut down, then killed
    /// if it has not, and the session is forgotten.
    pub async fn stop(self, id: &str) -> Result<()> {
        self.local()?;
        let (ws_dir, _) = self.ws.all.awake(self.ws.name.as_str()).await?;
        let record = self.record(&ws_dir, id)?;
        let dir = CodeDir::new(ws_dir.path());
        let _lock = dir.lock().await?;
        super::kept::of_this_process().forget(ws_dir.path(), &record.id);
        if self.gone(&record).await?.is_none() {
            // A clean end first (its history and files closed).
            if let Ok(Ok(mut client)) = tokio::time::timeout(
                Duration::from_secs(10),
                launch::connect(&ws_dir, &record, READY_TIMEOUT),
            )
            .await
            {
                let _ = client.shutdown(false).await;
            }
        }
        self.end_kernel(&record).await?;
        dir.remove(&record.id)?;
        Ok(())
    }

    /// Starts a kernel for session `id` as its own process and waits for
    /// its first answer.
    async fn start_kernel(
        self,
        ws_dir: &WorkspaceDir,
        id: &str,
        language: CodeLanguage,
    ) -> Result<SessionRecord> {
        let nonce = base::host::dirfd::random_hex();
        let record = server::start(self.ws, id, &nonce, language).await?;
        if let Err(e) = launch::connect(ws_dir, &record, FIRST_ANSWER_TIMEOUT).await {
            let _ = self.end_kernel(&record).await;
            return Err(e);
        }
        Ok(record)
    }

    /// Kills `record`'s kernel process (if it is still that one) and
    /// removes it from the guest's list.
    async fn end_kernel(self, record: &SessionRecord) -> Result<()> {
        launch::end_process(self.ws, record.process()).await
    }

    /// The workspace's sessions; `running` is looked up only in a running
    /// workspace (a stopped or hibernated one is not woken to say).
    pub async fn list(self) -> Result<Vec<CodeSessionInfo>> {
        self.local()?;
        let meta = self.ws.get_here()?;
        let ws_dir = self.ws.all.dir(self.ws.name.as_str())?;
        let records = CodeDir::new(ws_dir.path()).list();
        let mut out = Vec::with_capacity(records.len());
        for record in &records {
            let running = meta.state == State::Running && self.gone(record).await?.is_none();
            out.push(info(record, running));
        }
        Ok(out)
    }
}

fn info(record: &SessionRecord, running: bool) -> CodeSessionInfo {
    CodeSessionInfo {
        id: record.id.clone(),
        language: record.language,
        created_unix_ms: record.created_unix_ms,
        running,
    }
}
