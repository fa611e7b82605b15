//! Tasks as front ends use them, the service `ws.tasks()`: `run` checks the
//! request, takes a slot (or queues), writes the record and starts the
//! task's supervisor, a detached process that outlives the caller
//! ([`super::run`] is what it does, `supervise`, and `cancel`);
//! the rest read and change records: info (a task whose supervisor is
//! gone is marked failed), list, logs, the next finished task not yet
//! reported, cancel, cleanup, slots.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::repos::git;
use crate::tasks::log::{read_log, LogRange};
use crate::tasks::slots::{self, ActiveSlot, Slots};
use crate::tasks::{
    new_task_id, workspace_of, TaskConfig, TaskError, TaskInfo, TaskLogs, TaskRequest, TaskStatus,
    TaskStore, TaskTimings, MAX_DESCRIPTION, SUPERVISE_SUBCOMMAND,
};
use crate::workspaces::services::Tasks;
use base::host::settings::now_ms;
use base::store::repo_checkout::RepoCheckout;
use base::store::spec::defaults;

/// Memory of a task's workspace unless asked otherwise, MiB: coding
/// agents are node or python programs.
pub const TASK_MEM_MIB: u64 = 1024;
/// The image of a task's workspace unless asked otherwise.
pub const TASK_IMAGE: &str = crate::images::build::debian::IMAGE;
/// Longest `wait_next_event` wait.
pub const MAX_EVENT_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Tasks<'_> {
    /// The task records of this state directory, unchecked for the view.
    pub(crate) fn store(&self) -> TaskStore {
        TaskStore::new(&self.all.state)
    }

    fn config(&self) -> Result<TaskConfig> {
        Ok(TaskConfig::load(self.all.state.root())?)
    }

    /// How many tasks may run at once here.
    fn max_slots(&self, config: &TaskConfig) -> u32 {
        if let Some(n) = config.max_slots {
            return n.clamp(1, slots::MAX_SLOTS);
        }
        let mem = crate::host::budget::HostBudget::load(self.all.state.root())
            .ok()
            .and_then(|b| b.max_guest_mem_mib)
            .unwrap_or_else(host_mem_mib);
        slots::default_max_slots(mem, config.task_mem_mib())
    }

    /// The slots, the tasks holding them, and the task caches this view
    /// may use.
    pub fn slots(&self) -> Result<Slots> {
        let max = self.max_slots(&self.config()?);
        let active: Vec<ActiveSlot> = self
            .all_tasks()?
            .into_iter()
            .filter(|t| !t.status.is_final())
            .filter_map(|t| {
                t.slot.map(|slot| ActiveSlot {
                    slot,
                    task_id: t.task_id,
                    repo: t.repo,
                })
            })
            .collect();
        let available = (0..max)
            .filter(|s| active.iter().all(|a| a.slot != *s))
            .collect();
        Ok(Slots {
            max_slots: max,
            active,
            available,
            caches: self.caches()?,
        })
    }

    /// Takes a free slot for `repo` under the tasks lock, writing it into
    /// task `id`'s record; `None` when every slot is taken.
    pub(crate) fn claim_slot(&self, id: &str, repo: &str) -> Result<Option<u32>> {
        let _lock = self.store().lock_all()?;
        let s = self.slots()?;
        let taken: Vec<u32> = s.active.iter().map(|a| a.slot).collect();
        let Some(slot) = slots::choose_slot(repo, s.max_slots, &taken) else {
            return Ok(None);
        };
        self.store().update(id, |t| t.slot = Some(slot))?;
        Ok(Some(slot))
    }

    /// The command a task on `repo` runs.
    pub(crate) fn command(&self, repo: &crate::repos::RepoInfo) -> Result<String> {
        if let Some(cmd) = &repo.task_command {
            return Ok(cmd.clone());
        }
        self.config()?.command.ok_or_else(|| {
            TaskError::Invalid(format!(
                "repository `{}` has no task command: allow it with a task command, or set `task.command` in config.json",
                repo.alias
            ))
            .into()
        })
    }

    /// Starts a task: checks it (the repository allowlisted, its branch,
    /// the image has git, a task command, the secrets), takes a slot (or
    /// queues it, or refuses with CONFLICT when asked not to queue), writes
    /// its record and starts its supervisor. Returns at once.
    pub fn run(&self, req: &TaskRequest) -> Result<TaskInfo> {
        let description = req.description.trim();
        if description.is_empty() || req.description.len() > MAX_DESCRIPTION {
            return Err(TaskError::Invalid(format!(
                "a task description is 1 to {MAX_DESCRIPTION} bytes of text"
            ))
            .into());
        }
        let (mem_mib, said_by) = match req.mem_mib {
            Some(m) => (m, "mem_mib"),
            None => (self.config()?.task_mem_mib(), "config.json's task.mem_mib"),
        };
        // Checked now, as its workspace's create will be: nothing is
        // written or started for a size that cannot be made. A task's
        // floor is a workspace's default size (what its image needs to
        // clone, build and commit), not the smallest guest.
        let limits = &self.all.limits;
        let least = limits.min_mem_mib.max(defaults::MEM_MIB);
        if !(least..=limits.max_mem_mib).contains(&mem_mib) {
            return Err(TaskError::Invalid(format!(
                "{said_by} is {mem_mib}; use {least} to {}",
                limits.max_mem_mib
            ))
            .into());
        }
        let image_name = req.image.clone().unwrap_or_else(|| TASK_IMAGE.into());
        let image = self.all.images.get(&image_name)?;
        let (repo, checkout) = crate::repos::checkout::resolve(
            &self.all.repos(),
            &RepoCheckout::new(req.repo.clone(), req.branch.clone()),
            &image,
        )?;
        self.command(&repo)?;
        self.all.secrets().require(&req.secrets)?;
        let id = new_task_id();
        let info = TaskInfo {
            task_id: id.clone(),
            status: TaskStatus::Pending,
            repo: repo.alias.clone(),
            branch: checkout.branch.clone().unwrap_or_default(),
            base: checkout.base.clone().unwrap_or_default(),
            image: image_name,
            description: req.description.clone(),
            secrets: req.secrets.clone(),
            workspace: workspace_of(&id),
            keep: req.keep,
            slot: None,
            mem_mib: Some(mem_mib),
            exit_code: None,
            result: None,
            merge_result: None,
            error: None,
            timings: TaskTimings {
                created_ms: now_ms(),
                ..TaskTimings::default()
            },
            supervisor: None,
            exec_id: None,
            cancelled: false,
            reported: false,
            namespace: match self.all.namespace() {
                base::store::name::ALL_NAMESPACES => base::store::name::DEFAULT_NAMESPACE.into(),
                namespace => namespace.to_owned(),
            },
            agent: self.all.creating_agent(),
        };
        let store = self.store();
        store.insert(&info)?;
        let slot = match self.claim_slot(&id, &repo.alias) {
            Ok(slot) => slot,
            Err(e) => {
                let _ = store.remove(&id);
                return Err(e);
            }
        };
        if slot.is_none() && req.no_queue {
            let max = self.slots().map(|s| s.max_slots).unwrap_or(0);
            let _ = store.remove(&id);
            return Err(TaskError::NoSlot(max).into());
        }
        if let Err(e) = self.spawn_supervisor(&id) {
            let _ = store.remove(&id);
            return Err(e);
        }
        Ok(store.get(&id)?)
    }

    /// Starts task `id`'s supervisor, detached (its own session, stdin and
    /// stdout on /dev/null, stderr to its log), and records it.
    fn spawn_supervisor(&self, id: &str) -> Result<()> {
        let store = self.store();
        let args: Vec<String> = SUPERVISE_SUBCOMMAND
            .iter()
            .map(|a| a.to_string())
            .chain([id.to_owned()])
            .collect();
        let supervisor = self.all.spawn_detached(&args, &store.supervisor_log(id)?)?;
        store.update(id, |t| t.supervisor = t.supervisor.or(supervisor))?;
        Ok(())
    }

    /// Task `id`; one whose supervisor is gone before its end is marked
    /// failed first.
    /// FORBIDDEN when another agent's session asked for it.
    pub fn info(&self, id: &str) -> Result<TaskInfo> {
        let info = self.store().get(id)?;
        self.all
            .check_owner("task", id, info.agent.as_deref(), &[])?;
        Ok(self.reap_orphan(info))
    }

    fn reap_orphan(&self, info: TaskInfo) -> TaskInfo {
        let Some(owner) = info.supervisor else {
            return info;
        };
        if info.status.is_final() || base::store::process::is_alive(owner.pid, owner.start_ticks) {
            return info;
        }
        let gone = format!(
            "its supervisor (pid {}) ended before the task did; see {}",
            owner.pid,
            self.store()
                .supervisor_log(&info.task_id)
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        self.store()
            .update(&info.task_id, |t| {
                if !t.status.is_final() {
                    t.status = TaskStatus::Failed;
                    t.error = Some(gone);
                    t.timings.finished_ms = Some(now_ms());
                }
            })
            .unwrap_or(info)
    }

    /// Every task of this view's namespace (`*`: all) this view may see,
    /// or with `all_agents` every agent's, oldest first.
    pub fn list(&self, all_agents: bool) -> Result<Vec<TaskInfo>> {
        let mut tasks = self.all_tasks()?;
        tasks.retain(|t| {
            self.all
                .lists(&t.namespace, t.agent.as_deref(), &[], all_agents)
        });
        Ok(tasks)
    }

    /// Every task, oldest first.
    fn all_tasks(&self) -> Result<Vec<TaskInfo>> {
        Ok(self
            .store()
            .list()?
            .into_iter()
            .map(|t| self.reap_orphan(t))
            .collect())
    }

    /// A range of task `id`'s command log (secrets masked as they were
    /// written), reading at most the range's limit
    /// ([`crate::tasks::log::MAX_LOG_READ`] at most) from the file.
    pub fn logs(&self, id: &str, range: LogRange) -> Result<TaskLogs> {
        let store = self.store();
        self.info(id)?;
        let path = store.log_path(id)?;
        let chunk = read_log(&path, range).map_err(crate::error::Error::host_io(format!(
            "reading {}",
            path.display()
        )))?;
        Ok(TaskLogs {
            task_id: id.to_owned(),
            path,
            text: String::from_utf8_lossy(&chunk.data).into_owned(),
            offset: chunk.offset,
            next_offset: chunk.next_offset,
            size: chunk.size,
            dropped_bytes: chunk.dropped_bytes,
            max_log_bytes: self.config()?.log_cap(),
            supervisor_log: store.supervisor_log(id)?,
        })
    }

    /// The next task that ended and has not been reported yet (oldest end
    /// first), marked reported; `None` when none ends within `timeout`.
    /// Reports survive restarts: they are in the records.
    pub async fn wait_next_event(&self, timeout: Duration) -> Result<Option<TaskInfo>> {
        let deadline = Instant::now() + timeout.min(MAX_EVENT_WAIT);
        loop {
            let mut ended: Vec<TaskInfo> = self
                .list(false)?
                .into_iter()
                .filter(|t| t.status.is_final() && !t.reported)
                .collect();
            ended.sort_by_key(|t| t.timings.finished_ms);
            for t in ended {
                let mut claimed = false;
                let info = self.store().update(&t.task_id, |r| {
                    claimed = !r.reported;
                    r.reported = true;
                })?;
                if claimed {
                    return Ok(Some(info));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits (at most `timeout`) for task `id` to end; returns it as it is
    /// then.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<TaskInfo> {
        let deadline = Instant::now() + timeout.min(MAX_EVENT_WAIT);
        loop {
            let info = self.info(id)?;
            if info.status.is_final() || Instant::now() >= deadline {
                return Ok(info);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Removes ended task `id`'s record and logs, its kept workspace, and
    /// with `delete_ref` its `refs/tasks/<id>`. A task not yet ended is
    /// CONFLICT (cancel it first). `preview` checks the same and removes
    /// nothing.
    pub fn cleanup(&self, id: &str, delete_ref: bool, preview: bool) -> Result<TaskInfo> {
        let info = self.info(id)?;
        if !info.status.is_final() {
            return Err(TaskError::Running(id.to_owned()).into());
        }
        if preview {
            return Ok(info);
        }
        if self.all.at(&info.workspace).get().is_ok() {
            self.all
                .at(&info.workspace)
                .delete(base::store::spec::DeleteOptions::default().force(true))?;
        }
        if delete_ref {
            if let Ok(repo) = self.all.repos().get(&info.repo) {
                let task_ref = format!("{}{id}", crate::tasks::TASK_REF_PREFIX);
                if git::commit_of(&repo.path, &task_ref).is_ok() {
                    git::run(&repo.path, ["update-ref", "-d", &task_ref])
                        .map_err(crate::repos::RepoError::from)?;
                }
            }
        }
        self.store().remove(id)?;
        Ok(info)
    }
}

/// The host's memory, MiB (from /proc/meminfo; 4 GiB when unreadable).
fn host_mem_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(4096, |kb| kb / 1024)
}

/// Memory a task's workspace gets unless its record says (the floor for
/// records made before `run` checked it).
pub(crate) fn task_mem(info: &TaskInfo) -> u64 {
    info.mem_mib.unwrap_or(TASK_MEM_MIB).max(defaults::MEM_MIB)
}
