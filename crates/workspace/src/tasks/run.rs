//! What a task's supervisor does, start to end: wait for a slot, make and
//! start the workspace (a warm start; the clone comes in at the start),
//! write the description, run the command as `user` in the clone with its
//! output (secrets masked) in the task's log, read its result, bring its
//! commits back to `refs/tasks/<id>`, merge them onto the branch it
//! started from, and remove the workspace. Every step's failure ends the
//! task as failed with the reason; the workspace is removed (or stopped,
//! when kept) whatever happened.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::guest::request::ExecRequest;
use crate::guest::stream::{ExecEvent, ExecInput};
use crate::repos::incoming::RepoLimits;
use crate::repos::GUEST_REPO_DIR;
use crate::tasks::log::CappedLog;
use crate::tasks::merge::{merge_task, MergeResult};
use crate::tasks::service::task_mem;
use crate::tasks::{
    TaskInfo, TaskResult, TaskStatus, GUEST_RESULT_FILE, GUEST_TASK_FILE, MAX_RESULT_BYTES,
    TASK_REF_PREFIX,
};
use crate::workspaces::services::Tasks;
use base::host::settings::now_ms;
use base::store::file_lock::FileLock;
use base::store::repo_checkout::RepoCheckout;
use base::store::spec::{Owner, WorkspaceSpec};
use base::store::volume_mounts::VolumeMount;
use base::volumes::CACHE_MOUNT;

/// How long a start may take (a cold boot when no warm snapshot exists).
const TASK_START_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a queued task looks for a free slot.
const SLOT_POLL: Duration = Duration::from_secs(1);

impl Tasks<'_> {
    /// Drives task `id` to its end (what `microagent task supervise ID`
    /// runs, detached). The record says how it went.
    pub async fn supervise(&self, id: &str) -> Result<TaskInfo> {
        let store = self.store();
        let me = Owner::this_process();
        store.update(id, |t| t.supervisor = me.or(t.supervisor))?;
        let outcome = self.drive(id).await;
        let info = store.get(id)?;
        let keep = info.keep;
        let workspace = info.workspace.clone();
        // The workspace goes whatever happened (stopped, when kept). It
        // stops first either way, so the slot's cache volume is unmounted
        // cleanly: the next task then mounts it without a journal replay.
        if self.all.at(&workspace).get().is_ok() {
            let mut steps = StepLog::new(id);
            let stopped = self
                .all
                .at(&workspace)
                .stop(crate::workspaces::lifecycle::DEFAULT_STOP_TIMEOUT)
                .await
                .map(drop);
            steps.done("workspace stopped");
            let cleanup = if keep {
                stopped
            } else {
                if let Err(e) = stopped {
                    tracing::warn!("task {id}: stopping workspace {workspace}: {e}");
                }
                self.all
                    .at(&workspace)
                    .delete(base::store::spec::DeleteOptions::default().force(true))
                    .map(drop)
            };
            if !keep && cleanup.is_ok() {
                steps.done("workspace removed");
            }
            if let Err(e) = cleanup {
                tracing::warn!("task {id}: removing workspace {workspace}: {e}");
            }
        }
        // Final only now, with the workspace gone: the slot (and its
        // cache volume) is free for the next task only once nothing
        // mounts it.
        Ok(store.update(id, |t| {
            match &outcome {
                Ok(status) => t.status = *status,
                Err(e) => {
                    t.status = TaskStatus::Failed;
                    t.error = Some(e.full_message());
                }
            }
            if !t.status.is_final() {
                t.status = TaskStatus::Failed;
            }
            t.exec_id = None;
            t.timings.finished_ms = Some(now_ms());
        })?)
    }

    /// Runs the task up to its merge; the status it ended with.
    async fn drive(&self, id: &str) -> Result<TaskStatus> {
        let store = self.store();
        let mut info = store.get(id)?;
        while info.slot.is_none() {
            if info.cancelled {
                return Err(Error::InvalidInput("cancelled while queued".into()));
            }
            if self.claim_slot(id, &info.repo)?.is_none() {
                tokio::time::sleep(SLOT_POLL).await;
            }
            info = store.get(id)?;
        }
        let slot = info.slot.unwrap_or_default();
        info = store.update(id, |t| {
            t.status = TaskStatus::Running;
            t.timings.started_ms = Some(now_ms());
        })?;
        let repo = self.all.repos().get(&info.repo)?;
        let command = self.command(&repo)?;
        // The cache of this agent's tasks on this repository in this slot.
        let cache = self.cache(info.agent.as_deref(), &info.repo, slot)?;
        let spec = WorkspaceSpec {
            image: info.image.clone(),
            mem_mib: task_mem(&info),
            owner: Owner::this_process(),
            // The asking agent's, as the task is.
            agent: info.agent.clone(),
            volumes: vec![VolumeMount {
                name: cache,
                path: CACHE_MOUNT.into(),
                read_only: false,
                own_copy: false,
            }],
            repo: Some(RepoCheckout {
                repo: info.repo.clone(),
                branch: Some(info.branch.clone()),
                base: Some(info.base.clone()),
            }),
            ..WorkspaceSpec::default()
        };
        let name = info.workspace.clone();
        let mut steps = StepLog::new(id);
        self.ensure_warm(&spec, &name).await?;
        steps.done("warm snapshot ready");
        self.all
            .blocking({
                let name = name.clone();
                move |ws| ws.create(&name, spec).map(drop)
            })
            .await?;
        steps.done("workspace created");
        self.all.at(&name).start(TASK_START_TIMEOUT, |_| {}).await?;
        steps.done("workspace started, the clone in");
        // A file write, not a guest process: the agent writes it (root's,
        // readable by all); the clone's own step already linked ~/.cache.
        self.all
            .at(&name)
            .files()
            .write_file(
                GUEST_TASK_FILE,
                info.description.as_bytes(),
                crate::guest::files::WriteOptions {
                    append: false,
                    perm: Some(0o644),
                },
            )
            .await?;
        if store.get(id)?.cancelled {
            return Err(Error::InvalidInput(
                "cancelled before its command ran".into(),
            ));
        }
        let exit = self.run_command(&info, &command).await?;
        steps.done("command ended");
        let cancelled = store.get(id)?.cancelled;
        let result = self.read_result(&name, exit).await;
        let task_ref = format!("{TASK_REF_PREFIX}{id}");
        let pull = self.all.at(&name).pull_repo_to(&task_ref).await?;
        steps.done("commits pulled");
        let merge = if pull.commits == 0 {
            MergeResult {
                merged: false,
                method: None,
                commits: 0,
                conflicts: Vec::new(),
                task_ref: task_ref.clone(),
                reason: Some("the task made no commits".into()),
            }
        } else if cancelled {
            MergeResult {
                merged: false,
                method: None,
                commits: pull.commits,
                conflicts: Vec::new(),
                task_ref: task_ref.clone(),
                reason: Some("the task was cancelled; its commits are kept, not merged".into()),
            }
        } else {
            let lock_path = store.root().join(format!("merge-{}.lock", info.repo));
            let scratch = store.dir(id)?.join("rebase");
            let path = repo.path.clone();
            let (branch, base) = (info.branch.clone(), info.base.clone());
            let limits = RepoLimits::load(self.all.state.root()).map_err(Error::InvalidInput)?;
            self.all
                .blocking(move |_| {
                    let _lock = FileLock::exclusive(&lock_path)
                        .map_err(Error::host_io(format!("locking {}", lock_path.display())))?;
                    merge_task(&path, &branch, &base, &task_ref, &scratch, &limits)
                        .map_err(|e| crate::repos::RepoError::from(e).into())
                })
                .await?
        };
        steps.done(if merge.merged {
            "merged"
        } else {
            "merge decided (not merged)"
        });
        let status = if result.success && !cancelled {
            TaskStatus::Completed
        } else {
            TaskStatus::Failed
        };
        store.update(id, |t| {
            t.exit_code = exit;
            if cancelled {
                t.error = Some("cancelled".into());
            }
            t.result = Some(result);
            t.merge_result = Some(merge);
        })?;
        Ok(status)
    }

    /// Cancels task `id`: its command is killed; its supervisor then keeps
    /// what it committed at `refs/tasks/<id>` (no merge) and removes the
    /// workspace. A task that already ended is left as it is.
    pub async fn cancel(&self, id: &str) -> Result<TaskInfo> {
        self.info(id)?;
        let info = self.store().update(id, |t| {
            if !t.status.is_final() {
                t.cancelled = true;
            }
        })?;
        if let Some(exec) = &info.exec_id {
            if let Ok(ws) = self.all.workspace(&info.workspace) {
                let _ = ws.signal_exec(exec, libc::SIGKILL).await;
            }
        }
        self.info(id)
    }

    /// Makes the warm snapshot a workspace of `spec` resumes, when there is
    /// none: a boot with volumes keeps none, and every task has its cache
    /// volume, so without this every task would boot.
    async fn ensure_warm(&self, spec: &WorkspaceSpec, name: &str) -> Result<()> {
        let plain = WorkspaceSpec {
            volumes: Vec::new(),
            repo: None,
            ..spec.clone()
        };
        if self.all.snapshots().has_warm(&plain) {
            return Ok(());
        }
        // One task boots it; those starting beside it wait, then resume it
        // (two cold boots at once cost the host twice, and one is kept).
        let lock_path = self.store().root().join("warm-up.lock");
        let _lock = self
            .all
            .blocking(move |_| {
                FileLock::exclusive(&lock_path)
                    .map_err(Error::host_io(format!("locking {}", lock_path.display())))
            })
            .await?;
        if self.all.snapshots().has_warm(&plain) {
            return Ok(());
        }
        let warmup = format!("{name}-warmup");
        self.all
            .blocking({
                let warmup = warmup.clone();
                move |ws| ws.create(&warmup, plain).map(drop)
            })
            .await?;
        let started = self.all.at(&warmup).start(TASK_START_TIMEOUT, |_| {}).await;
        self.all
            .at(&warmup)
            .delete(base::store::spec::DeleteOptions::default().force(true))?;
        started.map(drop)
    }

    /// Runs the task's command to its end, its output (masked) appended to
    /// the task's log; its exit code (`None` when a signal ended it).
    async fn run_command(&self, info: &TaskInfo, command: &str) -> Result<Option<i32>> {
        let store = self.store();
        let id = info.task_id.clone();
        let log_path = store.log_path(&id)?;
        // What the guest prints is kept under the cap (the oldest part
        // dropped), however much it prints.
        let cap = crate::tasks::TaskConfig::load(self.all.state_dir().root())?.log_cap();
        let mut log = CappedLog::open(&log_path, cap)
            .map_err(Error::host_io(format!("opening {}", log_path.display())))?;
        let mask = self.all.secrets().mask_for(&info.secrets);
        let (mut out, mut err) = (mask.stream(), mask.stream());
        // Every byte comes back (the agent's default sends 1 MiB per
        // stream): the log, not the stream, is what bounds it.
        let mut req = ExecRequest::shell(command)
            .uncapped_output()
            .user("user")
            .cwd(GUEST_REPO_DIR)
            .env("MICROAGENT_TASK_ID", &id)
            .env("HOME", "/home/user");
        for name in &info.secrets {
            req = req.secret(name);
        }
        store.update(&id, |t| t.timings.command_started_ms = Some(now_ms()))?;
        let exited = self
            .all
            .at(&info.workspace)
            .exec(req, ExecInput::None, |event| match event {
                // Recorded at once, so a cancel can signal it.
                ExecEvent::Started { exec_id, .. } => {
                    let _ = store.update(&id, |t| t.exec_id = Some(exec_id));
                }
                ExecEvent::Stdout(b) => log.write_or_warn(&out.push(&b)),
                ExecEvent::Stderr(b) => log.write_or_warn(&err.push(&b)),
            })
            .await;
        log.write_or_warn(&out.finish());
        log.write_or_warn(&err.finish());
        Ok(exited?.code)
    }

    /// What `/workspace/result.json` says, else what the exit code says.
    async fn read_result(&self, name: &str, exit: Option<i32>) -> TaskResult {
        let from_exit = TaskResult {
            success: exit == Some(0),
            summary: None,
            files_changed: Vec::new(),
            error: match exit {
                Some(0) => None,
                Some(code) => Some(format!("the task command exited with {code}")),
                None => Some("a signal ended the task command".into()),
            },
        };
        let Ok(read) = self
            .all
            .at(name)
            .files()
            .read_file(GUEST_RESULT_FILE, None, Some(MAX_RESULT_BYTES))
            .await
        else {
            return from_exit;
        };
        match serde_json::from_slice::<TaskResult>(&read.data) {
            Ok(said) => said,
            Err(e) => TaskResult {
                error: Some(format!("{GUEST_RESULT_FILE} is not a result: {e}")),
                ..from_exit
            },
        }
    }
}

/// Logs how long each step of a task took (`MICROAGENT_LOG=info` shows
/// them in the supervisor's log): where a slow task's time went.
struct StepLog<'a> {
    task: &'a str,
    last: Instant,
}

impl<'a> StepLog<'a> {
    fn new(task: &'a str) -> Self {
        Self {
            task,
            last: Instant::now(),
        }
    }

    fn done(&mut self, step: &str) {
        let ms = self.last.elapsed().as_millis();
        tracing::info!(task = self.task, "{step} in {ms} ms");
        self.last = Instant::now();
    }
}
